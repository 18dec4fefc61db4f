//! [`ClientIp`]: the client address behind trusted proxies.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use http::HeaderName;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::extractor::{checked_prefix, ip_key};
use super::forwarded::{forwarded_hops, parse_node, resolve_client, xff_hops, Hop};
use super::{Key, KeyExtractor, RequestView};
use crate::ConfigError;

/// The networks whose forwarding headers are believed. Empty unless told otherwise.
///
/// Parse them from configuration with [`TrustedProxies::parse`] (`"10.0.0.0/8"`,
/// `"2001:db8::/32"`, or a single address such as `"10.0.0.7"`), or start from a preset.
/// Addresses are compared in canonical form: an IPv4-mapped IPv6 peer (`::ffff:10.0.0.7`,
/// as seen by a server bound to `[::]`) matches `10.0.0.0/8`.
///
/// ```
/// use tollgate::key::TrustedProxies;
///
/// let trusted = TrustedProxies::parse(["10.0.0.0/8", "2001:db8::/32", "192.0.2.7"])?;
/// assert!(trusted.contains("10.1.2.3".parse().unwrap()));
/// assert!(trusted.contains("::ffff:10.1.2.3".parse().unwrap()));
/// assert!(!trusted.contains("192.0.2.8".parse().unwrap()));
///
/// let err = TrustedProxies::parse(["10.0.0.0/33"]).unwrap_err();
/// assert_eq!(err.field(), "trusted_proxies[0]");
///
/// let local = TrustedProxies::loopback().and(TrustedProxies::private_networks());
/// assert!(local.contains("::1".parse().unwrap()));
/// assert!(local.contains("172.20.0.1".parse().unwrap()));
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies {
    nets: Vec<IpNet>,
    /// `nets` merged, for a binary search per hop: a forwarding chain asks up to
    /// `max_hops + 1` times a request, and a CDN's published ranges run to hundreds.
    set: super::networks::NetworkSet,
}

impl PartialEq for TrustedProxies {
    fn eq(&self, other: &Self) -> bool {
        self.nets == other.nets
    }
}

impl Eq for TrustedProxies {}

const LOOPBACK: [IpNet; 2] = [
    IpNet::V4(Ipv4Net::new_assert(Ipv4Addr::new(127, 0, 0, 0), 8)),
    IpNet::V6(Ipv6Net::new_assert(Ipv6Addr::LOCALHOST, 128)),
];

const PRIVATE: [IpNet; 4] = [
    IpNet::V4(Ipv4Net::new_assert(Ipv4Addr::new(10, 0, 0, 0), 8)),
    IpNet::V4(Ipv4Net::new_assert(Ipv4Addr::new(172, 16, 0, 0), 12)),
    IpNet::V4(Ipv4Net::new_assert(Ipv4Addr::new(192, 168, 0, 0), 16)),
    IpNet::V6(Ipv6Net::new_assert(
        Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0),
        7,
    )),
];

impl TrustedProxies {
    /// Trusts nobody: forwarding headers are never read.
    pub fn none() -> Self {
        Self::default()
    }

    /// Parses CIDRs (`10.0.0.0/8`) and single addresses (`10.0.0.7`, trusted alone).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `trusted_proxies[i]` naming the first entry that is neither.
    pub fn parse<I>(cidrs: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let mut nets = Vec::new();
        for (i, cidr) in cidrs.into_iter().enumerate() {
            let text = cidr.as_ref().trim();
            let net = match text.parse::<IpNet>() {
                Ok(net) => net,
                Err(_) => match text.parse::<IpAddr>() {
                    Ok(ip) => IpNet::from(ip),
                    Err(_) => {
                        return Err(ConfigError::new(
                            format!("trusted_proxies[{i}]"),
                            format_args!("{:?}", cidr.as_ref()),
                            "not an IP address or CIDR (like 10.0.0.0/8 or 2001:db8::/32)",
                        ))
                    }
                },
            };
            nets.push(canonical_net(net));
        }
        Ok(Self::of(nets))
    }

    fn of(nets: Vec<IpNet>) -> Self {
        let set = super::networks::NetworkSet::new(&nets);
        Self { nets, set }
    }

