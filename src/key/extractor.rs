//! The [`KeyExtractor`] trait and the core extractors.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use http::{Extensions, HeaderMap, Method, Request, Uri};

use super::Key;

/// What an extractor may read of a request: method, URI, headers and extensions.
///
/// A borrowed view, so one extractor works for any request body type. Its `Debug` output
/// shows header names but no header values, so credentials never reach a log through it.
#[derive(Clone, Copy)]
pub struct RequestView<'a> {
    method: &'a Method,
    uri: &'a Uri,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
}

impl fmt::Debug for RequestView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Names<'h>(&'h HeaderMap);
        impl fmt::Debug for Names<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_list().entries(self.0.keys()).finish()
            }
        }
        f.debug_struct("RequestView")
            .field("method", self.method)
            .field("uri", self.uri)
            .field("headers", &Names(self.headers))
            .finish_non_exhaustive()
    }
}

impl<'a> RequestView<'a> {
    /// A view of `request`.
    pub fn new<B>(request: &'a Request<B>) -> Self {
        Self {
            method: request.method(),
            uri: request.uri(),
            headers: request.headers(),
            extensions: request.extensions(),
        }
    }

    /// A view of request parts.
    pub fn from_parts(parts: &'a http::request::Parts) -> Self {
        Self {
            method: &parts.method,
            uri: &parts.uri,
            headers: &parts.headers,
            extensions: &parts.extensions,
        }
    }

    /// The method.
    pub fn method(&self) -> &'a Method {
        self.method
    }

    /// The URI.
    pub fn uri(&self) -> &'a Uri {
        self.uri
    }

    /// The headers.
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The extensions (where axum puts `ConnectInfo` and auth layers put the principal).
    pub fn extensions(&self) -> &'a Extensions {
        self.extensions
    }

    /// The TCP peer address, from axum's `ConnectInfo<SocketAddr>` (feature `axum`), tonic's
    /// `TcpConnectInfo` (feature `tonic`) or a plain `SocketAddr` extension.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        #[cfg(feature = "tonic")]
        if let Some(addr) = self
            .extensions
            .get::<tonic::transport::server::TcpConnectInfo>()
            .and_then(tonic::transport::server::TcpConnectInfo::remote_addr)
        {
            return Some(addr);
        }
        #[cfg(feature = "axum")]
        if let Some(axum::extract::ConnectInfo(addr)) = self
            .extensions
            .get::<axum::extract::ConnectInfo<SocketAddr>>()
        {
            return Some(*addr);
        }
        self.extensions.get::<SocketAddr>().copied()
    }
}

/// Derives the rate-limit [`Key`] of a request.
///
/// Returning `None` means "this extractor has no key for this request" (no authenticated user,
/// no peer address); the limiter's missing-key setting decides what happens then.
///
/// Implement it for your own types, or wrap a closure with [`from_fn`].
///
/// ```
/// use tollgate::key::{Key, KeyExtractor, RequestView};
///
/// #[derive(Debug)]
/// struct Tenant;
///
/// impl KeyExtractor for Tenant {
///     fn extract(&self, request: &RequestView<'_>) -> Option<Key> {
///         let tenant = request.headers().get("x-tenant")?;
///         Some(Key::new("tenant", tenant.as_bytes()))
///     }
/// }
///
/// let req = http::Request::builder().header("x-tenant", "acme").body(()).unwrap();
/// assert_eq!(Tenant.extract(&RequestView::new(&req)).unwrap().as_str(), "tenant:acme");
/// ```
pub trait KeyExtractor: Send + Sync + fmt::Debug + 'static {
    /// The key for `request`, or `None`.
    fn extract(&self, request: &RequestView<'_>) -> Option<Key>;

    /// The client address this extractor reads for `request` (whole, not grouped by
    /// prefix; an IPv4 address written in IPv6 may come either way, as networks are matched
    /// against both forms), or `None` when it reads none (the default).
    ///
    /// A limiter's client networks ([`allow_cidr`](crate::LimiterBuilder::allow_cidr),
    /// [`deny_cidr`](crate::LimiterBuilder::deny_cidr)) are matched against this address
    /// whatever key the request gets, so that a client inside a denied network cannot step
    /// out of it by sending a key of another kind (an API key before the address in a
    /// [`Chain`](super::Chain)). [`PeerIp`], [`ClientIp`](super::ClientIp),
    /// [`IpUserAgent`](super::IpUserAgent), and a chain or composite holding one of them
    /// read it; implement it for an extractor of your own that keys by an address.
    ///
    /// ```
    /// use std::net::{IpAddr, SocketAddr};
    /// use tollgate::key::{ApiKey, Chain, ClientIp, KeyExtractor, RequestView};
    ///
    /// let extractor = Chain::new(ApiKey::new()).or(ClientIp::default());
    /// let mut req = http::Request::builder().header("x-api-key", "made-up").body(())?;
    /// req.extensions_mut().insert("203.0.113.9:4000".parse::<SocketAddr>()?);
    /// let view = RequestView::new(&req);
    /// assert!(extractor.extract(&view).unwrap().as_str().starts_with("apikey:"));
    /// assert_eq!(extractor.client_addr(&view), Some("203.0.113.9".parse::<IpAddr>()?));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn client_addr(&self, request: &RequestView<'_>) -> Option<IpAddr> {
        let _ = request;
        None
    }
}

