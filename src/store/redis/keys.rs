//! The key layout: `<prefix>:{<key>}:<policy>:<part>`, one hash tag per principal. Every
//! Redis key the stores name is built here.
//!
//! | the key of                         | `<part>`                      |
//! |------------------------------------|-------------------------------|
//! | an algorithm's state               | its key part (`swc`, `gcra`…) |
//! | the key's override of that state   | the state's part, then `:ovr` |
//! | a lease ledger's state             | `lease-swc`, `lease-swl`, `lease-tb`, `lease-fw` |
//! | a ledger log's entry units         | `lease-swl:u`                 |
//! | a region's deposit (regions)       | the ledger's part, then `:deposit` |

use redis::{RedisWrite, ToRedisArgs};

use crate::error::ConfigError;
use crate::key::Key;
use crate::policy::Algorithm;
use crate::store::leased::Kind;

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "tollgate";

/// What an override key adds to its state key.
const OVERRIDE_SUFFIX: &str = ":ovr";

/// What the key of a ledger log's entry units adds to the log's key.
const LOG_UNITS_SUFFIX: &str = ":u";

/// What a region's deposit key adds to the ledger state's key.
#[cfg(feature = "regions")]
const DEPOSIT_SUFFIX: &str = ":deposit";

/// What a key is for, which names its last part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyFor {
    /// The state of a policy of this algorithm.
    State(Algorithm),
    /// The key's per-key override of that state: two little-endian doubles, the limit and
    /// the capacity (see `wire::override_value`).
    Override(Algorithm),
    /// A lease ledger's state of a policy leased as this kind.
    Ledger(Kind),
    /// The units of each entry of a ledger's sliding window log (a hash by entry id).
    LedgerLogUnits,
    /// A region's deposit of a policy leased as this kind (`lua/region.lua`).
    #[cfg(feature = "regions")]
    Deposit(Kind),
}

impl KeyFor {
    /// The part after the policy's name, and the suffix after that part.
    fn part(self) -> (&'static str, &'static str) {
        match self {
            KeyFor::State(a) => (algorithm_part(a), ""),
            KeyFor::Override(a) => (algorithm_part(a), OVERRIDE_SUFFIX),
            KeyFor::Ledger(kind) => (ledger_part(kind), ""),
            KeyFor::LedgerLogUnits => (ledger_part(Kind::Log), LOG_UNITS_SUFFIX),
            #[cfg(feature = "regions")]
            KeyFor::Deposit(kind) => (ledger_part(kind), DEPOSIT_SUFFIX),
        }
    }
}

/// The part of an algorithm's state key.
fn algorithm_part(algorithm: Algorithm) -> &'static str {
    crate::algorithm::registration(algorithm).key_part
}

/// The part of a ledger state's key.
fn ledger_part(kind: Kind) -> &'static str {
    match kind {
        Kind::Counter => "lease-swc",
        Kind::Log => "lease-swl",
        Kind::Bucket => "lease-tb",
        Kind::Fixed => "lease-fw",
    }
}

/// `<prefix>:{<key>}:<policy>:<part>`, the part naming what the key is for: every key of one
/// principal shares the hash tag, so one script call's keys are in one Cluster hash slot.
pub(crate) fn redis_key(prefix: &str, key: &Key, policy: &str, of: KeyFor) -> String {
    let key = key.as_str();
    let (part, suffix) = of.part();
    let mut s = String::with_capacity(
        prefix.len() + key.len() + policy.len() + part.len() + suffix.len() + 5,
    );
    s.push_str(prefix);
    s.push_str(":{");
    s.push_str(key);
    s.push_str("}:");
    s.push_str(policy);
    s.push(':');
    s.push_str(part);
    s.push_str(suffix);
    s
}

/// The key of a state's override, from the state's key ([`KeyFor::State`]), written straight
/// into a command without a `String` of its own: a script call names one per state. The same
/// text as [`redis_key`] with [`KeyFor::Override`].
pub(crate) struct OverrideOf<'a>(pub(crate) &'a str);

impl ToRedisArgs for OverrideOf<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        use std::io::Write;
        let mut arg = out.writer_for_next_arg();
        // Writing into the command's buffer cannot fail.
        let _ = arg.write_all(self.0.as_bytes());
        let _ = arg.write_all(OVERRIDE_SUFFIX.as_bytes());
    }
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

    /// Every kind of key a principal's policy has.
    fn every_key_for() -> Vec<KeyFor> {
        let mut all: Vec<KeyFor> = Algorithm::ALL.iter().map(|&a| KeyFor::State(a)).collect();
        all.extend(Algorithm::ALL.iter().map(|&a| KeyFor::Override(a)));
        all.extend([Kind::Counter, Kind::Log, Kind::Bucket, Kind::Fixed].map(KeyFor::Ledger));
        all.push(KeyFor::LedgerLogUnits);
        all
    }

    #[test]
    fn keys_share_one_hash_tag_per_principal() {
        let key = Key::new("user", "a {b}");
        let k = redis_key(
            "app",
            &key,
            "burst",
            KeyFor::State(Algorithm::SlidingWindowCounter),
        );
        assert_eq!(k, "app:{user:a%20%7Bb%7D}:burst:swc");
        let tag = |s: &str| s[s.find('{').unwrap()..=s.find('}').unwrap()].to_owned();
        for of in every_key_for() {
            for policy in ["burst", "daily"] {
                let other = redis_key("app", &key, policy, of);
                assert_eq!(tag(&other), tag(&k), "{of:?}");
                assert!(other.starts_with("app:{"), "{other}");
            }
        }
    }

    #[test]
    fn each_part_has_its_own_key() {
        let key = Key::new("ip", "1.2.3.4");
        let names: Vec<String> = every_key_for()
            .into_iter()
            .map(|h| redis_key("t", &key, "p", h))
            .collect();
        let distinct: std::collections::HashSet<&String> = names.iter().collect();
        assert_eq!(distinct.len(), names.len(), "{names:?}");
        assert_eq!(
            redis_key("t", &key, "p", KeyFor::Override(Algorithm::Gcra)),
            "t:{ip:1.2.3.4}:p:gcra:ovr"
        );
        assert_eq!(
            redis_key("t", &key, "p", KeyFor::Ledger(Kind::Bucket)),
            "t:{ip:1.2.3.4}:p:lease-tb"
        );
        assert_eq!(
            redis_key("t", &key, "p", KeyFor::LedgerLogUnits),
            "t:{ip:1.2.3.4}:p:lease-swl:u"
        );
    }

    #[test]
    fn an_override_written_from_its_state_key_is_the_override_key() {
        let key = Key::new("user", "42");
        for a in Algorithm::ALL {
            let state = redis_key("app", &key, "api", KeyFor::State(a));
            let mut cmd = redis::cmd("GET");
            cmd.arg(OverrideOf(&state));
            let written: Vec<Vec<u8>> = cmd
                .args_iter()
                .skip(1)
                .map(|arg| match arg {
                    redis::Arg::Simple(bytes) => bytes.to_vec(),
                    _ => panic!("only plain arguments"),
                })
                .collect();
            assert_eq!(
                written,
                [redis_key("app", &key, "api", KeyFor::Override(a)).into_bytes()]
            );
        }
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
