//! [`ApiKey`]: the hash of an API key from a header or a bearer token.

use std::fmt;
use std::sync::Arc;

use hmac::{Hmac, Mac};
use http::header::AUTHORIZATION;
use http::HeaderName;
use sha2::{Digest, Sha256};

use super::{hex_128, Key, KeyExtractor, RequestView};

/// The API key of a request, hashed: key `apikey:<128-bit hash in hex>`.
///
/// By default the key is read from `X-API-Key`, and if that header is absent from
/// `Authorization: Bearer <token>`. A header that is empty or not a bearer token yields no
/// key. When a request carries several instances of the header, the first is used (as
/// `HeaderMap::get` and so most auth layers do).
///
/// The raw key never leaves this extractor: only its hash becomes key material, so it
/// reaches no store, log or span, and `Debug` shows neither keys nor the secret.
///
/// **A key of the client's choosing.** Any string a client sends is a key of its own, with a
/// fresh limit: a client that makes keys up gets a limit per made-up key, and one that holds
/// a real bearer token can add a decoy `X-API-Key` to get a second. Either put the limiter
/// behind the layer that checks API keys (so that only known keys reach it), or name the keys
/// you issue with [`ApiKey::known`]: an unknown key then yields no key, so a
/// [`Chain`](super::Chain) falls through to its next link (the client address).
///
/// **Hashing.** Unkeyed SHA-256 by default: API keys are long random strings, so the hash
/// alone does not reveal them. With [`ApiKey::secret`] the hash is HMAC-SHA256 under that
/// secret, so someone who reads the store cannot test guessed keys against it; use it when
/// keys may be short or guessable. The secret is configured, not drawn at random per
/// process, because every instance sharing a store must derive the same key for the same
/// API key, and a restart must not reset everyone's limits.
///
/// ```
/// use tollgate::key::{ApiKey, KeyExtractor, RequestView};
///
/// let extractor = ApiKey::new();
/// let req = http::Request::builder().header("x-api-key", "sk_live_abc123").body(())?;
/// let key = extractor.extract(&RequestView::new(&req)).unwrap();
/// assert!(key.as_str().starts_with("apikey:"));
/// assert!(!key.as_str().contains("sk_live_abc123"));
///
/// // The same key as a bearer token gives the same rate-limit key.
/// let bearer = http::Request::builder()
///     .header("authorization", "Bearer sk_live_abc123")
///     .body(())?;
/// assert_eq!(extractor.extract(&RequestView::new(&bearer)), Some(key));
///
/// // A keyed hash, from another header only.
/// let keyed = ApiKey::new()
///     .header(http::HeaderName::from_static("x-token"))
///     .bearer(false)
///     .secret(b"from your config");
/// let req = http::Request::builder().header("x-token", "abc").body(())?;
/// assert!(keyed.extract(&RequestView::new(&req)).is_some());
/// assert!(keyed.extract(&RequestView::new(&bearer)).is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct ApiKey {
    header: Option<HeaderName>,
    bearer: bool,
    mac: Option<Hmac<Sha256>>,
    known: Option<Arc<KnownFn>>,
}

/// Whether a raw API key is one that was issued (see [`ApiKey::known`]).
type KnownFn = dyn Fn(&[u8]) -> bool + Send + Sync;

impl ApiKey {
    /// Reads `X-API-Key`, then `Authorization: Bearer`; unkeyed SHA-256.
    pub fn new() -> Self {
        Self {
            header: Some(HeaderName::from_static("x-api-key")),
            bearer: true,
            mac: None,
            known: None,
        }
    }

    /// Reads the key from the header `name` instead of `X-API-Key` (parse a name read from
    /// configuration with `HeaderName::try_from`).
    pub fn header(mut self, name: HeaderName) -> Self {
        self.header = Some(name);
        self
    }

    /// Reads no header: bearer tokens only.
    pub fn without_header(mut self) -> Self {
        self.header = None;
        self
    }

    /// Whether `Authorization: Bearer <token>` is read when the header is absent (default
    /// `true`).
    pub fn bearer(mut self, enabled: bool) -> Self {
        self.bearer = enabled;
        self
    }