impl<K: KeyExtractor + ?Sized> KeyExtractor for Arc<K> {
    fn extract(&self, request: &RequestView<'_>) -> Option<Key> {
        (**self).extract(request)
    }

    fn client_addr(&self, request: &RequestView<'_>) -> Option<IpAddr> {
        (**self).client_addr(request)
    }
}

impl<K: KeyExtractor + ?Sized> KeyExtractor for Box<K> {
    fn extract(&self, request: &RequestView<'_>) -> Option<Key> {
        (**self).extract(request)
    }

    fn client_addr(&self, request: &RequestView<'_>) -> Option<IpAddr> {
        (**self).client_addr(request)
    }
}

/// The TCP peer's IP address, ignoring every header. IPv6 peers are grouped by prefix
/// (default [`DEFAULT_IPV6_PREFIX`](super::DEFAULT_IPV6_PREFIX), /56: see there why);
/// IPv4-mapped IPv6 addresses count as IPv4.
///
/// With axum, serve the app with `into_make_service_with_connect_info::<SocketAddr>()` so
/// the address is there.
///
/// ```
/// use std::net::SocketAddr;
/// use tollgate::key::{KeyExtractor, PeerIp, RequestView};
///
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert("[2001:db8:1:2:3:4:5:6]:443".parse::<SocketAddr>().unwrap());
/// let key = PeerIp::new().extract(&RequestView::new(&req)).unwrap();
/// assert_eq!(key.as_str(), "ip:2001:db8:1::/56");
/// let narrow = PeerIp::new().ipv6_prefix(64)?.extract(&RequestView::new(&req)).unwrap();
/// assert_eq!(narrow.as_str(), "ip:2001:db8:1:2::/64");
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct PeerIp {
    ipv6_prefix: u8,
}

impl PeerIp {
    /// Groups IPv6 by [`DEFAULT_IPV6_PREFIX`](super::DEFAULT_IPV6_PREFIX) (/56).
    pub const fn new() -> Self {
        Self {
            ipv6_prefix: super::DEFAULT_IPV6_PREFIX,
        }
    }

    /// Groups IPv6 addresses by the first `bits` bits (128 keeps every address apart).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`](crate::ConfigError) on `ipv6_prefix` unless `bits` is 1 to 128.
    ///
    /// ```
    /// use tollgate::key::PeerIp;
    ///
    /// assert!(PeerIp::new().ipv6_prefix(64).is_ok());
    /// assert_eq!(PeerIp::new().ipv6_prefix(0).unwrap_err().field(), "ipv6_prefix");
    /// ```
    pub fn ipv6_prefix(mut self, bits: u8) -> Result<Self, crate::ConfigError> {
        self.ipv6_prefix = checked_prefix(bits)?;
        Ok(self)
    }
}

impl Default for PeerIp {
    fn default() -> Self {
        Self::new()
    }
}

