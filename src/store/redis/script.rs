//! The decision script: the Lua text both Redis stores run, hashed once, and the numbers it
//! gives the algorithms.
//!
//! The script is the concatenation of `lua/single.lua` (the clock, and the common call of
//! one request on one policy, decided before anything else is defined), `lua/prelude.lua`,
//! each algorithm's Lua file (from the algorithm registry in [`crate::algorithm`]) and the
//! driver `lua/decide.lua`, built once.

use std::sync::OnceLock;

use redis::Script;

use crate::algorithm::registration;
use crate::policy::Algorithm;

/// How long a key outlives the moment its state stops mattering, in milliseconds.
///
/// Every key a script writes gets `PEXPIRE (expires_at − now) + TTL_MARGIN_MS`, where
/// `expires_at` is the same instant [`crate::algorithm`] computes for the memory store.
pub const TTL_MARGIN_MS: u64 = 1_000;

const SINGLE: &str = include_str!("../../../lua/single.lua");
const PRELUDE: &str = include_str!("../../../lua/prelude.lua");
const DRIVER: &str = include_str!("../../../lua/decide.lua");

/// The whole decision script, as sent to Redis.
pub(crate) fn source() -> &'static str {
    static SOURCE: OnceLock<String> = OnceLock::new();
    SOURCE.get_or_init(|| {
        let prelude = PRELUDE.replace(
            "local IN_FLIGHT_RETRY_AFTER_MS = 1000",
            &format!(
                "local IN_FLIGHT_RETRY_AFTER_MS = {}",
                crate::algorithm::in_flight::RETRY_AFTER_MS
            ),
        );
        let algorithms = Algorithm::ALL.iter().map(|&a| registration(a).lua);
        std::iter::once(SINGLE)
            .chain([prelude.as_str()])
            .chain(algorithms)
            .chain([DRIVER])
            .collect::<Vec<_>>()
            .join("\n")
            // single.lua and prelude.lua both name the margin.
            .replace(
                "local TTL_MARGIN_MS = 1000",
                &format!("local TTL_MARGIN_MS = {TTL_MARGIN_MS}"),
            )
    })
}

/// The decision script, hashed once.
pub(crate) fn script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(source()))
}

/// The algorithm's number in the script's `ALG` table.
pub(crate) fn algorithm_id(algorithm: Algorithm) -> u8 {
    registration(algorithm).script_id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_is_one_text_with_every_algorithm() {
        let s = source();
        for a in Algorithm::ALL {
            let id = algorithm_id(a);
            assert!(
                registration(a).lua.contains(&format!("ALG[{id}] =")),
                "{a:?}'s Lua file must fill ALG[{id}]"
            );
            assert!(s.contains(registration(a).lua), "{a:?} missing");
        }
        assert!(s.contains(&format!("local TTL_MARGIN_MS = {TTL_MARGIN_MS}")));
        assert!(s.trim_end().ends_with("return table.concat(replies)"));
    }
}
