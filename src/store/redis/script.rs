//! The decision script: the Lua text both Redis stores run, hashed once, and the numbers it
//! gives the algorithms.
//!
//! The script is the concatenation of `lua/single.lua` (the clock, and the common call of
//! one request on one policy, decided before anything else is defined), `lua/prelude.lua`,
//! one file per algorithm and the driver `lua/decide.lua`, built once.

use std::sync::OnceLock;

use redis::Script;

use crate::policy::Algorithm;

/// How long a key outlives the moment its state stops mattering, in milliseconds.
///
/// Every key a script writes gets `PEXPIRE (expires_at − now) + TTL_MARGIN_MS`, where
/// `expires_at` is the same instant [`crate::algorithm`] computes for the memory store.
pub const TTL_MARGIN_MS: u64 = 1_000;

const SINGLE: &str = include_str!("../../../lua/single.lua");
const PRELUDE: &str = include_str!("../../../lua/prelude.lua");
const COUNTER: &str = include_str!("../../../lua/sliding_window_counter.lua");
const LOG: &str = include_str!("../../../lua/sliding_window_log.lua");
const BUCKET: &str = include_str!("../../../lua/token_bucket.lua");
const FIXED: &str = include_str!("../../../lua/fixed_window.lua");
const GCRA: &str = include_str!("../../../lua/gcra.lua");
const IN_FLIGHT: &str = include_str!("../../../lua/in_flight.lua");
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
        [
            SINGLE,
            prelude.as_str(),
            COUNTER,
            LOG,
            BUCKET,
            FIXED,
            GCRA,
            IN_FLIGHT,
            DRIVER,
        ]
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
    match algorithm {
        Algorithm::SlidingWindowCounter => 1,
        Algorithm::SlidingWindowLog => 2,
        Algorithm::TokenBucket => 3,
        Algorithm::FixedWindow => 4,
        Algorithm::Gcra => 5,
        Algorithm::InFlight => 6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_is_one_text_with_every_algorithm() {
        let s = source();
        for id in 1..=6 {
            assert!(
                s.contains(&format!("ALG[{id}] =")),
                "algorithm {id} missing"
            );
        }
        assert!(s.contains(&format!("local TTL_MARGIN_MS = {TTL_MARGIN_MS}")));
        assert!(s.trim_end().ends_with("return table.concat(replies)"));
    }
}
