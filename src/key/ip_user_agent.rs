//! [`IpUserAgent`]: client address plus `User-Agent` (and optionally the path).

use http::header::USER_AGENT;

use super::client_ip::ClientIp;
use super::extractor::ip_material;
use super::{Key, KeyExtractor, RequestView};

/// The client address together with its `User-Agent` (and, optionally, the request path), for
/// unauthenticated traffic: several people behind one NAT or office proxy usually differ in
/// browser or tool, so they stop sharing one limit.
///
/// Key `ip+ua:<address>|<user agent>` (`ip+ua+path:…|<path>` with the path), hashed when long,
/// as [`Key::from_materials`] does. A missing `User-Agent` counts as an empty one. The address is
/// taken exactly as the wrapped [`ClientIp`] takes it, trusted proxies included.
///
/// The user agent is chosen by the client, so this only *splits* a client's budget when the
/// client wants it split: a client rotating user agents gets a fresh limit each time. Pair it
/// with a looser per-IP policy on a second limiter as a backstop. Including the path makes a
/// separate limit per URL; avoid it on routes with ids in the path.
///
/// ```
/// use std::net::SocketAddr;
/// use tollgate::key::{ClientIp, IpUserAgent, KeyExtractor, RequestView};
///
/// let extractor = IpUserAgent::new(ClientIp::default());
/// let mut req = http::Request::builder()
///     .uri("/search")
///     .header("user-agent", "curl/8.5.0")
///     .body(())?;
/// req.extensions_mut().insert("192.0.2.1:5000".parse::<SocketAddr>()?);
/// let key = extractor.extract(&RequestView::new(&req)).unwrap();
/// assert_eq!(key.as_str(), "ip+ua:192.0.2.1|curl/8.5.0");
///
/// let with_path = extractor.with_path(true).extract(&RequestView::new(&req)).unwrap();
/// assert_eq!(with_path.as_str(), "ip+ua+path:192.0.2.1|curl/8.5.0|/search");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct IpUserAgent {
    ip: ClientIp,
    path: bool,
}

impl IpUserAgent {
    /// The address from `ip` and the user agent, without the path.
    pub fn new(ip: ClientIp) -> Self {
        Self { ip, path: false }
    }

    /// Whether the request path is part of the key (default `false`).
    pub fn with_path(mut self, enabled: bool) -> Self {
        self.path = enabled;
        self
    }
}

impl KeyExtractor for IpUserAgent {
    fn extract(&self, request: &RequestView<'_>) -> Option<Key> {
        let ip = self.ip.client_ip(request)?;
        let ip = ip_material(ip, self.ip.ipv6_prefix_bits());
        let ua = request
            .headers()
            .get(USER_AGENT)
            .map_or(&b""[..], |v| v.as_bytes());
        Some(if self.path {
            let path = request.uri().path().as_bytes();
            Key::from_materials("ip+ua+path", &[ip.as_bytes(), ua, path])
        } else {
            Key::from_materials("ip+ua", &[ip.as_bytes(), ua])
        })
    }

    fn client_addr(&self, request: &RequestView<'_>) -> Option<std::net::IpAddr> {
        self.ip.client_ip(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::TrustedProxies;
    use std::net::SocketAddr;

    fn req(peer: &str, ua: Option<&str>, xff: Option<&str>) -> http::Request<()> {
        let mut b = http::Request::builder().uri("/a?q=1");
        if let Some(ua) = ua {
            b = b.header("user-agent", ua);
        }
        if let Some(xff) = xff {
            b = b.header("x-forwarded-for", xff);
        }
        let mut r = b.body(()).unwrap();
        r.extensions_mut()
            .insert(peer.parse::<SocketAddr>().unwrap());
        r
    }

    fn key(ex: &IpUserAgent, r: &http::Request<()>) -> Key {
        ex.extract(&RequestView::new(r)).unwrap()
    }

    #[test]
    fn nat_neighbours_split_by_user_agent() {
        let ex = IpUserAgent::default();
        let a = key(&ex, &req("192.0.2.1:1", Some("firefox"), None));
        let b = key(&ex, &req("192.0.2.1:2", Some("chrome"), None));
        let c = key(&ex, &req("192.0.2.2:1", Some("firefox"), None));
        assert!(a != b && a != c);
        assert_eq!(
            key(&ex, &req("192.0.2.1:1", None, None)).as_str(),
            "ip+ua:192.0.2.1|"
        );
        let long = "Mozilla/5.0 ".repeat(20);
        let hashed = key(&ex, &req("192.0.2.1:1", Some(&long), None));
        assert!(hashed.as_str().starts_with("ip+ua:!"), "{hashed}");
        let path = key(&ex.with_path(true), &req("192.0.2.1:1", Some("x"), None));
        assert_eq!(path.as_str(), "ip+ua+path:192.0.2.1|x|/a");
    }

    #[test]
    fn uses_trusted_proxy_walk_and_ipv6_grouping() {
        let ex = IpUserAgent::new(
            ClientIp::new(TrustedProxies::loopback())
                .ipv6_prefix(56)
                .unwrap(),
        );
        let k = key(
            &ex,
            &req("127.0.0.1:1", Some("x"), Some("2001:db8:0:ff::1")),
        );
        assert_eq!(k.as_str(), "ip+ua:2001:db8::/56|x");
        let k = key(&ex, &req("192.0.2.9:1", Some("x"), Some("2001:db8::1")));
        assert_eq!(k.as_str(), "ip+ua:192.0.2.9|x");
    }
}