    /// `127.0.0.0/8` and `::1`: a proxy on the same host.
    pub fn loopback() -> Self {
        Self::of(LOOPBACK.to_vec())
    }

    /// The private ranges `10.0.0.0/8`, `172.16.0.0/12`, `192.168.0.0/16` and `fc00::/7`:
    /// a proxy inside your network (a cluster's pod network, a VPC). Trust them only when
    /// nothing outside your network can connect to the service directly.
    pub fn private_networks() -> Self {
        Self::of(PRIVATE.to_vec())
    }

    /// Adds one network.
    pub fn with(mut self, net: IpNet) -> Self {
        self.nets.push(canonical_net(net));
        Self::of(self.nets)
    }

    /// Adds every network of `other`.
    pub fn and(mut self, other: TrustedProxies) -> Self {
        self.nets.extend(other.nets);
        Self::of(self.nets)
    }

    /// Whether `ip` is in one of the networks.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let canonical = super::extractor::canonical(ip);
        self.set.contains_addr(canonical) || self.set.contains_addr(ip)
    }

    /// The networks.
    pub fn nets(&self) -> &[IpNet] {
        &self.nets
    }

    /// Whether no network is trusted.
    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }
}

/// `net` without host bits, and a network of IPv4 addresses written in IPv6 — IPv4-mapped
/// (`::ffff:10.0.0.0/104`) or NAT64's well-known prefix (`64:ff9b::a00:0/104`) — as the IPv4
/// network it holds (`10.0.0.0/8`), since addresses are compared in canonical form.
pub(crate) fn canonical_net(net: IpNet) -> IpNet {
    match net {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => {
            match super::extractor::canonical(IpAddr::V6(v6.addr())) {
                IpAddr::V4(v4) => Ipv4Net::new(v4, v6.prefix_len() - 96).map_or(net, IpNet::V4),
                IpAddr::V6(_) => net,
            }
        }
        _ => net,
    }
    .trunc()
}

/// Which header a trusted proxy writes the client address to.
///
/// Configure the one your proxy sets, and only that one: a header your proxy does not
/// overwrite or append to is written by the client.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (every instance, comma lists), walked from
    /// the right. The default.
    #[default]
    XForwardedFor,
    /// `Forwarded: for=client, for="[2001:db8::1]:443"` (RFC 7239), walked from the right.
    Forwarded,
    /// A header holding one address that the proxy overwrites (`CF-Connecting-IP`,
    /// `X-Real-IP`, `True-Client-IP`). Used as is when the peer is trusted; when it is
    /// missing, repeated or not an address, the peer is the client.
    Single(HeaderName),
}

impl ForwardedHeader {
    /// Reads a header name from configuration: `x-forwarded-for` and `forwarded` (any case)
    /// are the list headers, any other name is a [`ForwardedHeader::Single`].
    ///
    /// ```
    /// use tollgate::key::ForwardedHeader;
    ///
    /// assert_eq!(ForwardedHeader::from_name("Forwarded")?, ForwardedHeader::Forwarded);
    /// assert!(matches!(ForwardedHeader::from_name("CF-Connecting-IP")?, ForwardedHeader::Single(_)));
    /// assert_eq!(ForwardedHeader::from_name("no spaces").unwrap_err().field(), "forwarded_header");
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `forwarded_header` when `name` is not a valid header name.
    pub fn from_name(name: &str) -> Result<Self, ConfigError> {
        let header = HeaderName::try_from(name).map_err(|_| {
            ConfigError::new(
                "forwarded_header",
                format_args!("{name:?}"),
                "not a valid HTTP header name",
            )
        })?;
        Ok(if header == http::header::FORWARDED {
            Self::Forwarded
        } else if header.as_str() == "x-forwarded-for" {
            Self::XForwardedFor
        } else {
            Self::Single(header)
        })
    }
}

