//! Rate-limit keys and the extractors that derive them from requests.
//!
//! A [`Key`] names who shares a limit. It is built in one place, [`Key::new`], from a *source*
//! (`ip`, `user`, `global`, …) and raw *material* (an address, a user id): the encoding is
//! injective (different inputs never give one key, and `user:42` can never equal `ip:42`),
//! contains no `{`, `}`, whitespace or control bytes (so it is safe inside a Redis hash tag),
//! and is bounded in length (long material is replaced by a SHA-256 digest).
//!
//! A [`KeyExtractor`] reads a request and yields a key, or nothing. Ready-made extractors:
//! [`PeerIp`], [`Global`] and [`from_fn`] for anything else.
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

mod extractor;

pub use extractor::{from_fn, FnExtractor, Global, KeyExtractor, PeerIp, RequestView};

use std::fmt;

use compact_str::CompactString;
use sha2::{Digest, Sha256};

/// Escaped material longer than this is replaced by a digest.
pub const MAX_MATERIAL_LEN: usize = 96;

/// An encoded rate-limit key: `<source>:<escaped material>`. Cheap to clone; short keys are
/// stored inline without allocating.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(CompactString);

impl Key {
    /// Encodes `material` from `source` into a key.
    ///
    /// The source is kept as is when it is 1–32 characters of `a-z 0-9 _ . + -` and escaped
    /// otherwise. In the material, ASCII letters, digits and `- . _ ~ : / @ + = ,` are kept
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
        let mut out = CompactString::default();
        if is_plain_source(source) {
            out.push_str(source);
        } else {
            for &b in source.as_bytes() {
                if is_source_byte(b) {
                    out.push(b as char);
                } else {
                    push_escaped(&mut out, b);
                }
            }
        }
        out.push(':');
        let escaped_len: usize = material
            .iter()
            .map(|&b| if is_material_byte(b) { 1 } else { 3 })
            .sum();
        if escaped_len > MAX_MATERIAL_LEN {
            out.push('#');
            let digest = Sha256::digest(material);
            for b in &digest[..16] {
                push_hex(&mut out, *b);
            }
        } else {
            for &b in material {
                if is_material_byte(b) {
                    out.push(b as char);
                } else {
                    push_escaped(&mut out, b);
                }
            }
        }
        Self(out)
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

/// A short, stable digest of a key for logs and spans: never the key material itself.
pub fn digest(key: &Key) -> String {
    let d = Sha256::digest(key.as_str().as_bytes());
    let mut out = CompactString::default();
    for b in &d[..8] {
        push_hex(&mut out, *b);
    }
    out.into()
}

fn is_source_byte(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'+' | b'-')
}

fn is_plain_source(s: &str) -> bool {
    (1..=32).contains(&s.len()) && s.bytes().all(is_source_byte)
}

fn is_material_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'-' | b'.' | b'_' | b'~' | b':' | b'/' | b'@' | b'+' | b'=' | b','
        )
}

fn push_hex(out: &mut CompactString, b: u8) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(HEX[usize::from(b >> 4)] as char);
    out.push(HEX[usize::from(b & 15)] as char);
}

fn push_escaped(out: &mut CompactString, b: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push('%');
    out.push(HEX[usize::from(b >> 4)] as char);
    out.push(HEX[usize::from(b & 15)] as char);
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
    }

    #[test]
    fn ipv6_material_stays_readable() {
        assert_eq!(Key::new("ip", "2001:db8::/64").as_str(), "ip:2001:db8::/64");
    }

    proptest! {
        #[test]
        fn encoding_is_injective_and_safe(
            s1 in "[a-z:{}% ]{0,6}", m1 in proptest::collection::vec(any::<u8>(), 0..140),
            s2 in "[a-z:{}% ]{0,6}", m2 in proptest::collection::vec(any::<u8>(), 0..140),
        ) {
            let a = Key::new(&s1, &m1);
            let b = Key::new(&s2, &m2);
            prop_assert_eq!(a == b, s1 == s2 && m1 == m2);
            for k in [&a, &b] {
                let safe = k.as_str().bytes().all(|c| c.is_ascii_graphic() && c != b'{' && c != b'}');
                prop_assert!(safe, "unsafe byte in {:?}", k);
                prop_assert!(k.as_str().len() <= 32 * 3 + 1 + MAX_MATERIAL_LEN);
            }
        }
    }
}
