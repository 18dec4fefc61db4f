//! [`Chain`] (first key wins) and [`Composite`] (several keys as one).

use std::sync::Arc;

use compact_str::CompactString;
use smallvec::SmallVec;

use super::{Key, KeyExtractor, RequestView};

/// Tries extractors in order; the first that yields a key wins, and yields nothing only when
/// none does.
///
/// Each key keeps the source it came from (`user:42`, `apikey:…`, `ip:…`), so keys from
/// different links never collide: user `42` and an address that happened to print as `42`
/// are different keys. The usual chain is the authenticated user, then the API key, then the
/// client address.
///
/// ```
/// use std::net::SocketAddr;
/// use tollgate::key::{ApiKey, Chain, ClientIp, KeyExtractor, RequestView, User};
///
/// let chain = Chain::new(User::<String>::new())
///     .or(ApiKey::new())
///     .or(ClientIp::default());
///
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert("192.0.2.1:1".parse::<SocketAddr>()?);
/// assert_eq!(chain.extract(&RequestView::new(&req)).unwrap().source(), "ip");
///
/// req.headers_mut().insert("x-api-key", "k".parse()?);
/// assert_eq!(chain.extract(&RequestView::new(&req)).unwrap().source(), "apikey");
///
/// req.extensions_mut().insert(String::from("42"));
/// assert_eq!(chain.extract(&RequestView::new(&req)).unwrap().as_str(), "user:42");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct Chain {
    links: Vec<Arc<dyn KeyExtractor>>,
}

impl Chain {
    /// A chain starting with `first`.
    pub fn new(first: impl KeyExtractor) -> Self {
        Self::default().or(first)
    }

    /// Appends `next`, tried when every earlier extractor yields nothing.
    pub fn or(mut self, next: impl KeyExtractor) -> Self {
        self.links.push(Arc::new(next));
        self
    }

    /// How many extractors the chain tries.
    pub fn len(&self) -> usize {
        self.links.len()
    }

    /// Whether the chain is empty (and so never yields a key).
    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }
}

impl KeyExtractor for Chain {
    fn extract(&self, request: &RequestView<'_>) -> Option<Key> {
        self.links.iter().find_map(|link| link.extract(request))
    }

    /// The first link's that reads one, whichever link gives the key.
    fn client_addr(&self, request: &RequestView<'_>) -> Option<std::net::IpAddr> {
        self.links.iter().find_map(|link| link.client_addr(request))
    }
}

/// Several extractors as one key: a limit per (tenant, user), per (IP, API key), …
///
/// Every part must yield a key, or the composite yields nothing (so does an empty one). A
/// composite of one part yields that part's key unchanged. The keys of two or more parts,
/// sources included, are joined with [`Key::from_materials`], which is injective: two different
/// tuples never give one key, and a joined key never equals a single extractor's key. The source is the parts' sources joined with `+` (`composite` when that
/// is longer than 32 characters), and long keys are hashed.
///
/// ```
/// use std::net::SocketAddr;
/// use tollgate::key::{ClientIp, Composite, KeyExtractor, RequestView, User};
///
/// let per_user_and_ip = Composite::new(User::<String>::new()).and(ClientIp::default());
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert("192.0.2.1:1".parse::<SocketAddr>()?);
/// assert!(per_user_and_ip.extract(&RequestView::new(&req)).is_none());
/// req.extensions_mut().insert(String::from("42"));
/// let key = per_user_and_ip.extract(&RequestView::new(&req)).unwrap();
/// assert_eq!(key.as_str(), "user+ip:user:42|ip:192.0.2.1");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct Composite {
    parts: Vec<Arc<dyn KeyExtractor>>,
}

impl Composite {
    /// A composite whose first part is `first`.
    pub fn new(first: impl KeyExtractor) -> Self {
        Self::default().and(first)
    }

    /// Adds a part.
    pub fn and(mut self, part: impl KeyExtractor) -> Self {
        self.parts.push(Arc::new(part));
        self
    }
}

impl KeyExtractor for Composite {
    fn extract(&self, request: &RequestView<'_>) -> Option<Key> {
        if self.parts.is_empty() {
            return None;
        }
        let keys = self
            .parts
            .iter()
            .map(|part| part.extract(request))
            .collect::<Option<SmallVec<[Key; 4]>>>()?;
        if let [only] = keys.as_slice() {
            // A tuple of one is that key itself: the same principal, keyed as its own
            // extractor keys it. Wrapping it (`user:user:a`) would equal the key `User` gives
            // the id `user:a`.
            return Some(only.clone());
        }
        let mut source = CompactString::default();
        for (i, key) in keys.iter().enumerate() {
            if i > 0 {
                source.push('+');
            }
            source.push_str(key.source());
        }
        if source.len() > 32 {
            source = CompactString::const_new("composite");
        }
        let parts: SmallVec<[&str; 4]> = keys.iter().map(Key::as_str).collect();
        Some(Key::from_materials(&source, &parts))
    }

    /// The first part's that reads one.
    fn client_addr(&self, request: &RequestView<'_>) -> Option<std::net::IpAddr> {
        self.parts.iter().find_map(|part| part.client_addr(request))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{from_fn, Global};

    fn fixed(source: &'static str, material: &'static str) -> impl KeyExtractor {
        from_fn(move |_: &RequestView<'_>| Some(Key::new(source, material)))
    }

    fn nothing() -> impl KeyExtractor {
        from_fn(|_: &RequestView<'_>| None)
    }

    fn run(ex: &dyn KeyExtractor) -> Option<Key> {
        ex.extract(&RequestView::new(&http::Request::new(())))
    }

    #[test]
    fn chain_takes_first_key_and_keeps_its_source() {
        assert_eq!(run(&Chain::default()), None);
        assert_eq!(run(&Chain::new(nothing()).or(nothing())), None);
        let c = Chain::new(nothing())
            .or(fixed("ip", "42"))
            .or(fixed("user", "42"));
        assert_eq!(c.len(), 3);
        assert_eq!(run(&c).unwrap().as_str(), "ip:42");
        assert_ne!(run(&c), run(&Chain::new(fixed("user", "42"))));
    }

    #[test]
    fn composite_is_injective_over_parts() {
        let ab = Composite::new(fixed("a", "x|y")).and(fixed("b", "z"));
        let ab2 = Composite::new(fixed("a", "x")).and(fixed("b", "y|z"));
        assert_ne!(run(&ab), run(&ab2));
        assert_eq!(run(&ab).unwrap().source(), "a+b");
        assert_eq!(run(&Composite::new(fixed("a", "1")).and(nothing())), None);
        assert_eq!(run(&Composite::default()), None);
        let long = Composite::new(Global::named(&"n".repeat(200)))
            .and(fixed("abcdefghijklmnopqrstuvwxyz", "1"))
            .and(fixed("abcdefghijklmnopqrstuvwxyz", "2"));
        let k = run(&long).unwrap();
        assert!(k.as_str().starts_with("composite:!"), "{k}");
        assert!(k.as_str().len() <= "composite:!".len() + 32);
    }
}
