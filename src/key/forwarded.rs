//! Parsers for forwarding headers: `Forwarded` (RFC 7239), `X-Forwarded-For` and
//! single-address headers such as `X-Real-IP`, and the walk that picks the client out of them.
//!
//! These are the building blocks of [`ClientIp`](super::ClientIp); they are public so that
//! fuzz targets and custom extractors can call them. They never allocate and never panic,
//! whatever the bytes.
//!
//! `X-Forwarded-For` is split on every `,`. `Forwarded` is split from right to left on each
//! `,` (between elements) and `;` (between parameters) outside a quoted string: a trusted
//! proxy may quote client text in another parameter (`host="a,for=6.6.6.6"`), which must not
//! read as a hop. The quotes are followed from the right, where the trusted proxies' own
//! elements are, so a quote the client left unbalanced on the left can swallow only the
//! client's own entries (which then read as [`Hop::Invalid`]), never a proxy's.
//!
//! # Examples
//!
//! ```
//! use std::net::IpAddr;
//! use tollgate::key::forwarded::{forwarded_hops, parse_node, resolve_client, xff_hops, Hop};
//!
//! assert_eq!(parse_node(b"[2001:db8::1]:443"), Hop::Addr("2001:db8::1".parse().unwrap()));
//! assert_eq!(parse_node(b"unknown"), Hop::Unknown);
//!
//! // Two trusted hops (10.0.0.0/8): the third address from the right is the client.
//! let trusted = |ip: IpAddr| matches!(ip, IpAddr::V4(v4) if v4.octets()[0] == 10);
//! let peer: IpAddr = "10.0.0.2".parse().unwrap();
//! let values = [&b"1.2.3.4, 203.0.113.9, 10.0.0.1"[..]];
//! let client = resolve_client(peer, xff_hops(values.into_iter()), 16, trusted);
//! assert_eq!(client, "203.0.113.9".parse::<IpAddr>().unwrap());
//!
//! let values = [&b"for=\"[2001:db8::7]:80\";proto=https"[..]];
//! let client = resolve_client(peer, forwarded_hops(values.into_iter()), 16, trusted);
//! assert_eq!(client, "2001:db8::7".parse::<IpAddr>().unwrap());
//! ```

use std::net::{IpAddr, Ipv4Addr};

/// Node identifiers longer than this (after trimming) are [`Hop::Invalid`]; the longest real
/// one, a bracketed IPv6 address with a port, is 53 bytes.
pub const MAX_NODE_LEN: usize = 64;

/// One hop of a forwarding chain, as parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Hop {
    /// An address; IPv4-mapped IPv6 addresses are turned into IPv4, ports are dropped.
    Addr(IpAddr),
    /// `unknown`: the proxy did not know the address.
    Unknown,
    /// An obfuscated identifier such as `_hidden` (RFC 7239 section 6.3).
    Obfuscated,
    /// Anything else: empty, garbage, a bad port, a zone id, non-UTF-8 bytes, too long, a
    /// `Forwarded` element without exactly one `for`.
    Invalid,
}

