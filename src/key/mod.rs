//! Rate-limit keys and the extractors that derive them from requests.
//!
//! A [`Key`] names who shares a limit. It is built in one place, [`Key::new`], from a *source*
//! (`ip`, `user`, `global`, …) and raw *material* (an address, a user id): the encoding is
//! injective (different inputs never give one key, and `user:42` can never equal `ip:42`),
//! contains no `{`, `}`, whitespace or control bytes (so it is safe inside a Redis hash tag),
//! and is bounded in length (long material is replaced by a SHA-256 digest).
//!
//! A [`KeyExtractor`] reads a request and yields a key, or nothing. Ready-made extractors:
//!
//! | extractor | key | for |
//! | --- | --- | --- |
//! | [`User`] / [`User::from_fn`] | `user:42` | the principal an auth layer put in the extensions |
//! | [`ApiKey`] | `apikey:<hash>` | `X-API-Key` or `Authorization: Bearer`, hashed |
//! | [`ClientIp`] | `ip:203.0.113.5` | the client behind [`TrustedProxies`] |
//! | [`PeerIp`] | `ip:203.0.113.5` | the TCP peer, no headers read |
//! | [`IpUserAgent`] | `ip+ua:…` | anonymous traffic, split by `User-Agent` behind one NAT |
//! | [`Global`] | `global:all` | one budget for everyone (a per-endpoint backstop) |
//! | [`Chain`] | the first key found | user, else API key, else client address |
//! | [`Composite`] | `user+ip:…` | a tuple of keys as one key |
//! | [`from_fn`] | anything | a closure |
//!
//! IPv6 addresses are grouped by prefix (default [`DEFAULT_IPV6_PREFIX`], /56: one subscriber
//! site usually holds a whole /56 or /48, so counting /64s would give one client 256
//! budgets). When no key can be found, the limiter's [`MissingKey`](crate::MissingKey) setting
//! rejects the request with `400` or puts it in one shared bucket.
//!
//! # Examples
//!
//! ```
//! use tollgate::key::Key;
//!
//! let k = Key::new("user", "42");
//! assert_eq!(k.as_str(), "user:42");
//! assert_ne!(Key::new("user", "42"), Key::new("ip", "42"));
//! // Hostile material is escaped: no braces, no spaces.
//! assert_eq!(Key::new("user", "a {b}").as_str(), "user:a%20%7Bb%7D");
//! ```

mod api_key;
mod chain;
mod client_ip;
mod extractor;
// Public only for the fuzz targets; `ClientIp` is the supported interface.
#[doc(hidden)]
pub mod forwarded;
mod ip_user_agent;
mod networks;
mod user;

pub use api_key::ApiKey;
pub use chain::{Chain, Composite};
pub use client_ip::{ClientIp, ForwardedHeader, TrustedProxies};
pub use extractor::{from_fn, FnExtractor, Global, KeyExtractor, PeerIp, RequestView};
pub use ip_user_agent::IpUserAgent;

pub(crate) use client_ip::canonical_net;
pub(crate) use extractor::canonical as canonical_ip;
pub(crate) use networks::NetworkSet;
pub use user::{User, UserFn};

use std::fmt;

use compact_str::CompactString;
use sha2::{Digest, Sha256};

/// The default IPv6 prefix length by which [`PeerIp`], [`ClientIp`] and [`IpUserAgent`] group
/// addresses: 56 bits.
///
/// One IPv6 client controls far more than one address: a subscriber is delegated a whole
/// prefix, and RIPE-690 (the RIPE NCC's best practice for end-user IPv6 prefix assignment)
/// recommends a /48 or a /56 per site, which is what many ISPs hand out. Keyed by /64, a
/// client with a /56 holds 256 separate budgets, and with a /48, 65 536: enough to fill a
/// memory store's key cap from one site. express-rate-limit 8 groups IPv6 by /56 by default
/// for this reason, and warns that keying by full IPv6 addresses lets clients bypass limits. The cost: clients that share one
/// /56 share a budget, which is most likely on mobile networks, where each device gets a
/// /64 from a carrier pool; raise the prefix with `ipv6_prefix(64)` where that matters more
/// than the spread an attacker gets. IPv4-mapped IPv6 addresses are keyed as IPv4, never by
/// prefix (grouping `::ffff:0:0/96` by /56 would put every IPv4 client in one bucket).
///
/// ```
/// use tollgate::key::{KeyExtractor, PeerIp, RequestView, DEFAULT_IPV6_PREFIX};
///
/// assert_eq!(DEFAULT_IPV6_PREFIX, 56);
/// let key = |addr: &str| {
///     let mut req = http::Request::new(());
///     req.extensions_mut().insert(addr.parse::<std::net::SocketAddr>().unwrap());
///     PeerIp::new().extract(&RequestView::new(&req)).unwrap()
/// };
/// // Two /64s of one site share a key; IPv4-mapped addresses stay apart.
/// assert_eq!(key("[2001:db8:0:1::1]:1"), key("[2001:db8:0:ff::1]:1"));
/// assert_ne!(key("[::ffff:192.0.2.1]:1"), key("[::ffff:192.0.2.2]:1"));
/// ```
pub const DEFAULT_IPV6_PREFIX: u8 = 56;