    /// Hashes with HMAC-SHA256 under `secret` instead of plain SHA-256. Use a stable secret
    /// of at least 32 random bytes, shared by every instance that shares a store; changing
    /// it gives every API key a fresh limit. An empty secret is public: anyone can compute
    /// the hashes (a plan's `secret_env` naming an empty variable fails to build).
    pub fn secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.mac = Some(
            <Hmac<Sha256> as Mac>::new_from_slice(secret.as_ref())
                .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length")),
        );
        self
    }

    /// Keys a request by its API key only when `known` says the key was issued: a key
    /// nobody issued yields no key, so that a [`Chain`](super::Chain) falls through to its
    /// next link (the client address), and a made-up key never gets a limit of its own.
    /// The header and the bearer token are both tried, so a decoy in one cannot hide a
    /// real key in the other.
    ///
    /// `known` sees the raw key (trimmed) on every request: make it a fast local lookup in
    /// what you issued (a hash set, a cache of your key store), not a call over the network.
    /// A request carrying two issued keys (in the header and as a bearer token) is keyed by
    /// the header's.
    ///
    /// ```
    /// use std::collections::HashSet;
    /// use tollgate::key::{ApiKey, Chain, KeyExtractor, PeerIp, RequestView};
    ///
    /// let issued: HashSet<Vec<u8>> = [b"sk_live_abc123".to_vec()].into();
    /// let extractor = Chain::new(ApiKey::new().known(move |key| issued.contains(key)))
    ///     .or(PeerIp::new());
    /// let request = |api_key: &str| {
    ///     let mut req = http::Request::builder().header("x-api-key", api_key).body(()).unwrap();
    ///     req.extensions_mut().insert("192.0.2.1:5000".parse::<std::net::SocketAddr>().unwrap());
    ///     req
    /// };
    /// let issued_key = extractor.extract(&RequestView::new(&request("sk_live_abc123")));
    /// assert!(issued_key.unwrap().as_str().starts_with("apikey:"));
    /// // A made-up key is limited by the address it comes from.
    /// let made_up = extractor.extract(&RequestView::new(&request("anything")));
    /// assert_eq!(made_up.unwrap().as_str(), "ip:192.0.2.1");
    /// ```
    pub fn known<F>(mut self, known: F) -> Self
    where
        F: Fn(&[u8]) -> bool + Send + Sync + 'static,
    {
        self.known = Some(Arc::new(known));
        self
    }

    /// The raw API key of `request`, if any (borrowed; never stored).
    fn raw<'r>(&self, request: &RequestView<'r>) -> Option<&'r [u8]> {
        let headers = request.headers();
        let header = self.header.as_ref().and_then(|h| headers.get(h));
        match (&self.known, header) {
            // An empty header names no key: the bearer token is read as if it were absent.
            (None, Some(value)) => {
                if let Some(raw) = non_empty(value.as_bytes()) {
                    return Some(raw);
                }
            }
            (Some(known), Some(value)) => {
                if let Some(raw) = non_empty(value.as_bytes()).filter(|raw| known(raw)) {
                    return Some(raw);
                }
            }
            (_, None) => {}
        }
        let token = self.bearer_token(request)?;
        match &self.known {
            Some(known) if !known(token) => None,
            _ => Some(token),
        }
    }

    /// The token of `Authorization: Bearer <token>`, when bearer tokens are read.
    fn bearer_token<'r>(&self, request: &RequestView<'r>) -> Option<&'r [u8]> {
        if !self.bearer {
            return None;
        }
        let auth = request.headers().get(AUTHORIZATION)?.as_bytes();
        let (scheme, token) = auth.split_at_checked(6)?;
        if !scheme.eq_ignore_ascii_case(b"bearer") || !token.starts_with(b" ") {
            return None;
        }
        non_empty(token)
    }

    /// The hash of `raw` as key material: 32 lowercase hex digits.
    fn digest(&self, raw: &[u8]) -> [u8; 32] {
        match &self.mac {
            Some(mac) => {
                let mut mac = mac.clone();
                mac.update(raw);
                hex_128(&mac.finalize().into_bytes())
            }
            None => hex_128(&Sha256::digest(raw)),
        }
    }
}

fn non_empty(value: &[u8]) -> Option<&[u8]> {
    let value = value.trim_ascii();
    (!value.is_empty()).then_some(value)
}

impl Default for ApiKey {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiKey")
            .field("header", &self.header)
            .field("bearer", &self.bearer)
            .field(
                "hash",
                &if self.mac.is_some() {
                    "hmac-sha256"
                } else {
                    "sha256"
                },
            )
            .field("known", &self.known.is_some())
            .finish()
    }
}