impl KeyExtractor for PeerIp {
    fn extract(&self, request: &RequestView<'_>) -> Option<Key> {
        let ip = request.peer_addr()?.ip();
        Some(ip_key(ip, self.ipv6_prefix))
    }

    fn client_addr(&self, request: &RequestView<'_>) -> Option<IpAddr> {
        Some(request.peer_addr()?.ip())
    }
}

/// An IPv6 grouping prefix, which must be 1 to 128 bits: a setter refuses anything else
/// rather than quietly keying by some other prefix.
pub(crate) fn checked_prefix(bits: u8) -> Result<u8, crate::ConfigError> {
    if (1..=128).contains(&bits) {
        Ok(bits)
    } else {
        Err(crate::ConfigError::new(
            "ipv6_prefix",
            bits,
            "must be between 1 and 128",
        ))
    }
}

/// A client address as it is keyed: an IPv4 address written in IPv6 as IPv4 — IPv4-mapped
/// (`::ffff:192.0.2.1`), or translated by NAT64/SIIT into the well-known prefix
/// `64:ff9b::/96` (RFC 6052), where an IPv4 client reaches an IPv6-only service. Grouped by
/// an IPv6 prefix instead, every IPv4 client behind the translator would share one key.
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) if v6.segments()[..6] == [0x64, 0xff9b, 0, 0, 0, 0] => {
            IpAddr::V4(Ipv4Addr::from(u128::from(v6) as u32))
        }
        other => other,
    }
}

/// The key for a client address, grouping IPv6 by `ipv6_prefix` bits.
pub(crate) fn ip_key(ip: IpAddr, ipv6_prefix: u8) -> Key {
    match canonical(ip) {
        // The common case, on every request: `ip:` and the dotted quad written in one go,
        // with no escaping to check (digits and dots are plain material).
        IpAddr::V4(v4) => {
            let mut text = IpText {
                buf: [0; IpText::CAP],
                len: 0,
            };
            text.push_str("ip:");
            text.push_v4(v4);
            Key::from_plain_text(text.as_str())
        }
        v6 => Key::new("ip", ip_material(v6, ipv6_prefix).as_bytes()),
    }
}

/// The text of a client address: IPv4 as is, IPv6 as its `ipv6_prefix` network. Written on
/// the stack: this runs on every request.
pub(crate) fn ip_material(ip: IpAddr, ipv6_prefix: u8) -> IpText {
    use std::fmt::Write;
    let mut text = IpText {
        buf: [0; IpText::CAP],
        len: 0,
    };
    match canonical(ip) {
        IpAddr::V4(v4) => text.push_v4(v4),
        IpAddr::V6(v6) if ipv6_prefix >= 128 => {
            let _ = write!(text, "{v6}");
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let mask = u128::MAX << (128 - u32::from(ipv6_prefix));
            let _ = write!(text, "{}/{ipv6_prefix}", Ipv6Addr::from(bits & mask));
        }
    }
    text
}

/// An address as text in a fixed buffer (the longest, an IPv6 network with `/128`, is 43
/// bytes).
pub(crate) struct IpText {
    buf: [u8; IpText::CAP],
    len: usize,
}

impl IpText {
    const CAP: usize = 48;

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// The text (always ASCII: digits, hex digits, `.`, `:`, `/` and `ip`).
    fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }

    fn push(&mut self, b: u8) {
        if let Some(slot) = self.buf.get_mut(self.len) {
            *slot = b;
            self.len += 1;
        }
    }

    fn push_str(&mut self, s: &str) {
        for &b in s.as_bytes() {
            self.push(b);
        }
    }

    fn push_v4(&mut self, v4: Ipv4Addr) {
        // Each octet's digits from a table, four bytes copied at once (the padding lands past
        // the end, and `CAP` leaves room for it after `ip:` and a dotted quad).
        for (i, octet) in v4.octets().into_iter().enumerate() {
            if i > 0 {
                self.push(b'.');
            }
            let (digits, width) = OCTETS[usize::from(octet)];
            if let Some(dst) = self.buf.get_mut(self.len..self.len + 4) {
                dst.copy_from_slice(&digits);
                self.len += usize::from(width);
            }
        }
    }
}