/// Escaped material longer than this is replaced by a digest.
pub const MAX_MATERIAL_LEN: usize = 96;

/// An encoded rate-limit key: `<source>:<escaped material>`. Cheap to clone; short keys are
/// stored inline without allocating.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(CompactString);

impl Key {
    /// Encodes `material` from `source` into a key.
    ///
    /// The source is kept as is when it is 1–32 characters of `a-z 0-9 _ . + -`, escaped
    /// otherwise, and replaced by `#` and 128 bits of its SHA-256 when escaping makes it longer
    /// than 96 characters (so a key is never longer than 98 + [`MAX_MATERIAL_LEN`] bytes). In the material, ASCII letters, digits and `- . _ ~ : / @ + = ,` are kept
    /// and every other byte becomes `%XX`; when the result is longer than
    /// [`MAX_MATERIAL_LEN`], the material is replaced by `#` and the first 128 bits of its
    /// SHA-256 in hex (`#` cannot appear in escaped material, so the two forms never meet).
    ///
    /// ```
    /// use tollgate::key::Key;
    ///
    /// let long = "x".repeat(1000);
    /// let k = Key::new("user", &long);
    /// assert!(k.as_str().starts_with("user:#"));
    /// assert_eq!(k.as_str().len(), "user:#".len() + 32);
    /// ```
    pub fn new(source: &str, material: impl AsRef<[u8]>) -> Self {
        let material = material.as_ref();
        if let Some(key) = Self::plain(source, material) {
            return key;
        }
        let escaped = escaped_len(material);
        let mut out = CompactString::with_capacity(source.len() + 1 + escaped.min(33));
        push_source(&mut out, source);
        if escaped > MAX_MATERIAL_LEN {
            out.push('#');
            push_digest(&mut out, &Sha256::digest(material));
        } else {
            push_material(&mut out, material);
        }
        Self(out)
    }

    /// Encodes a tuple of materials from `source` into one key (see [`Composite`]).
    ///
    /// Each part is escaped as in [`Key::new`] and the parts are joined by `|`, which escaped
    /// material never contains, so two tuples never give one key. When the joined result is
    /// longer than [`MAX_MATERIAL_LEN`], the material is replaced by `!` and the first 128 bits
    /// of the SHA-256 of the length-prefixed parts. A one-part tuple is exactly
    /// `Key::new(source, part)`; the empty tuple is the material `!`. No multi-part key can
    /// equal a single-material key: the `|`, `!` and `#` forms never meet.
    ///
    /// ```
    /// use tollgate::key::Key;
    ///
    /// let k = Key::from_materials("ip+ua", &["10.0.0.1", "curl/8.0"]);
    /// assert_eq!(k.as_str(), "ip+ua:10.0.0.1|curl/8.0");
    /// // The separator is escaped inside a part, so the tuples stay apart.
    /// assert_ne!(Key::from_materials("t", &["a|b", "c"]), Key::from_materials("t", &["a", "b|c"]));
    /// assert_eq!(Key::from_materials("t", &["x"]), Key::new("t", "x"));
    /// ```
    pub fn from_materials<P: AsRef<[u8]>>(source: &str, parts: &[P]) -> Self {
        if let [single] = parts {
            return Self::new(source, single);
        }
        let mut out = CompactString::default();
        push_source(&mut out, source);
        push_parts(&mut out, parts);
        Self(out)
    }