/// The client's IP address, read from forwarding headers only when the TCP peer is a trusted
/// proxy. Key `ip:<address>`, the same key [`PeerIp`](super::PeerIp) gives that address;
/// IPv6 clients are grouped by prefix (default [`DEFAULT_IPV6_PREFIX`](super::DEFAULT_IPV6_PREFIX), /56).
///
/// Nothing is trusted by default, and then this is exactly [`PeerIp`](super::PeerIp). When
/// the peer is trusted, the header is walked from the right past trusted hops; the first
/// untrusted address is the client. A hop that is `unknown`, obfuscated or garbage stops
/// the walk at the last good (trusted) address, and so does the hop limit (default 16): the
/// key is never an address the client chose. The exact rule is
/// `key::forwarded::resolve_client`.
///
/// No peer address (the server does not record it) gives no key.
///
/// ```
/// use std::net::SocketAddr;
/// use tollgate::key::{ClientIp, ForwardedHeader, KeyExtractor, RequestView, TrustedProxies};
///
/// let extractor = ClientIp::new(TrustedProxies::parse(["10.0.0.0/8"])?);
///
/// // Behind two trusted proxies: the third address from the right.
/// let mut req = http::Request::builder()
///     .header("x-forwarded-for", "6.6.6.6, 203.0.113.5, 10.0.0.3")
///     .body(())?;
/// req.extensions_mut().insert("10.0.0.2:4000".parse::<SocketAddr>()?);
/// assert_eq!(extractor.extract(&RequestView::new(&req)).unwrap().as_str(), "ip:203.0.113.5");
///
/// // A client that is not a proxy: its headers are ignored.
/// req.extensions_mut().insert("198.51.100.7:4000".parse::<SocketAddr>()?);
/// assert_eq!(extractor.extract(&RequestView::new(&req)).unwrap().as_str(), "ip:198.51.100.7");
///
/// // Cloudflare-style single header.
/// let cf = ClientIp::new(TrustedProxies::parse(["173.245.48.0/20"])?)
///     .header(ForwardedHeader::from_name("cf-connecting-ip")?);
/// let mut req = http::Request::builder().header("cf-connecting-ip", "2001:db8:1:2::9").body(())?;
/// req.extensions_mut().insert("173.245.48.1:443".parse::<SocketAddr>()?);
/// assert_eq!(cf.extract(&RequestView::new(&req)).unwrap().as_str(), "ip:2001:db8:1::/56");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct ClientIp {
    trusted: TrustedProxies,
    header: ForwardedHeader,
    ipv6_prefix: u8,
    max_hops: usize,
}

impl ClientIp {
    /// Believes `X-Forwarded-For` from `trusted` peers; IPv6 grouped by
    /// [`DEFAULT_IPV6_PREFIX`](super::DEFAULT_IPV6_PREFIX) (/56); at most 16 hops.
    pub fn new(trusted: TrustedProxies) -> Self {
        Self {
            trusted,
            header: ForwardedHeader::default(),
            ipv6_prefix: super::DEFAULT_IPV6_PREFIX,
            max_hops: 16,
        }
    }

    /// Which header the trusted proxies write.
    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// Groups IPv6 clients by the first `bits` bits.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `ipv6_prefix` unless `bits` is 1 to 128.
    ///
    /// ```
    /// use tollgate::key::{ClientIp, TrustedProxies};
    ///
    /// let ip = ClientIp::new(TrustedProxies::loopback()).ipv6_prefix(64)?;
    /// assert!(ip.clone().ipv6_prefix(129).is_err());
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn ipv6_prefix(mut self, bits: u8) -> Result<Self, ConfigError> {
        self.ipv6_prefix = checked_prefix(bits)?;
        Ok(self)
    }

    /// Examines at most `hops` header entries (default 16); past them the last trusted
    /// address is the client.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `max_hops` for 0: no entry would be read, and behind a trusted
    /// proxy every client would share the proxy's key.
    ///
    /// ```
    /// use tollgate::key::{ClientIp, TrustedProxies};
    ///
    /// let ip = ClientIp::new(TrustedProxies::private_networks());
    /// assert!(ip.clone().max_hops(4).is_ok());
    /// assert_eq!(ip.max_hops(0).unwrap_err().field(), "max_hops");
    /// ```
    pub fn max_hops(mut self, hops: usize) -> Result<Self, ConfigError> {
        if hops == 0 {
            return Err(ConfigError::new(
                "max_hops",
                hops,
                "at least 1: with 0 no forwarded address is read, and behind a trusted proxy \
                 every client shares the proxy's key",
            ));
        }
        self.max_hops = hops;
        Ok(self)
    }