/// Parses one node identifier: an `X-Forwarded-For` entry, the unquoted value of a
/// `Forwarded` `for=` parameter, or a single-address header value.
///
/// Accepted: `1.2.3.4`, `1.2.3.4:8080`, `2001:db8::1`, `[2001:db8::1]`,
/// `[2001:db8::1]:8080`, obfuscated ports (`1.2.3.4:_abc`), surrounding spaces and tabs.
/// A bare IPv6 address followed by a port cannot be told from an address: `2001:db8::1:80`
/// is read as the address it spells (RFC 7239 brackets an IPv6 node with a port, and
/// `X-Forwarded-For` carries none); one that spells no address (`2001:db8:0:0:0:0:0:1:80`)
/// is [`Hop::Invalid`].
///
/// ```
/// use tollgate::key::forwarded::{parse_node, Hop};
///
/// assert_eq!(parse_node(b" 192.0.2.1:4711 "), Hop::Addr("192.0.2.1".parse().unwrap()));
/// assert_eq!(parse_node(b"[::ffff:192.0.2.1]"), Hop::Addr("192.0.2.1".parse().unwrap()));
/// assert_eq!(parse_node(b"_proxy1"), Hop::Obfuscated);
/// assert_eq!(parse_node(b"1.2.3.4:99999999"), Hop::Invalid);
/// assert_eq!(parse_node(b"2001:db8::1:80"), Hop::Addr("2001:db8::1:80".parse().unwrap()));
/// assert_eq!(parse_node(b"2001:db8:0:0:0:0:0:1:80"), Hop::Invalid);
/// assert_eq!(parse_node(b"\xff"), Hop::Invalid);
/// ```
pub fn parse_node(raw: &[u8]) -> Hop {
    let node = trim_ows(raw);
    if node.is_empty() {
        return Hop::Invalid;
    }
    if node.eq_ignore_ascii_case(b"unknown") {
        return Hop::Unknown;
    }
    if node[0] == b'_' {
        return if is_obfuscated(node) {
            Hop::Obfuscated
        } else {
            Hop::Invalid
        };
    }
    if node.len() > MAX_NODE_LEN {
        return Hop::Invalid;
    }
    let Ok(node) = std::str::from_utf8(node) else {
        return Hop::Invalid;
    };
    let addr = if let Some(rest) = node.strip_prefix('[') {
        let Some((inside, after)) = rest.split_once(']') else {
            return Hop::Invalid;
        };
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(is_port)) {
            return Hop::Invalid;
        }
        match inside.parse::<std::net::Ipv6Addr>() {
            Ok(v6) => IpAddr::V6(v6),
            Err(_) => return Hop::Invalid,
        }
    } else if let Ok(ip) = node.parse::<IpAddr>() {
        ip
    } else {
        match node.split_once(':') {
            Some((host, port)) if is_port(port) => match host.parse::<Ipv4Addr>() {
                Ok(v4) => IpAddr::V4(v4),
                Err(_) => return Hop::Invalid,
            },
            _ => return Hop::Invalid,
        }
    };
    Hop::Addr(super::extractor::canonical(addr))
}

/// Parses one `Forwarded` element (the text between two commas) and returns its `for` node.
///
/// Parameter names are case-insensitive; the value may be a token or a quoted string without
/// escapes (`"[2001:db8::1]:80"`). Other parameters (`by`, `proto`, `host`, extensions) are
/// skipped. An element with no `for`, two of them, or a pair without `=` is
/// [`Hop::Invalid`].
///
/// ```
/// use tollgate::key::forwarded::{parse_forwarded_element, Hop};
///
/// let hop = parse_forwarded_element(b"For=\"[2001:db8:cafe::17]:4711\"; proto=https");
/// assert_eq!(hop, Hop::Addr("2001:db8:cafe::17".parse().unwrap()));
/// assert_eq!(parse_forwarded_element(b"for=unknown"), Hop::Unknown);
/// assert_eq!(parse_forwarded_element(b"proto=https"), Hop::Invalid);
/// assert_eq!(parse_forwarded_element(b"for=1.2.3.4;for=5.6.7.8"), Hop::Invalid);
/// ```
pub fn parse_forwarded_element(element: &[u8]) -> Hop {
    let mut found: Option<&[u8]> = None;
    for pair in SplitUnquoted::new(element, b';') {
        let Some(pair) = pair else {
            return Hop::Invalid;
        };
        let pair = trim_ows(pair);
        if pair.is_empty() {
            continue;
        }
        let Some(eq) = pair.iter().position(|&b| b == b'=') else {
            return Hop::Invalid;
        };
        if !trim_ows(&pair[..eq]).eq_ignore_ascii_case(b"for") {
            continue;
        }
        if found.is_some() {
            return Hop::Invalid;
        }
        found = Some(trim_ows(&pair[eq + 1..]));
    }
    let Some(value) = found else {
        return Hop::Invalid;
    };
    match value {
        [b'"', inner @ .., b'"'] if !inner.iter().any(|&b| b == b'"' || b == b'\\') => {
            parse_node(inner)
        }
        [b'"', ..] | [.., b'"'] => Hop::Invalid,
        _ => parse_node(value),
    }
}