    /// The common case, built in one go: a plain source and material that needs no escaping
    /// (an address, a numeric id) — the same text the general path would produce.
    #[inline]
    fn plain(source: &str, material: &[u8]) -> Option<Self> {
        const CAP: usize = 32 + 1 + MAX_MATERIAL_LEN;
        if !is_plain_source(source)
            || material.len() > MAX_MATERIAL_LEN
            || !material.iter().all(|&b| is_material_byte(b))
        {
            return None;
        }
        let mut buf = [0u8; CAP];
        let (s, m) = (source.len(), material.len());
        buf[..s].copy_from_slice(source.as_bytes());
        buf[s] = b':';
        buf[s + 1..s + 1 + m].copy_from_slice(material);
        let text = std::str::from_utf8(&buf[..s + 1 + m]).ok()?;
        Some(Self(CompactString::new(text)))
    }

    /// An already encoded key, for the extractors that write `source:material` in one go
    /// from material that needs no escaping (a dotted quad).
    #[inline]
    pub(crate) fn from_plain_text(text: &str) -> Self {
        debug_assert!(Self::plain(
            text.split_once(':').map_or("", |(s, _)| s),
            text.split_once(':').map_or(&[][..], |(_, m)| m.as_bytes())
        )
        .is_some_and(|k| k.as_str() == text));
        Self(CompactString::new(text))
    }

    /// The global key `global:<name>`, shared by every request.
    pub fn global(name: &str) -> Self {
        Self::new("global", name)
    }

    /// The encoded key.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The source part (before the first `:`).
    pub fn source(&self) -> &str {
        self.0.split_once(':').map_or(&self.0, |(s, _)| s)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({:?})", self.as_str())
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl AsRef<str> for Key {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

/// Reads a key written as [`Display`](fmt::Display) shows it, `source:material`: the text
/// the admin API's `?key=` and `tollgate inspect` take.
///
/// `%XX` is read as the byte it escapes, and a character written as itself stands for itself
/// (`user:José` is `user:Jos%C3%A9`), so the key is the one its extractor builds whether the
/// text was escaped or not. In the material, `|` separates the parts of a tuple
/// ([`Key::from_materials`]; a `|` inside a part is `%7C`), and a material that starts with
/// `#` or `!` is a digest ([`Key::new`] and [`Key::from_materials`] replace long material by
/// one): `#` or `!` and 32 lowercase hex digits, or `!` alone for the empty tuple. A source
/// that starts with `#` is a digested source, in the same form.
///
/// Only a byte a key escapes may be written `%XX`: `%61` (an `a`) is refused, because no key
/// shows it, and it is what a key decoded once too often looks like (the material
/// `%61cme`, shown `%2561cme`, read twice would name the tenant `acme`).
///
/// # Errors
///
/// A [`ConfigError`](crate::ConfigError) on `key`: no `:`, a `%` not followed by two hex
/// digits, a `%XX` of a byte a key never escapes, a source that is not UTF-8, or a malformed
/// digest.
///
/// ```
/// use tollgate::key::Key;
///
/// let ua = Key::from_materials("ip+ua", &["10.0.0.1", "Mozilla/5.0 (X11)"]);
/// assert_eq!(ua.as_str(), "ip+ua:10.0.0.1|Mozilla/5.0%20%28X11%29");
/// assert_eq!(ua.as_str().parse::<Key>()?, ua);
/// assert_eq!("ip+ua:10.0.0.1|Mozilla/5.0 (X11)".parse::<Key>()?, ua);
///
/// let long = Key::new("user", "x".repeat(500));
/// assert_eq!(long.to_string().parse::<Key>()?, long);
/// assert!("user:#123".parse::<Key>().is_err());
/// # Ok::<(), tollgate::ConfigError>(())
/// ```
impl std::str::FromStr for Key {
    type Err = crate::ConfigError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |reason: &str| crate::ConfigError::new("key", text, reason);
        let Some((source, material)) = text.split_once(':') else {
            return Err(bad(
                "a key is source:material, e.g. ip:203.0.113.5 or user:42",
            ));
        };
        let mut out = CompactString::default();
        if let Some(digest) = source.strip_prefix('#') {
            if !is_hex_digest(digest) {
                return Err(bad("a digested source is # and 32 lowercase hex digits"));
            }
            out.push_str(source);
            out.push(':');
        } else {
            let bytes = percent_decoded(source, is_source_byte).map_err(|e| bad(&e))?;
            let source = std::str::from_utf8(&bytes).map_err(|_| bad("a key's source is UTF-8"))?;
            push_source(&mut out, source);
        }
        if let Some(digest) = material.strip_prefix('#') {
            if !is_hex_digest(digest) {
                return Err(bad("a digested material is # and 32 lowercase hex digits"));
            }
            out.push_str(material);
        } else if let Some(digest) = material.strip_prefix('!') {
            if !digest.is_empty() && !is_hex_digest(digest) {
                return Err(bad(
                    "a digested tuple is ! and 32 lowercase hex digits (! alone: the empty tuple)",
                ));
            }
            out.push_str(material);
        } else {
            let parts = material
                .split('|')
                .map(|part| percent_decoded(part, is_material_byte))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| bad(&e))?;
            match parts.as_slice() {
                [single] => push_single(&mut out, single),
                parts => push_parts(&mut out, parts),
            }
        }
        Ok(Self(out))
    }
}

/// Whether `text` is a digest as keys show it: 32 lowercase hex digits.
pub(crate) fn is_hex_digest(text: &str) -> bool {
    text.len() == 32
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `text` with each `%XX` read as its byte. Refused: a `%` not followed by two hex digits, and
/// an escape of a byte that `kept` says a key writes as itself.
fn percent_decoded(text: &str, kept: fn(u8) -> bool) -> Result<Vec<u8>, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b != b'%' {
            out.push(b);
            i += 1;
            continue;
        }
        let escaped = bytes
            .get(i + 1..i + 3)
            .filter(|hex| hex.iter().all(u8::is_ascii_hexdigit))
            .and_then(|hex| u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok())
            .ok_or("a % in a key is followed by two hex digits (a % itself is %25)")?;
        if kept(escaped) {
            return Err(format!(
                "%{:02X} escapes {:?}, which a key never escapes: a shown key pasted into a URL \
                 unencoded is decoded once more (write its % as %25)",
                escaped,
                char::from(escaped)
            ));
        }
        out.push(escaped);
        i += 3;
    }
    Ok(out)
}

