//! The numbers and codes the Lua scripts share with Rust, generated from the Rust constants
//! that define them.
//!
//! The Lua files name these values (`TTL_MARGIN_MS`, `ALG_GCRA`, `MODE_CHARGE`,
//! `LEDGER_GRANT`, …) and never write them. When a store assembles a script it writes each
//! value in place of its name ([`inline`]), in the code and not in the comments, so the script
//! Redis runs holds the literals: a `local` per constant would cost every call of a script
//! (measured with `benches/scripts/redis_instructions.sh`: a `local` for each of the 32
//! cost a lone decision about 1 700 more instructions of Redis, 2.7 %). The table of names and values is checked in as
//! `lua/constants.lua` ([`table`]: for reading, and for the benchmark scripts, which join and
//! inline the Lua files themselves); a test fails when it differs from what this module
//! generates, another when a Lua file defines one of these names or writes one of their
//! values, and another when an assembled script still names one.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::OnceLock;

use super::request::Mode;
use super::ttl::{TTL_GRID_MS, TTL_MARGIN_MS};
use super::wire::{
    RegionMode, DEPOSIT_BYTES, LONE_REQUEST_BYTES, NO_OVERRIDE_MARK, PARAMS_BYTES,
    REGION_ASK_BYTES, REQUEST_HEAD_BYTES, STATE_BYTES,
};
use crate::algorithm::registration;
use crate::policy::Algorithm;
use crate::store::leased::{Kind, LedgerMode, PART_BYTES};

/// The first argument of a batch of ledger calls (`lua/lease.lua`).
pub(crate) const LEDGER_BATCH: &str = "B";

/// A value as the Lua text writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Value {
    Number(u64),
    Text(&'static str),
}

/// One shared constant: its Lua name, its value, and where Rust defines it.
#[derive(Debug, Clone)]
struct Constant {
    name: String,
    value: Value,
    #[cfg_attr(not(test), allow(dead_code))]
    about: &'static str,
}

fn number(name: &str, value: u64, about: &'static str) -> Constant {
    Constant {
        name: name.to_owned(),
        value: Value::Number(value),
        about,
    }
}

fn text(name: &str, value: &'static str, about: &'static str) -> Constant {
    Constant {
        name: name.to_owned(),
        value: Value::Text(value),
        about,
    }
}

/// The name a mode byte has in the scripts.
fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Peek => "MODE_PEEK",
        Mode::Charge => "MODE_CHARGE",
        Mode::Refund => "MODE_REFUND",
        Mode::Settle => "MODE_SETTLE",
        Mode::Refresh => "MODE_REFRESH",
    }
}

/// The name a ledger kind has in the scripts.
fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Counter => "KIND_COUNTER",
        Kind::Log => "KIND_LOG",
        Kind::Bucket => "KIND_BUCKET",
        Kind::Fixed => "KIND_FIXED",
    }
}

/// The name a ledger call's mode has in the scripts.
fn ledger_mode_name(mode: LedgerMode) -> &'static str {
    match mode {
        LedgerMode::Grant => "LEDGER_GRANT",
        LedgerMode::Peek => "LEDGER_PEEK",
        LedgerMode::Return => "LEDGER_RETURN",
        LedgerMode::Force => "LEDGER_FORCE",
        LedgerMode::Reset => "LEDGER_RESET",
        LedgerMode::Keep => "LEDGER_KEEP",
    }
}

/// The sizes and marks of what a decision call sends and a state holds.
fn request_layout() -> [Constant; 5] {
    [
        number(
            "PARAMS_BYTES",
            PARAMS_BYTES as u64,
            "the bytes of one policy's parameters (store::redis::wire)",
        ),
        number(
            "STATE_BYTES",
            STATE_BYTES as u64,
            "the bytes of one state's policy index (store::redis::wire)",
        ),
        number(
            "REQUEST_HEAD_BYTES",
            REQUEST_HEAD_BYTES as u64,
            "the bytes of a request's mode and policy count (store::redis::wire)",
        ),
        number(
            "LONE_REQUEST_BYTES",
            LONE_REQUEST_BYTES as u64,
            "the bytes of a call of one request of one policy (store::redis::wire)",
        ),
        number(
            "NO_OVERRIDE_MARK",
            u64::from(NO_OVERRIDE_MARK),
            "the last byte of a string state written with no override in force (store::redis::wire)",
        ),
]
}