/// The decimal digits of every octet (left-aligned, padded) and how many there are.
static OCTETS: [([u8; 4], u8); 256] = {
    let mut out = [([0; 4], 0); 256];
    let mut n = 0;
    while n < 256 {
        let (h, t, o) = ((n / 100) as u8, (n / 10 % 10) as u8, (n % 10) as u8);
        out[n] = if n >= 100 {
            ([b'0' + h, b'0' + t, b'0' + o, 0], 3)
        } else if n >= 10 {
            ([b'0' + t, b'0' + o, 0, 0], 2)
        } else {
            ([b'0' + o, 0, 0, 0], 1)
        };
        n += 1;
    }
    out
};

impl fmt::Write for IpText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        let dst = self.buf.get_mut(self.len..end).ok_or(fmt::Error)?;
        dst.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// One key for every request: a global backstop ("never more than 5k/s to /search").
///
/// ```
/// use tollgate::key::{Global, KeyExtractor, RequestView};
///
/// let req = http::Request::new(());
/// assert_eq!(Global::new().extract(&RequestView::new(&req)).unwrap().as_str(), "global:all");
/// assert_eq!(Global::named("search").extract(&RequestView::new(&req)).unwrap().as_str(), "global:search");
/// ```
#[derive(Debug, Clone)]
pub struct Global {
    key: Key,
}

impl Global {
    /// The key `global:all`.
    pub fn new() -> Self {
        Self::named("all")
    }

    /// The key `global:<name>`.
    pub fn named(name: &str) -> Self {
        Self {
            key: Key::global(name),
        }
    }
}

impl Default for Global {
    fn default() -> Self {
        Self::new()
    }
}

impl KeyExtractor for Global {
    fn extract(&self, _request: &RequestView<'_>) -> Option<Key> {
        Some(self.key.clone())
    }
}

/// A closure as an extractor; see [`from_fn`].
#[derive(Clone)]
pub struct FnExtractor<F> {
    f: F,
}

impl<F> fmt::Debug for FnExtractor<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FnExtractor").finish_non_exhaustive()
    }
}