/// A short, stable digest of a key for logs and spans: never the key material itself.
pub fn digest(key: &Key) -> String {
    let d = Sha256::digest(key.as_str().as_bytes());
    String::from_utf8_lossy(&hex_128(&d)[..16]).into_owned()
}

fn is_source_byte(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'+' | b'-')
}

fn is_plain_source(s: &str) -> bool {
    (1..=32).contains(&s.len()) && s.bytes().all(is_source_byte)
}

#[inline]
fn is_material_byte(b: u8) -> bool {
    // A table: this runs for every byte of every key, on every request.
    static MATERIAL: [bool; 256] = {
        let mut table = [false; 256];
        let mut b = 0;
        while b < 256 {
            let c = b as u8;
            table[b] = c.is_ascii_alphanumeric()
                || matches!(
                    c,
                    b'-' | b'.' | b'_' | b'~' | b':' | b'/' | b'@' | b'+' | b'=' | b','
                );
            b += 1;
        }
        table
    };
    MATERIAL[usize::from(b)]
}

fn push_source(out: &mut CompactString, source: &str) {
    if is_plain_source(source) {
        out.push_str(source);
    } else if source
        .bytes()
        .map(|b| if is_source_byte(b) { 1 } else { 3 })
        .sum::<usize>()
        > 96
    {
        out.push('#');
        push_digest(out, &Sha256::digest(source.as_bytes()));
    } else {
        for &b in source.as_bytes() {
            if is_source_byte(b) {
                out.push(b as char);
            } else {
                push_escaped(out, b);
            }
        }
    }
    out.push(':');
}

fn escaped_len(material: &[u8]) -> usize {
    material
        .iter()
        .map(|&b| if is_material_byte(b) { 1 } else { 3 })
        .sum()
}

