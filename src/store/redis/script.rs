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

/// How long a key outlives the moment its state stops mattering, in milliseconds, before
/// its expiry is rounded up to the grid of [`TTL_GRID_MS`].
///
/// `expires_at` is the same instant [`crate::algorithm`] computes for the memory store. The
/// key of a sliding window log or in-flight state gets `PEXPIRE (expires_at − now) +
/// TTL_MARGIN_MS`. The key of a counter, token bucket, fixed window or GCRA state expires at
/// the first multiple of [`TTL_GRID_MS`] at or after `expires_at + TTL_MARGIN_MS`: at least
/// `TTL_MARGIN_MS − TTL_GRID_MS` (488 ms) and less than `TTL_MARGIN_MS + TTL_GRID_MS`
/// (1 512 ms) after its state stops mattering. A write whose state's expiry stays in the
/// same cell of that grid keeps the key's TTL (`SET … KEEPTTL`) instead of setting a new one:
/// for GCRA, whose expiry moves by the emission interval with each charged request, while
/// that interval times the cost is under half a second; for the token bucket while its
/// deficit refills in about that.
///
/// Both bounds are on the script's clock (`TIME`); Redis counts a TTL from its own time for
/// the command, which can differ from it by about a millisecond, well inside the lower
/// bound's 488 ms. With an injected clock, the bounds hold only while that clock runs at
/// Redis's rate (a frozen test clock does not).
///
/// A token bucket's state matters until its deficit is refilled, which depends on its
/// limit, and the limit can change without a write. Under a per-key override the key is
/// kept for the slower of the override's and the plan's rates (the override can end, by
/// its TTL or removal, with nothing written), and setting an override extends the key's
/// TTL to what the override's rate needs; the memory store keeps its entries the same way.
/// So a key outlives the upper bound by the slower rate's refill while an override that
/// raised the limit is in force. Not covered, until the key's next charge: a reload that
/// lowers a bucket's limit (in either store: the memory store's sweeper forgets entries by
/// the same expiry), an override set by an instance of an earlier version (a plain `SET`),
/// and an override that raised the limit being removed when the key was last written by an
/// earlier version's script (its TTL followed the override's rate alone). In each, a key
/// whose deficit the faster rate would have refilled can expire while the slower one would
/// still hold the bucket back.
pub const TTL_MARGIN_MS: u64 = 1_000;

/// The step of the grid on which the keys of string states expire, in milliseconds: see
/// [`TTL_MARGIN_MS`]. At most `TTL_MARGIN_MS`, so a key never expires before its state stops
/// mattering, and a power of two, so the script's rounding is exact in doubles.
pub const TTL_GRID_MS: u64 = 512;

const SINGLE: &str = include_str!("../../../lua/single.lua");
const PRELUDE: &str = include_str!("../../../lua/prelude.lua");
const DRIVER: &str = include_str!("../../../lua/decide.lua");

/// The Lua text of the decision script both Redis stores run, for inspection, auditing or
/// loading ahead of time with `SCRIPT LOAD` (the stores load it themselves on `NOSCRIPT`).
///
/// ```
/// let lua = tollgate::store::redis::script_source();
/// assert!(lua.contains("redis.call('TIME')"));
/// ```
pub fn script_source() -> &'static str {
    source()
}

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
        let text = std::iter::once(SINGLE)
            .chain([prelude.as_str()])
            .chain(algorithms)
            .chain([DRIVER])
            .collect::<Vec<_>>()
            .join("\n");
        // single.lua and prelude.lua both name the margin, the grid and the usage cap.
        with_ttl_constants(&text).replace(
            "local MAX_USAGE_WINDOW_PRODUCT = 4503599627370496",
            &format!(
                "local MAX_USAGE_WINDOW_PRODUCT = {}",
                crate::algorithm::MAX_USAGE_WINDOW_PRODUCT
            ),
        )
    })
}

/// `lua` with the margin and the grid it names set to [`TTL_MARGIN_MS`] and [`TTL_GRID_MS`].
fn with_ttl_constants(lua: &str) -> String {
    lua.replace(
        "local TTL_MARGIN_MS = 1000",
        &format!("local TTL_MARGIN_MS = {TTL_MARGIN_MS}"),
    )
    .replace(
        "local TTL_GRID_MS = 512",
        &format!("local TTL_GRID_MS = {TTL_GRID_MS}"),
    )
}

/// The decision script, hashed once.
pub(crate) fn script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(source()))
}

/// The script that sets a token bucket's per-key override and extends its state key's TTL
/// to what the override's refill rate needs (`lua/set_override.lua`), hashed once.
pub(crate) fn set_override_script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| {
        Script::new(&with_ttl_constants(include_str!(
            "../../../lua/set_override.lua"
        )))
    })
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
        // Both files that name the constants get the values of this module.
        let named = |text: &str| s.matches(text).count();
        assert_eq!(
            named(&format!("local TTL_MARGIN_MS = {TTL_MARGIN_MS}\n")),
            2
        );
        assert_eq!(named(&format!("local TTL_GRID_MS = {TTL_GRID_MS}\n")), 2);
        assert!(TTL_GRID_MS <= TTL_MARGIN_MS && TTL_GRID_MS.is_power_of_two());
        assert!(s.trim_end().ends_with("return table.concat(replies)"));
        assert_eq!(
            named(&format!(
                "local MAX_USAGE_WINDOW_PRODUCT = {}\n",
                crate::algorithm::MAX_USAGE_WINDOW_PRODUCT
            )),
            2
        );
    }
}