    /// The trusted networks.
    pub fn trusted(&self) -> &TrustedProxies {
        &self.trusted
    }

    /// The client address of `request` (canonical, not grouped), or `None` without a peer
    /// address.
    pub fn client_ip(&self, request: &RequestView<'_>) -> Option<IpAddr> {
        let peer = super::extractor::canonical(request.peer_addr()?.ip());
        if !self.trusted.contains(peer) {
            return Some(peer);
        }
        let headers = request.headers();
        let is_trusted = |ip| self.trusted.contains(ip);
        let values = |name| headers.get_all(name).iter().map(|v| v.as_bytes());
        Some(match &self.header {
            ForwardedHeader::XForwardedFor => resolve_client(
                peer,
                xff_hops(values(&X_FORWARDED_FOR)),
                self.max_hops,
                is_trusted,
            ),
            ForwardedHeader::Forwarded => resolve_client(
                peer,
                forwarded_hops(values(&http::header::FORWARDED)),
                self.max_hops,
                is_trusted,
            ),
            ForwardedHeader::Single(name) => {
                let mut all = values(name);
                match (all.next(), all.next()) {
                    (Some(value), None) => match parse_node(value) {
                        Hop::Addr(ip) => ip,
                        _ => peer,
                    },
                    _ => peer,
                }
            }
        })
    }

    pub(crate) fn ipv6_prefix_bits(&self) -> u8 {
        self.ipv6_prefix
    }
}

impl Default for ClientIp {
    /// Trusts nobody: the same as [`PeerIp`](super::PeerIp).
    fn default() -> Self {
        Self::new(TrustedProxies::none())
    }
}

impl KeyExtractor for ClientIp {
    fn extract(&self, request: &RequestView<'_>) -> Option<Key> {
        Some(ip_key(self.client_ip(request)?, self.ipv6_prefix))
    }

    fn client_addr(&self, request: &RequestView<'_>) -> Option<IpAddr> {
        self.client_ip(request)
    }
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    fn request(peer: &str, headers: &[(&str, &[u8])]) -> http::Request<()> {
        let mut req = http::Request::new(());
        for (name, value) in headers {
            req.headers_mut().append(
                HeaderName::try_from(*name).unwrap(),
                http::HeaderValue::from_bytes(value).unwrap(),
            );
        }
        req.extensions_mut()
            .insert(peer.parse::<SocketAddr>().unwrap());
        req
    }

    fn key(extractor: &ClientIp, req: &http::Request<()>) -> String {
        extractor
            .extract(&RequestView::new(req))
            .unwrap()
            .as_str()
            .to_owned()
    }

    #[test]
    fn bad_cidrs_name_field_and_value() {
        let err = TrustedProxies::parse(["10.0.0.0/8", "not-an-ip"]).unwrap_err();
        assert_eq!(err.field(), "trusted_proxies[1]");
        assert_eq!(err.value(), "\"not-an-ip\"");
        assert!(TrustedProxies::parse(["::/129"]).is_err());
        assert!(TrustedProxies::parse([""]).is_err());
        let t = TrustedProxies::parse([" 10.1.2.3/8 ", "::1"]).unwrap();
        assert_eq!(t.nets()[0].to_string(), "10.0.0.0/8");
        assert!(t.contains("::1".parse().unwrap()));
        assert!(!t.contains("::2".parse().unwrap()));
        assert!(TrustedProxies::none().is_empty());
        let mapped = TrustedProxies::parse(["::ffff:10.0.0.0/104"]).unwrap();
        assert_eq!(mapped.nets()[0].to_string(), "10.0.0.0/8");
        assert!(mapped.contains("10.9.9.9".parse().unwrap()));
        assert!(mapped.contains("::ffff:10.9.9.9".parse().unwrap()));
    }