fn push_material(out: &mut CompactString, material: &[u8]) {
    let mut rest = material;
    while !rest.is_empty() {
        let run = rest
            .iter()
            .position(|&b| !is_material_byte(b))
            .unwrap_or(rest.len());
        // Material bytes are ASCII, so the run is always valid UTF-8.
        out.push_str(std::str::from_utf8(&rest[..run]).unwrap_or_default());
        let Some((&escaped, tail)) = rest[run..].split_first() else {
            break;
        };
        push_escaped(out, escaped);
        rest = tail;
    }
}

/// One material: escaped, or `#` and its digest when escaped it is too long.
fn push_single(out: &mut CompactString, material: &[u8]) {
    if escaped_len(material) > MAX_MATERIAL_LEN {
        out.push('#');
        push_digest(out, &Sha256::digest(material));
    } else {
        push_material(out, material);
    }
}

/// A tuple of materials (see [`Key::from_materials`]): escaped and joined by `|`, `!` when
/// empty, or `!` and the digest of the length-prefixed parts when joined it is too long.
fn push_parts<P: AsRef<[u8]>>(out: &mut CompactString, parts: &[P]) {
    let joined_len = parts
        .iter()
        .map(|p| escaped_len(p.as_ref()) + 1)
        .sum::<usize>()
        .saturating_sub(1);
    if parts.is_empty() {
        out.push('!');
    } else if joined_len > MAX_MATERIAL_LEN {
        let mut hasher = Sha256::new();
        for p in parts {
            let p = p.as_ref();
            hasher.update((p.len() as u64).to_be_bytes());
            hasher.update(p);
        }
        out.push('!');
        push_digest(out, &hasher.finalize());
    } else {
        for (i, p) in parts.iter().enumerate() {
            if i > 0 {
                out.push('|');
            }
            push_material(out, p.as_ref());
        }
    }
}

/// Appends the first 128 bits of `digest` in lowercase hex.
fn push_digest(out: &mut CompactString, digest: &[u8]) {
    for b in hex_128(digest) {
        out.push(char::from(b));
    }
}

/// The first 128 bits of `digest` (at least 16 bytes) in lowercase hex: the one hex encoding
/// of digests in keys, API-key hashes and login usernames.
pub(crate) fn hex_128(digest: &[u8]) -> [u8; 32] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 32];
    for (i, b) in digest.iter().take(16).enumerate() {
        out[2 * i] = HEX[usize::from(b >> 4)];
        out[2 * i + 1] = HEX[usize::from(b & 15)];
    }
    out
}

/// `b` as `%XX` with uppercase hex digits (RFC 3986 percent-encoding): the one escape of key
/// material and of gRPC messages.
pub(crate) fn percent_escaped(b: u8) -> [char; 3] {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    [
        '%',
        char::from(HEX[usize::from(b >> 4)]),
        char::from(HEX[usize::from(b & 15)]),
    ]
}

