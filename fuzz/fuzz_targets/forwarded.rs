//! Fuzzes the `Forwarded` (RFC 7239) parser and the trusted-proxy walk over it.
#![no_main]

use std::net::IpAddr;

use libfuzzer_sys::fuzz_target;
use tollgate::key::forwarded::{forwarded_hops, parse_forwarded_element, resolve_client, Hop};

fuzz_target!(|data: &[u8]| {
    // Each line is one header instance.
    let values: Vec<&[u8]> = data.split(|&b| b == b'\n').collect();
    let _ = parse_forwarded_element(data);
    let peer = IpAddr::from([10, 0, 0, 1]);
    let trusted = |ip: IpAddr| match ip {
        IpAddr::V4(v4) => v4.octets()[0] == 10,
        IpAddr::V6(v6) => v6.segments()[0] & 0xff00 == 0xfd00,
    };
    let client = resolve_client(peer, forwarded_hops(values.iter().copied()), 64, trusted);
    // The client is the peer or an address the header lists; never anything else.
    assert!(
        client == peer
            || forwarded_hops(values.iter().copied()).any(|hop| hop == Hop::Addr(client))
    );
});
