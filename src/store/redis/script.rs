//! The decision script: the Lua text both Redis stores run, hashed once; and the script
//! that sets a token bucket's override.
//!
//! The script is the concatenation of `lua/single.lua` (the clock, and the common call of
//! one request on one policy, decided before anything else is defined), `lua/integers.lua`
//! and `lua/prelude.lua` (helpers), `lua/sliding_window_counter_math.lua` (the counter's
//! arithmetic, which the lease script shares), each algorithm's Lua file (from the algorithm
//! registry in [`crate::algorithm`]) and the driver `lua/decide.lua`, with the values of the
//! constants it shares with Rust written in (see `lua_constants.rs`), built once.

use std::sync::OnceLock;

use redis::Script;

use super::lua_constants;
#[cfg(test)]
use super::ttl::{TTL_GRID_MS, TTL_MARGIN_MS};
use crate::algorithm::registration;
use crate::policy::Algorithm;

const SINGLE: &str = include_str!("../../../lua/single.lua");
const INTEGERS: &str = include_str!("../../../lua/integers.lua");
const PRELUDE: &str = include_str!("../../../lua/prelude.lua");
const COUNTER_MATH: &str = include_str!("../../../lua/sliding_window_counter_math.lua");
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
        let algorithms = Algorithm::ALL.iter().map(|&a| registration(a).lua);
        let joined = [SINGLE, INTEGERS, PRELUDE, COUNTER_MATH]
            .into_iter()
            .chain(algorithms)
            .chain([DRIVER])
            .collect::<Vec<_>>()
            .join("\n");
        lua_constants::inline(&joined)
    })
}

/// The decision script, hashed once.
pub(crate) fn script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(source()))
}

/// The script that sets a token bucket's per-key override and extends its state key's TTL
/// to what the override's refill rate needs: `lua/set_override.lua`, the shared constants
/// written in.
pub(crate) fn set_override_source() -> &'static str {
    static SOURCE: OnceLock<String> = OnceLock::new();
    SOURCE.get_or_init(|| lua_constants::inline(include_str!("../../../lua/set_override.lua")))
}

/// [`set_override_source`], hashed once.
pub(crate) fn set_override_script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(set_override_source()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_is_one_text_with_every_algorithm() {
        let s = source();
        for a in Algorithm::ALL {
            let name = format!("ALG_{}", a.as_str().to_ascii_uppercase());
            assert!(
                registration(a).lua.contains(&format!("ALG[{name}] =")),
                "{a:?}'s Lua file must fill ALG[{name}]"
            );
            assert!(
                lua_constants::table()
                    .contains(&format!("local {name} = {}\n", registration(a).script_id)),
                "{a:?}'s id"
            );
            let filled = format!("ALG[{}] = function()", registration(a).script_id);
            assert_eq!(s.matches(&filled).count(), 1, "{a:?} missing");
        }
        assert!(TTL_GRID_MS <= TTL_MARGIN_MS && TTL_GRID_MS.is_power_of_two());
        assert!(s.trim_end().ends_with("return table.concat(replies)"));
    }
}
