//! Fuzzes the `X-Forwarded-For` parser and the trusted-proxy walk over it.
#![no_main]

use std::net::IpAddr;

use libfuzzer_sys::fuzz_target;
use tollgate::key::forwarded::{parse_node, resolve_client, xff_hops, Hop};

fuzz_target!(|data: &[u8]| {
    // Each line is one header instance.
    let values: Vec<&[u8]> = data.split(|&b| b == b'\n').collect();
    if let Hop::Addr(ip) = parse_node(data) {
        // Whatever parses prints back to an address that parses to itself.
        assert_eq!(parse_node(ip.to_string().as_bytes()), Hop::Addr(ip));
    }
    let peer = IpAddr::from([10, 0, 0, 1]);
    let trusted = |ip: IpAddr| match ip {
        IpAddr::V4(v4) => v4.octets()[0] == 10,
        IpAddr::V6(v6) => v6.segments()[0] & 0xff00 == 0xfd00,
    };
    let client = resolve_client(peer, xff_hops(values.iter().copied()), 64, trusted);
    assert!(client == peer || xff_hops(values.iter().copied()).any(|hop| hop == Hop::Addr(client)));
});