    #[test]
    fn untrusted_peer_headers_are_ignored() {
        let ex = ClientIp::new(TrustedProxies::private_networks());
        let fwd = ex.clone().header(ForwardedHeader::Forwarded);
        let real = ex
            .clone()
            .header(ForwardedHeader::from_name("x-real-ip").unwrap());
        let req = request(
            "198.51.100.7:1",
            &[
                ("x-forwarded-for", b"1.2.3.4"),
                ("forwarded", b"for=1.2.3.4"),
                ("x-real-ip", b"1.2.3.4"),
            ],
        );
        for e in [&ex, &fwd, &real] {
            assert_eq!(key(e, &req), "ip:198.51.100.7");
        }
    }

    #[test]
    fn nothing_trusted_by_default() {
        let req = request("10.0.0.1:1", &[("x-forwarded-for", b"1.2.3.4")]);
        assert_eq!(key(&ClientIp::default(), &req), "ip:10.0.0.1");
    }

    #[test]
    fn single_header_mode() {
        let ex = ClientIp::new(TrustedProxies::loopback())
            .header(ForwardedHeader::from_name("CF-Connecting-IP").unwrap());
        let one = request("127.0.0.1:1", &[("cf-connecting-ip", b"203.0.113.1")]);
        assert_eq!(key(&ex, &one), "ip:203.0.113.1");
        let two = request(
            "127.0.0.1:1",
            &[
                ("cf-connecting-ip", b"203.0.113.1"),
                ("cf-connecting-ip", b"203.0.113.2"),
            ],
        );
        assert_eq!(key(&ex, &two), "ip:127.0.0.1");
        let bad = request("127.0.0.1:1", &[("cf-connecting-ip", b"unknown")]);
        assert_eq!(key(&ex, &bad), "ip:127.0.0.1");
        let none = request("127.0.0.1:1", &[]);
        assert_eq!(key(&ex, &none), "ip:127.0.0.1");
    }

    #[test]
    fn ipv4_mapped_peer_is_trusted_as_ipv4() {
        let ex = ClientIp::new(TrustedProxies::parse(["10.0.0.0/8"]).unwrap());
        let req = request(
            "[::ffff:10.0.0.5]:1",
            &[("x-forwarded-for", b"203.0.113.9")],
        );
        assert_eq!(key(&ex, &req), "ip:203.0.113.9");
    }

    #[test]
    fn ipv6_clients_grouped_by_configured_prefix() {
        let ex = ClientIp::new(TrustedProxies::loopback());
        let a = request("127.0.0.1:1", &[("x-forwarded-for", b"2001:db8:0:1::1")]);
        let b = request(
            "127.0.0.1:1",
            &[("x-forwarded-for", b"[2001:db8:0:1:ffff::2]:7")],
        );
        // Another /64 of the same /56: one subscriber's site, one key by default.
        let same_site = request("127.0.0.1:1", &[("x-forwarded-for", b"2001:db8:0:2::1")]);
        let c = request("127.0.0.1:1", &[("x-forwarded-for", b"2001:db8:0:102::1")]);
        assert_eq!(key(&ex, &a), key(&ex, &b));
        assert_eq!(key(&ex, &a), key(&ex, &same_site));
        assert_eq!(key(&ex, &a), "ip:2001:db8::/56");
        assert_ne!(key(&ex, &a), key(&ex, &c));
        let narrow = ex.clone().ipv6_prefix(64).unwrap();
        assert_ne!(key(&narrow, &a), key(&narrow, &same_site));
        let wide = ex.clone().ipv6_prefix(48).unwrap();
        assert_eq!(key(&wide, &a), key(&wide, &c));
        assert_eq!(key(&wide, &a), "ip:2001:db8::/48");
        assert_eq!(ex.ipv6_prefix(0).unwrap_err().field(), "ipv6_prefix");
    }

    #[test]
    fn no_peer_no_key() {
        let req = http::Request::new(());
        assert!(ClientIp::default()
            .extract(&RequestView::new(&req))
            .is_none());
    }
}