/// The hops of `X-Forwarded-For` header values, right to left: the last instance first, and
/// in each instance the last entry first (several instances are one comma list, in order).
///
/// ```
/// use tollgate::key::forwarded::{xff_hops, Hop};
///
/// let values = [&b"1.1.1.1, 2.2.2.2"[..], &b"3.3.3.3"[..]];
/// let hops: Vec<Hop> = xff_hops(values.into_iter()).collect();
/// assert_eq!(hops[0], Hop::Addr("3.3.3.3".parse().unwrap()));
/// assert_eq!(hops[2], Hop::Addr("1.1.1.1".parse().unwrap()));
/// ```
pub fn xff_hops<'a, I>(values: I) -> impl Iterator<Item = Hop> + 'a
where
    I: DoubleEndedIterator<Item = &'a [u8]> + 'a,
{
    hops_rev(values, parse_node)
}

/// The `for` nodes of `Forwarded` header values, right to left, one per element (see
/// [`xff_hops`] for the order and [`parse_forwarded_element`] for each element).
///
/// ```
/// use tollgate::key::forwarded::{forwarded_hops, Hop};
///
/// let values = [&b"for=192.0.2.43, for=\"[2001:db8:cafe::17]\""[..]];
/// let hops: Vec<Hop> = forwarded_hops(values.into_iter()).collect();
/// assert_eq!(hops[0], Hop::Addr("2001:db8:cafe::17".parse().unwrap()));
/// assert_eq!(hops[1], Hop::Addr("192.0.2.43".parse().unwrap()));
/// ```
pub fn forwarded_hops<'a, I>(values: I) -> impl Iterator<Item = Hop> + 'a
where
    I: DoubleEndedIterator<Item = &'a [u8]> + 'a,
{
    forwarded_hops_rev(values)
}

/// The comma-separated entries of `values`, right to left, each parsed with `parse`.
fn hops_rev<'a, I>(values: I, parse: fn(&[u8]) -> Hop) -> impl Iterator<Item = Hop> + 'a
where
    I: DoubleEndedIterator<Item = &'a [u8]> + 'a,
{
    values
        .rev()
        .flat_map(move |value| value.rsplit(|&b| b == b',').map(parse))
}

/// The `Forwarded` elements of `values`, right to left, each parsed with
/// [`parse_forwarded_element`]; commas inside quoted strings do not split.
fn forwarded_hops_rev<'a, I>(values: I) -> impl Iterator<Item = Hop> + 'a
where
    I: DoubleEndedIterator<Item = &'a [u8]> + 'a,
{
    values.rev().flat_map(|value| {
        SplitUnquoted::new(value, b',')
            .map(|element| element.map_or(Hop::Invalid, parse_forwarded_element))
    })
}

/// Splits on `sep` outside quoted strings (RFC 9110 `quoted-string`, with `\` escapes),
/// right to left. A part whose quotes do not balance is `None`: it runs from the unbalanced
/// quote to the start, so it can only be text left of every balanced part.
struct SplitUnquoted<'a> {
    rest: Option<&'a [u8]>,
    sep: u8,
}

impl<'a> SplitUnquoted<'a> {
    fn new(value: &'a [u8], sep: u8) -> Self {
        Self {
            rest: Some(value),
            sep,
        }
    }
}

impl<'a> Iterator for SplitUnquoted<'a> {
    type Item = Option<&'a [u8]>;

    fn next(&mut self) -> Option<Self::Item> {
        let rest = self.rest?;
        let mut quoted = false;
        let mut i = rest.len();
        while i > 0 {
            i -= 1;
            match rest[i] {
                b'"' if !quoted => quoted = true,
                // Read from the right, a quote ends the quoted string unless an odd run of
                // backslashes escapes it.
                b'"' => {
                    let slashes = rest[..i].iter().rev().take_while(|&&b| b == b'\\').count();
                    if slashes % 2 == 0 {
                        quoted = false;
                    }
                }
                b if b == self.sep && !quoted => {
                    self.rest = Some(&rest[..i]);
                    return Some(Some(&rest[i + 1..]));
                }
                _ => {}
            }
        }
        self.rest = None;
        Some((!quoted).then_some(rest))
    }
}