/// Wraps a closure as a [`KeyExtractor`].
///
/// ```
/// use tollgate::key::{from_fn, Key, KeyExtractor, RequestView};
///
/// let by_path = from_fn(|req: &RequestView<'_>| Some(Key::new("path", req.uri().path())));
/// let req = http::Request::builder().uri("/a/b").body(()).unwrap();
/// assert_eq!(by_path.extract(&RequestView::new(&req)).unwrap().as_str(), "path:/a/b");
/// ```
pub fn from_fn<F>(f: F) -> FnExtractor<F>
where
    F: Fn(&RequestView<'_>) -> Option<Key> + Send + Sync + 'static,
{
    FnExtractor { f }
}

impl<F> KeyExtractor for FnExtractor<F>
where
    F: Fn(&RequestView<'_>) -> Option<Key> + Send + Sync + 'static,
{
    fn extract(&self, request: &RequestView<'_>) -> Option<Key> {
        (self.f)(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_peer(addr: &str) -> Request<()> {
        let mut req = Request::new(());
        req.extensions_mut()
            .insert(addr.parse::<SocketAddr>().unwrap());
        req
    }

    #[test]
    fn ipv4_clients_behind_nat64_keep_their_own_keys() {
        let key = |peer: &str| {
            let mut req = http::Request::new(());
            req.extensions_mut()
                .insert(peer.parse::<SocketAddr>().unwrap());
            PeerIp::new().extract(&RequestView::new(&req)).unwrap()
        };
        // 64:ff9b::c000:201 is 192.0.2.1 translated (RFC 6052's well-known prefix).
        assert_eq!(key("[64:ff9b::c000:201]:1").as_str(), "ip:192.0.2.1");
        assert_eq!(key("[64:ff9b::c000:202]:1").as_str(), "ip:192.0.2.2");
        assert_eq!(key("[::ffff:192.0.2.1]:1").as_str(), "ip:192.0.2.1");
        // Outside the /96 it stays an IPv6 prefix.
        assert_eq!(key("[64:ff9b:1::1]:1").as_str(), "ip:64:ff9b:1::/56");
    }

    #[test]
    fn peer_ip_ignores_forwarding_headers() {
        let mut req = with_peer("10.0.0.7:5000");
        req.headers_mut()
            .insert("x-forwarded-for", "1.2.3.4".parse().unwrap());
        let key = PeerIp::new().extract(&RequestView::new(&req)).unwrap();
        assert_eq!(key.as_str(), "ip:10.0.0.7");
    }

    #[test]
    fn ipv6_grouping() {
        let a = PeerIp::new()
            .extract(&RequestView::new(&with_peer("[2001:db8::1]:1")))
            .unwrap();
        let b = PeerIp::new()
            .extract(&RequestView::new(&with_peer("[2001:db8::ffff:2]:1")))
            .unwrap();
        // Another /64 of the same /56 shares the key; another /56 does not.
        let same_site = PeerIp::new()
            .extract(&RequestView::new(&with_peer("[2001:db8:0:1::1]:1")))
            .unwrap();
        let c = PeerIp::new()
            .extract(&RequestView::new(&with_peer("[2001:db8:0:100::1]:1")))
            .unwrap();
        assert_eq!(a, b);
        assert_eq!(a, same_site);
        assert_ne!(a, c);
        let mapped = PeerIp::new()
            .extract(&RequestView::new(&with_peer("[::ffff:1.2.3.4]:1")))
            .unwrap();
        assert_eq!(mapped.as_str(), "ip:1.2.3.4");
        let exact = PeerIp::new()
            .ipv6_prefix(128)
            .unwrap()
            .extract(&RequestView::new(&with_peer("[2001:db8::1]:1")))
            .unwrap();
        assert_eq!(exact.as_str(), "ip:2001:db8::1");
    }

    #[test]
    fn debug_shows_no_header_values() {
        let req = Request::builder()
            .uri("/x")
            .header("authorization", "Bearer secret-token")
            .header("x-api-key", "secret-key")
            .body(())
            .unwrap();
        let shown = format!("{:?}", RequestView::new(&req));
        assert!(
            shown.contains("x-api-key") && shown.contains("/x"),
            "{shown}"
        );
        assert!(!shown.contains("secret"), "{shown}");
    }

    #[test]
    fn ip_text_matches_display() {
        for ip in ["0.0.0.0", "9.10.99.100", "255.255.255.255", "203.0.113.7"] {
            let parsed: IpAddr = ip.parse().unwrap();
            assert_eq!(ip_material(parsed, 64).as_bytes(), ip.as_bytes());
        }
        let longest: IpAddr = "1111:2222:3333:4444:5555:6666:7777:8888".parse().unwrap();
        assert_eq!(
            ip_material(longest, 128).as_bytes(),
            b"1111:2222:3333:4444:5555:6666:7777:8888"
        );
        assert_eq!(
            ip_material(longest, 127).as_bytes(),
            b"1111:2222:3333:4444:5555:6666:7777:8888/127"
        );
    }

    proptest::proptest! {
        #[test]
        fn ip_key_matches_the_general_encoding(v4: Ipv4Addr, v6: Ipv6Addr, prefix in 1u8..=128) {
            for ip in [IpAddr::V4(v4), IpAddr::V6(v4.to_ipv6_mapped()), IpAddr::V6(v6)] {
                let general = Key::new("ip", ip_material(ip, prefix).as_bytes());
                proptest::prop_assert_eq!(ip_key(ip, prefix), general);
            }
        }

        #[test]
        fn ip_text_matches_display_for_any_address(v4: std::net::Ipv4Addr, v6: Ipv6Addr) {
            let (text, shown) = (ip_material(IpAddr::V4(v4), 64), v4.to_string());
            proptest::prop_assert_eq!(text.as_bytes(), shown.as_bytes());
            let canonical = IpAddr::V6(v6).to_canonical().to_string();
            let text = ip_material(IpAddr::V6(v6), 128);
            proptest::prop_assert_eq!(text.as_bytes(), canonical.as_bytes());
        }
    }

    #[test]
    fn no_peer_no_key() {
        assert!(PeerIp::new()
            .extract(&RequestView::new(&Request::new(())))
            .is_none());
    }
}