/// Every constant the scripts share with Rust, in the order the prelude defines them.
fn constants() -> Vec<Constant> {
    let mut all = vec![
        number(
            "TTL_MARGIN_MS",
            TTL_MARGIN_MS,
            "how long a key outlives its state (store::redis::TTL_MARGIN_MS)",
        ),
        number(
            "TTL_GRID_MS",
            TTL_GRID_MS,
            "the grid string states' keys expire on (store::redis::TTL_GRID_MS)",
        ),
        number(
            "IN_FLIGHT_RETRY_AFTER_MS",
            crate::algorithm::in_flight::RETRY_AFTER_MS,
            "an in-flight refusal's retry_after (algorithm::in_flight::RETRY_AFTER_MS)",
        ),
        number(
            "MAX_USAGE_WINDOW_PRODUCT",
            crate::algorithm::MAX_USAGE_WINDOW_PRODUCT,
            "the most usage x window a state holds, debts included (algorithm::MAX_USAGE_WINDOW_PRODUCT)",
        ),
        number(
            "MAX_CAPACITY_WINDOW_PRODUCT",
            crate::policy::MAX_CAPACITY_WINDOW_PRODUCT,
            "the most limit or capacity x window a policy has (policy::MAX_CAPACITY_WINDOW_PRODUCT)",
        ),
    ];
    all.extend(Algorithm::ALL.iter().map(|&a| Constant {
        name: format!("ALG_{}", a.as_str().to_ascii_uppercase()),
        value: Value::Number(u64::from(registration(a).script_id)),
        about: "the algorithms' numbers in ALG (algorithm::registration)",
    }));
    for mode in [
        Mode::Peek,
        Mode::Charge,
        Mode::Refund,
        Mode::Settle,
        Mode::Refresh,
    ] {
        all.push(number(
            mode_name(mode),
            mode as u64,
            "a request's mode byte (store::redis::request::Mode)",
        ));
    }
    all.extend(request_layout());
    for kind in [Kind::Counter, Kind::Log, Kind::Bucket, Kind::Fixed] {
        all.push(number(
            kind_name(kind),
            kind as u64,
            "how a leased policy is kept in the ledger (store::leased::Kind)",
        ));
    }
    all.push(number(
        "LEDGER_PART_BYTES",
        PART_BYTES as u64,
        "the bytes of one policy's part of a ledger call (store::leased::PART_BYTES)",
    ));
    for mode in [
        LedgerMode::Grant,
        LedgerMode::Peek,
        LedgerMode::Return,
        LedgerMode::Force,
        LedgerMode::Reset,
        LedgerMode::Keep,
    ] {
        all.push(text(
            ledger_mode_name(mode),
            mode.code(),
            "a ledger call's mode (store::leased::LedgerMode::code)",
        ));
    }
    all.push(text(
        "LEDGER_BATCH",
        LEDGER_BATCH,
        "the first argument of a batch of ledger calls (store::redis::lua_constants::LEDGER_BATCH)",
    ));
    for mode in RegionMode::ALL {
        all.push(text(
            mode.lua_name(),
            mode.code(),
            "a region script call's mode (store::redis::wire::RegionMode::code)",
        ));
    }
    all.extend([
        number(
            "DEPOSIT_BYTES",
            DEPOSIT_BYTES as u64,
            "the bytes of one deposit (store::redis::wire::DEPOSIT_BYTES)",
        ),
        number(
            "REGION_ASK_BYTES",
            REGION_ASK_BYTES as u64,
            "the bytes of one policy's ask in a take (store::redis::wire::REGION_ASK_BYTES)",
        ),
    ]);
    all
}

/// The text of `lua/constants.lua`: one `local NAME = value` per constant, under a line
/// saying what it is and where Rust defines it.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn table() -> &'static str {
    static TABLE: OnceLock<String> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut out = String::from(
            "-- tollgate: the constants the Lua scripts share with Rust, generated from the Rust\n\
             -- constants by src/store/redis/lua_constants.rs. Do not edit: a test fails when this\n\
             -- file differs from what it generates. The stores write each value in place of its\n\
             -- name when they assemble a script; benches/scripts/inline_constants.py does the same.\n",
        );
        let mut about = "";
        for c in constants() {
            // Writing into a String cannot fail.
            if c.about != about {
                about = c.about;
                let _ = writeln!(out, "-- {about}");
            }
            let _ = writeln!(out, "local {} = {}", c.name, c.value.lua());
        }
        out
    })
}

impl Value {
    /// The value as a Lua literal.
    fn lua(&self) -> String {
        match self {
            Value::Number(n) => n.to_string(),
            Value::Text(t) => format!("'{t}'"),
        }
    }
}

/// `lua` with the value of every shared constant written in place of its name, in the code
/// (not in comments, not in strings).
pub(crate) fn inline(lua: &str) -> String {
    let values: HashMap<String, String> = constants()
        .into_iter()
        .map(|c| (c.name, c.value.lua()))
        .collect();
    let mut out = String::with_capacity(lua.len());
    for line in lua.split_inclusive('\n') {
        let (code, comment) = split_comment(line);
        let mut word = String::new();
        let mut quote = None;
        for c in code.chars() {
            if quote.is_none() && (c.is_ascii_alphanumeric() || c == '_') {
                word.push(c);
                continue;
            }
            out.push_str(values.get(&word).map_or(word.as_str(), String::as_str));
            word.clear();
            match quote {
                Some(q) if q == c => quote = None,
                None if c == '\'' || c == '"' => quote = Some(c),
                _ => {}
            }
            out.push(c);
        }
        out.push_str(values.get(&word).map_or(word.as_str(), String::as_str));
        out.push_str(comment);
    }
    out
}

/// A line's code and its comment (from `--` outside a string to the end).
pub(crate) fn split_comment(line: &str) -> (&str, &str) {
    let mut quote = None;
    let mut prev = None;
    for (i, c) in line.char_indices() {
        match quote {
            Some(q) if q == c => quote = None,
            Some(_) => {}
            None if c == '\'' || c == '"' => quote = Some(c),
            None if c == '-' && prev == Some('-') => return line.split_at(i - 1),
            None => {}
        }
        prev = Some(c);
    }
    (line, "")
}

#[cfg(test)]
mod tests;