/// Picks the client address out of a forwarding chain.
///
/// The rule, exactly:
///
/// 1. If `peer` (the TCP peer) is not trusted, it is the client; the hops are not read.
/// 2. Otherwise walk `hops` from the right (as [`xff_hops`] and [`forwarded_hops`] yield
///    them), looking at no more than `max_hops` of them. The first address that is not
///    trusted is the client.
/// 3. A hop that is not an address (`unknown`, obfuscated, empty, garbage) ends the walk:
///    the client is the last address seen, which is trusted (the peer or a trusted hop). So is
///    reaching `max_hops`.
/// 4. If every hop is a trusted address, the leftmost is the client.
///
/// Every address to the right of the one returned was written by a trusted proxy, so the
/// result is never an address the client chose, unless the client is itself trusted.
/// Addresses are compared in canonical form (IPv4-mapped IPv6 as IPv4).
///
/// ```
/// use std::net::IpAddr;
/// use tollgate::key::forwarded::{resolve_client, xff_hops};
///
/// let loopback = |ip: IpAddr| ip.is_loopback();
/// let peer: IpAddr = "127.0.0.1".parse().unwrap();
/// let values = [&b"6.6.6.6, garbage, 127.0.0.2"[..]];
/// let client = resolve_client(peer, xff_hops(values.into_iter()), 16, loopback);
/// assert_eq!(client, "127.0.0.2".parse::<IpAddr>().unwrap()); // stopped at the garbage
///
/// let untrusted: IpAddr = "198.51.100.1".parse().unwrap();
/// let client = resolve_client(untrusted, xff_hops([&b"1.2.3.4"[..]].into_iter()), 16, loopback);
/// assert_eq!(client, untrusted); // a stranger's headers are not read
/// ```
pub fn resolve_client(
    peer: IpAddr,
    hops: impl Iterator<Item = Hop>,
    max_hops: usize,
    is_trusted: impl Fn(IpAddr) -> bool,
) -> IpAddr {
    let mut last = super::extractor::canonical(peer);
    if !is_trusted(last) {
        return last;
    }
    for hop in hops.take(max_hops) {
        match hop {
            Hop::Addr(addr) => {
                if !is_trusted(addr) {
                    return addr;
                }
                last = addr;
            }
            Hop::Unknown | Hop::Obfuscated | Hop::Invalid => return last,
        }
    }
    last
}