fn push_escaped(out: &mut CompactString, b: u8) {
    out.extend(percent_escaped(b));
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sources_cannot_collide() {
        assert_ne!(Key::new("user", "1"), Key::new("ip", "1"));
        assert_ne!(Key::new("a:b", "c"), Key::new("a", "b:c"));
        assert_eq!(Key::new("a:b", "c").as_str(), "a%3Ab:c");
        assert_eq!(Key::new("user", "").as_str(), "user:");
        assert_eq!(Key::new("", "x").as_str(), ":x");
        assert_eq!(Key::new("user", "7").source(), "user");
        let long = "S".repeat(40);
        assert_eq!(Key::new(&long, "x").source().len(), 33);
        assert!(Key::new(&long, "x").source().starts_with('#'));
        assert_ne!(Key::new(&long, "x"), Key::new(&"S".repeat(41), "x"));
    }

    #[test]
    fn ipv6_material_stays_readable() {
        assert_eq!(Key::new("ip", "2001:db8::/64").as_str(), "ip:2001:db8::/64");
    }

    fn is_safe(k: &Key) -> bool {
        k.as_str()
            .bytes()
            .all(|c| c.is_ascii_graphic() && c != b'{' && c != b'}')
    }

    #[test]
    fn part_forms_never_meet_plain_forms() {
        let long = "y".repeat(200);
        assert_eq!(Key::from_materials::<&str>("t", &[]).as_str(), "t:!");
        assert_eq!(Key::from_materials("t", &["", ""]).as_str(), "t:|");
        assert_ne!(
            Key::from_materials("t", &[""]),
            Key::from_materials("t", &["", ""])
        );
        assert_ne!(Key::from_materials("t", &["a", "b"]), Key::new("t", "a|b"));
        assert!(Key::from_materials("t", &["x", &long])
            .as_str()
            .starts_with("t:!"));
        assert!(Key::new("t", &long).as_str().starts_with("t:#"));
        assert_ne!(
            Key::from_materials("t", &["x", &long]),
            Key::from_materials("t", &[&long, "x"])
        );
    }

    #[test]
    fn parsing_refuses_what_no_key_shows() {
        for bad in [
            "user",
            "user:%",
            "user:%4",
            "user:%+1",
            "user:%zz",
            "user:#abc",
            "user:#0123456789ABCDEF0123456789abcdef",
            "user:!12",
            "#12:x",
            "%FF:x",
        ] {
            let err = bad.parse::<Key>().unwrap_err();
            assert_eq!(err.field(), "key", "{bad}");
            assert_eq!(err.value(), bad);
        }
        let digest = "0123456789abcdef0123456789abcdef";
        for good in [
            format!("user:#{digest}"),
            format!("t:!{digest}"),
            "t:!".to_owned(),
            "t:|".to_owned(),
            ":x".to_owned(),
            "user:".to_owned(),
            format!("#{digest}:x"),
        ] {
            assert_eq!(good.parse::<Key>().unwrap().as_str(), good);
        }
        // Written loosely, read as the extractor builds it; an escape no key shows is refused.
        assert!("user:%61b".parse::<Key>().is_err());
        assert!("%75ser:b".parse::<Key>().is_err());
        assert_eq!(
            "user:a%7Cb".parse::<Key>().unwrap(),
            Key::new("user", "a|b")
        );
        assert_eq!("User:x".parse::<Key>().unwrap(), Key::new("User", "x"));
        assert_eq!("%55ser:x".parse::<Key>().unwrap(), Key::new("User", "x"));
        assert_eq!("user:a b".parse::<Key>().unwrap(), Key::new("user", "a b"));
        assert_eq!(
            "user:%23ab".parse::<Key>().unwrap(),
            Key::new("user", "#ab")
        );
    }

    proptest! {
        #[test]
        fn encoding_is_injective_and_safe(
            s1 in "[a-z:{}% ]{0,6}|[a-zA-Z]{30,40}", m1 in proptest::collection::vec(any::<u8>(), 0..140),
            s2 in "[a-z:{}% ]{0,6}|[a-zA-Z]{30,40}", m2 in proptest::collection::vec(any::<u8>(), 0..140),
        ) {
            let a = Key::new(&s1, &m1);
            let b = Key::new(&s2, &m2);
            prop_assert_eq!(a == b, s1 == s2 && m1 == m2);
            for k in [&a, &b] {
                prop_assert!(is_safe(k), "unsafe key {:?}", k);
                prop_assert!(k.as_str().len() <= 32 * 3 + 2 + MAX_MATERIAL_LEN);
            }
        }

        #[test]
        fn every_key_reads_back_as_itself(
            source in "[a-z:{}%# ]{0,6}|[a-zA-Z]{30,40}",
            parts in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..60), 0..4),
            plain in proptest::collection::vec(any::<u8>(), 0..140),
        ) {
            for key in [Key::from_materials(&source, &parts), Key::new(&source, &plain)] {
                prop_assert_eq!(key.as_str().parse::<Key>(), Ok(key.clone()));
            }
        }

        #[test]
        fn part_encoding_is_injective_and_safe(
            p1 in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..60), 0..4),
            p2 in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..60), 0..4),
            plain in proptest::collection::vec(any::<u8>(), 0..140),
        ) {
            let a = Key::from_materials("s", &p1);
            let b = Key::from_materials("s", &p2);
            prop_assert_eq!(a == b, p1 == p2);
            // Only a one-part tuple can equal a plain key (and then only its own).
            let c = Key::new("s", &plain);
            prop_assert_eq!(a == c, p1.len() == 1 && p1[0] == plain);
            for k in [&a, &b] {
                prop_assert!(is_safe(k), "unsafe key {:?}", k);
                prop_assert!(k.as_str().len() <= 2 + MAX_MATERIAL_LEN);
            }
        }
    }
}