impl KeyExtractor for ApiKey {
    fn extract(&self, request: &RequestView<'_>) -> Option<Key> {
        let raw = self.raw(request)?;
        Some(Key::new("apikey", self.digest(raw)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn extract(ex: &ApiKey, headers: &[(&str, &str)]) -> Option<Key> {
        let mut b = http::Request::builder();
        for (n, v) in headers {
            b = b.header(*n, *v);
        }
        ex.extract(&RequestView::new(&b.body(()).unwrap()))
    }

    #[test]
    fn header_bearer_and_their_absence() {
        let ex = ApiKey::new();
        let a = extract(&ex, &[("x-api-key", "k1")]).unwrap();
        assert_eq!(
            extract(&ex, &[("authorization", "bearer   k1 ")]),
            Some(a.clone())
        );
        assert_ne!(extract(&ex, &[("x-api-key", "k2")]), Some(a.clone()));
        // The header wins over the bearer token; an empty one names nothing and hides
        // nothing.
        assert_eq!(
            extract(&ex, &[("x-api-key", "k1"), ("authorization", "Bearer k2")]),
            Some(a.clone())
        );
        assert_eq!(
            extract(&ex, &[("x-api-key", " "), ("authorization", "Bearer k1")]),
            Some(a)
        );
        for missing in [
            &[][..],
            &[("x-api-key", "  ")],
            &[("authorization", "Bearer ")],
            &[("authorization", "Bearerk1")],
            &[("authorization", "Basic azE6")],
            &[("authorization", "Bear")],
        ] {
            assert_eq!(extract(&ex, missing), None, "{missing:?}");
        }
        assert_eq!(
            extract(&ex.clone().bearer(false), &[("authorization", "Bearer k1")]),
            None
        );
        assert_eq!(extract(&ex.without_header(), &[("x-api-key", "k1")]), None);
    }

    #[test]
    fn only_known_keys_are_keys_and_a_decoy_hides_no_real_one() {
        let ex = ApiKey::new().known(|raw| raw == b"real");
        let real = extract(&ex, &[("x-api-key", "real")]).unwrap();
        assert_eq!(extract(&ex, &[("x-api-key", "made-up")]), None);
        assert_eq!(extract(&ex, &[("authorization", "Bearer made-up")]), None);
        // A decoy header does not hide the real bearer token, nor a decoy token the header.
        assert_eq!(
            extract(
                &ex,
                &[("x-api-key", "decoy"), ("authorization", "Bearer real")]
            ),
            Some(real.clone())
        );
        assert_eq!(
            extract(
                &ex,
                &[("x-api-key", " real "), ("authorization", "Bearer decoy")]
            ),
            Some(real)
        );
        assert!(format!("{ex:?}").contains("known: true"));
    }

    #[test]
    fn keyed_hash_differs_and_debug_hides_everything() {
        let plain = ApiKey::new();
        let keyed = ApiKey::new().secret("s3cret-value");
        let other = ApiKey::new().secret("other");
        let h = [("x-api-key", "raw-api-key-value")];
        let (p, k, o) = (
            extract(&plain, &h).unwrap(),
            extract(&keyed, &h).unwrap(),
            extract(&other, &h).unwrap(),
        );
        assert!(p != k && k != o && p != o);
        // Known answer: SHA-256("abc") starts ba7816bf8f01cfea414140de5dae2223.
        let abc = extract(&plain, &[("x-api-key", "abc")]).unwrap();
        assert_eq!(abc.as_str(), "apikey:ba7816bf8f01cfea414140de5dae2223");
        let dbg = format!("{keyed:?}");
        assert!(!dbg.contains("s3cret"), "{dbg}");
        assert!(dbg.contains("hmac-sha256"), "{dbg}");
    }

    proptest! {
        #[test]
        fn hash_never_reveals_the_raw_key(raw in "[!-~]{8,200}", secret in proptest::option::of("[a-z]{0,40}")) {
            let mut ex = ApiKey::new();
            if let Some(s) = &secret {
                ex = ex.secret(s);
            }
            let key = extract(&ex, &[("x-api-key", &raw)]).unwrap();
            let s = key.as_str();
            prop_assert!(!s.contains(raw.as_str()));
            prop_assert_ne!(s, raw.as_str());
            prop_assert_eq!(s.len(), "apikey:".len() + 32);
        }
    }
}