fn trim_ows(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

fn is_obfuscated(node: &[u8]) -> bool {
    node.len() > 1
        && node
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn is_port(port: &str) -> bool {
    let b = port.as_bytes();
    // 1–5 digits that name a port (at most 65535): `1.2.3.4:99999` is garbage like any other
    // malformed entry, not `1.2.3.4`.
    ((1..=5).contains(&b.len()) && b.iter().all(u8::is_ascii_digit) && port.parse::<u16>().is_ok())
        || (b.first() == Some(&b'_') && is_obfuscated(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn addr(s: &str) -> Hop {
        Hop::Addr(s.parse().unwrap())
    }

    #[test]
    fn nodes_in_every_accepted_shape() {
        assert_eq!(parse_node(b"1.2.3.4"), addr("1.2.3.4"));
        assert_eq!(parse_node(b"\t1.2.3.4 "), addr("1.2.3.4"));
        assert_eq!(parse_node(b"1.2.3.4:80"), addr("1.2.3.4"));
        assert_eq!(parse_node(b"1.2.3.4:_obf"), addr("1.2.3.4"));
        assert_eq!(parse_node(b"2001:db8::1"), addr("2001:db8::1"));
        assert_eq!(parse_node(b"[2001:db8::1]"), addr("2001:db8::1"));
        assert_eq!(parse_node(b"[2001:db8::1]:65535"), addr("2001:db8::1"));
        assert_eq!(parse_node(b"::ffff:10.1.2.3"), addr("10.1.2.3"));
        assert_eq!(parse_node(b"UnKnOwN"), Hop::Unknown);
        assert_eq!(parse_node(b"_a-b.c_d"), Hop::Obfuscated);
    }

    #[test]
    fn malformed_nodes_are_invalid() {
        for bad in [
            &b""[..],
            b"  ",
            b"_",
            b"_a b",
            b"1.2.3",
            b"1.2.3.4.5",
            b"01.2.3.4",
            b"1.2.3.4:",
            b"1.2.3.4:123456",
            b"1.2.3.4:99999",
            b"1.2.3.4:65536",
            b"[2001:db8::1]:65536",
            b"1.2.3.4:8x",
            b"1.2.3.4:80:80",
            b"2001:db8::1:80:",
            b"[2001:db8::1",
            b"[2001:db8::1]x",
            b"[2001:db8::1]:",
            b"[1.2.3.4]",
            b"fe80::1%eth0",
            b"localhost",
            b"\xff\xfe",
            b"1.2.3.4\x00",
            b"\"1.2.3.4\"",
        ] {
            assert_eq!(
                parse_node(bad),
                Hop::Invalid,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = format!("{}1.2.3.4", " ".repeat(10)) + &"0".repeat(MAX_NODE_LEN);
        assert_eq!(parse_node(long.as_bytes()), Hop::Invalid);
    }

    #[test]
    fn forwarded_elements() {
        assert_eq!(
            parse_forwarded_element(b"for=192.0.2.60"),
            addr("192.0.2.60")
        );
        assert_eq!(
            parse_forwarded_element(b"for=192.0.2.60;proto=http;by=203.0.113.43"),
            addr("192.0.2.60")
        );
        assert_eq!(
            parse_forwarded_element(b" by=_x ; FOR = \"[2001:db8:cafe::17]:4711\" "),
            addr("2001:db8:cafe::17")
        );
        assert_eq!(parse_forwarded_element(b"for=[::1]"), addr("::1"));
        assert_eq!(parse_forwarded_element(b"for=\"_gazonk\""), Hop::Obfuscated);
        assert_eq!(parse_forwarded_element(b"for=\"1.2.3.4"), Hop::Invalid);
        assert_eq!(parse_forwarded_element(b"for=1.2.3.4\""), Hop::Invalid);
        assert_eq!(parse_forwarded_element(b"for=\"1.2\\.3.4\""), Hop::Invalid);
        assert_eq!(parse_forwarded_element(b"for=\"\""), Hop::Invalid);
        assert_eq!(parse_forwarded_element(b"for"), Hop::Invalid);
        assert_eq!(parse_forwarded_element(b""), Hop::Invalid);
        assert_eq!(parse_forwarded_element(b";;"), Hop::Invalid);
        assert_eq!(
            parse_forwarded_element(b"for=1.2.3.4;garbage"),
            Hop::Invalid
        );
    }

    /// A trusted proxy may quote client text (the `Host` it was sent) in another parameter:
    /// commas and semicolons in it are not hops. They once were, and a client chose its
    /// address with `Host: a,for=6.6.6.6;x=`.
    #[test]
    fn quoted_client_text_in_a_proxys_element_is_not_a_hop() {
        let trusted = |ip: IpAddr| matches!(ip, IpAddr::V4(v4) if v4.octets()[0] == 127);
        let peer: IpAddr = "127.0.0.1".parse().unwrap();
        let client = |values: &[&[u8]]| {
            resolve_client(peer, forwarded_hops(values.iter().copied()), 8, trusted)
        };
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let written: &[u8] = b"for=203.0.113.9;host=\"a,for=6.6.6.6;x=\";proto=https";
        assert_eq!(client(&[written]), ip("203.0.113.9"));
        assert_eq!(
            parse_forwarded_element(b"for=1.2.3.4;host=\"x;for=5.6.7.8\""),
            addr("1.2.3.4")
        );
        // An escaped quote does not end the quoted string.
        let escaped: &[u8] = b"for=203.0.113.9;host=\"a\\\",for=6.6.6.6\"";
        assert_eq!(client(&[escaped]), ip("203.0.113.9"));
        // A quote the client left open on the left swallows only the client's own text.
        let open: &[u8] = b"for=6.6.6.6;x=\", for=127.0.0.2, for=198.51.100.1";
        assert_eq!(client(&[open]), ip("198.51.100.1"));
        let open: &[u8] = b"for=\"6.6.6.6, for=127.0.0.2";
        assert_eq!(client(&[open]), ip("127.0.0.2"));
        let hops: Vec<Hop> = forwarded_hops([&b"x=\"a, for=1.2.3.4"[..]].into_iter()).collect();
        assert_eq!(hops, [addr("1.2.3.4"), Hop::Invalid]);
    }

    fn resolve_xff(peer: &str, values: &[&[u8]]) -> IpAddr {
        let trusted = |ip: IpAddr| match ip {
            IpAddr::V4(v4) => v4.octets()[0] == 10,
            IpAddr::V6(v6) => v6.segments()[0] == 0xfd00,
        };
        resolve_client(
            peer.parse().unwrap(),
            xff_hops(values.iter().copied()),
            8,
            trusted,
        )
    }

    #[test]
    fn walk_stops_at_first_untrusted_or_bad_hop() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(resolve_xff("1.1.1.1", &[b"10.0.0.1"]), ip("1.1.1.1"));
        assert_eq!(
            resolve_xff("10.0.0.9", &[b"6.6.6.6, 5.5.5.5"]),
            ip("5.5.5.5")
        );
        assert_eq!(
            resolve_xff("10.0.0.9", &[b"6.6.6.6, 5.5.5.5, 10.0.0.8"]),
            ip("5.5.5.5")
        );
        assert_eq!(
            resolve_xff("10.0.0.9", &[b"6.6.6.6,unknown, 10.0.0.8"]),
            ip("10.0.0.8")
        );
        assert_eq!(
            resolve_xff("10.0.0.9", &[b"6.6.6.6,, 10.0.0.8"]),
            ip("10.0.0.8")
        );
        assert_eq!(resolve_xff("10.0.0.9", &[b"6.6.6.6", b""]), ip("10.0.0.9"));
        assert_eq!(
            resolve_xff("10.0.0.9", &[b"10.0.0.1, 10.0.0.2"]),
            ip("10.0.0.1")
        );
        assert_eq!(resolve_xff("10.0.0.9", &[]), ip("10.0.0.9"));
        assert_eq!(
            resolve_xff("fd00::1", &[b"[2001:db8::5]:9"]),
            ip("2001:db8::5")
        );
        // More trusted hops than the cap: stop at the last one looked at.
        let many = ["10.0.0.1"; 20].join(",");
        assert_eq!(
            resolve_xff("10.0.0.9", &[b"6.6.6.6,", many.as_bytes()]),
            ip("10.0.0.1")
        );
        // Instances are one list in order: the last instance is read first.
        assert_eq!(
            resolve_xff("10.0.0.9", &[b"10.0.0.3", b"7.7.7.7"]),
            ip("7.7.7.7")
        );
        assert_eq!(
            resolve_xff("10.0.0.9", &[b"7.7.7.7", b"10.0.0.3"]),
            ip("7.7.7.7")
        );
    }

    proptest! {
        #[test]
        fn parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse_node(&bytes);
            let _ = parse_forwarded_element(&bytes);
            let values: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
            let peer: IpAddr = "10.0.0.1".parse().unwrap();
            let found: Vec<Hop> = xff_hops(values.iter().copied())
                .chain(forwarded_hops(values.iter().copied()))
                .collect();
            for hops in [
                resolve_client(peer, xff_hops(values.iter().copied()), 32, |_| true),
                resolve_client(peer, forwarded_hops(values.iter().copied()), 32, |_| true),
            ] {
                prop_assert!(hops == peer || found.contains(&Hop::Addr(hops)));
            }
        }

        #[test]
        fn printed_addresses_parse_back(
            v4 in any::<std::net::Ipv4Addr>(),
            v6 in any::<std::net::Ipv6Addr>(),
            port in any::<u16>(),
        ) {
            let v6c = IpAddr::V6(v6).to_canonical();
            prop_assert_eq!(parse_node(format!("{v4}").as_bytes()), Hop::Addr(v4.into()));
            prop_assert_eq!(parse_node(format!("{v4}:{port}").as_bytes()), Hop::Addr(v4.into()));
            prop_assert_eq!(parse_node(format!("{v6}").as_bytes()), Hop::Addr(v6c));
            prop_assert_eq!(parse_node(format!("[{v6}]:{port}").as_bytes()), Hop::Addr(v6c));
            prop_assert_eq!(
                parse_forwarded_element(format!("for=\"[{v6}]:{port}\"").as_bytes()),
                Hop::Addr(v6c)
            );
        }
    }
}
