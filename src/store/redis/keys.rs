//! The key layout: `<prefix>:{<key>}:<policy>:<part>`, one hash tag per principal.

use crate::error::ConfigError;
use crate::key::Key;
use crate::policy::Algorithm;

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "tollgate";

/// The last part of a state key: which algorithm's state it holds.
fn algorithm_part(algorithm: Algorithm) -> &'static str {
    crate::algorithm::registration(algorithm).key_part
}

/// `<prefix>:{<key>}:<policy>:<part>`: every key of one principal shares the hash tag.
pub(crate) fn state_key(prefix: &str, key: &Key, policy: &str, algorithm: Algorithm) -> String {
    let key = key.as_str();
    let part = algorithm_part(algorithm);
    let mut s = String::with_capacity(prefix.len() + key.len() + policy.len() + part.len() + 5);
    s.push_str(prefix);
    s.push_str(":{");
    s.push_str(key);
    s.push_str("}:");
    s.push_str(policy);
    s.push(':');
    s.push_str(part);
    s
}

/// Checks a key prefix: 1–64 bytes, no braces (they would break the hash tag), no whitespace
/// or control bytes.
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), ConfigError> {
    if prefix.is_empty() || prefix.len() > 64 {
        return Err(ConfigError::new(
            "prefix",
            format_args!("{prefix:?}"),
            "must be 1 to 64 bytes long",
        ));
    }
    if prefix
        .chars()
        .any(|c| c == '{' || c == '}' || c.is_whitespace() || c.is_control())
    {
        return Err(ConfigError::new(
            "prefix",
            format_args!("{prefix:?}"),
            "must not contain '{', '}', whitespace or control characters (it precedes the key's hash tag)",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_one_hash_tag_per_principal() {
        let key = Key::new("user", "a {b}");
        let k = state_key("app", &key, "burst", Algorithm::SlidingWindowCounter);
        assert_eq!(k, "app:{user:a%20%7Bb%7D}:burst:swc");
        let k2 = state_key("app", &key, "daily", Algorithm::Gcra);
        let tag = |s: &str| s[s.find('{').unwrap()..=s.find('}').unwrap()].to_owned();
        assert_eq!(tag(&k), tag(&k2));
    }

    #[test]
    fn prefixes_that_would_break_the_hash_tag_are_refused() {
        assert!(validate_prefix("tollgate").is_ok());
        assert!(validate_prefix("app:v2").is_ok());
        for bad in ["", "a{b", "a}b", "a b", "a\nb", &"x".repeat(65)] {
            assert_eq!(
                validate_prefix(bad).unwrap_err().field(),
                "prefix",
                "{bad:?}"
            );
        }
    }
}
