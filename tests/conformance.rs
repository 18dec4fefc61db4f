//! The conformance matrix: random traces of every store operation, run through every store
//! and a reference model written from the algorithms' pure functions, in lockstep on one
//! manual clock. Every store must answer as the model does (or, for the deny cache and the
//! leased stores, within the bound their modules state).
//!
//! | row | compared |
//! |---|---|
//! | `memory`, `dyn(memory)` | equal |
//! | `resilient(memory)+deny-cache` | equal, and a cached denial is one the model gives, its `retry_after` no longer |
//! | `leased(memory-ledger)` | zero over-admission: every admitted request is one the exact model admits; requests of non-leasable policies equal |
//! | `leased(redis)` | the same, but while its ledger reads Redis's real clock (NEW-13 in [`KNOWN`]) its admissions of leasable policies are counted, not judged |
//! | `redis` (lone calls: `single.lua`'s fast path where it applies) | equal |
//! | `redis-batched` (every call coalesced: `decide.lua` only) | equal |
//! | `resilient(redis)`, `redis-cluster`, `redis-sentinel` (the master three sentinels name) | equal |
//! | `leased(region(redis) ← home(redis))` | zero over-admission, as `leased(memory-ledger)` |
//!
//! The Redis stores are given the test's clock, so their scripts decide at the time they are
//! passed instead of reading `TIME`: no tolerance for a real clock is needed in the
//! answers. Two things still run on Redis's real clock. Override TTLs are made to end
//! between the two steps where the model sees them end (see the support module). A state
//! key's TTL is the state's remaining life on the manual clock plus at least 488 ms of real
//! time, so a case that fails after running [`REAL_TIME_MARGIN`] or more is run once more
//! on fresh keys (and counted as `rerun[..]`).
//!
//! Both Lua entry points are checked to have been taken: Redis logs every command with its
//! arguments (`SLOWLOG`, threshold 0), and each `EVALSHA` of the decision script is
//! classified by `single.lua`'s own entry conditions (two keys, one 61-byte argument, mode
//! charge or peek, algorithm 1, 3, 4 or 5). The lone row must reach the fast path for each
//! of those four algorithms and `decide.lua` for all six; the batched row must reach
//! `decide.lua` for all six and never the fast path.
//!
//! Cases: `TOLLGATE_CONFORMANCE_CASES` per row (default 300, spread over the six algorithms
//! as the plan's first policy), traces of up to `TOLLGATE_CONFORMANCE_STEPS` steps (default
//! 40). A long run, in the test profile (overflow checks on, so an overflow fails a case
//! instead of wrapping):
//!
//! ```text
//! TOLLGATE_CONFORMANCE_CASES=10000 cargo test --all-features --test conformance -- --nocapture
//! ```
//!
//! Known discrepancies, fixed elsewhere, are listed in [`KNOWN`]: the calls they concern are
//! skipped (or their difference tolerated) in the rows they affect, and counted. Before
//! removing an entry whose fix landed, `TOLLGATE_CONFORMANCE_UNSKIP="item 10"` (ids,
//! comma-separated) runs the matrix without it.

#[path = "support/conformance.rs"]
mod matrix;
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use matrix::{Call, Case, Ctx, Known, Mode, RowSpec, Tally};
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use support::{RedisCluster, RedisServer};
use tollgate::clock::ManualClock;
use tollgate::store::leased::{LeasedStore, MemoryLedger};
use tollgate::store::{
    DynStore, FailureMode, MemoryStore, RedisClusterStore, RedisStore, ResilientStore, Store,
};
use tollgate::{Algorithm, Decision, Policy};

// ---------------------------------------------------------------------------------------
// Known discrepancies (issue 30). Each entry names its item; remove it when the fix lands.
// ---------------------------------------------------------------------------------------

fn all_rows(_: &RowSpec) -> bool {
    true
}
fn redis_rows(r: &RowSpec) -> bool {
    r.redis
}
fn leased_rows(r: &RowSpec) -> bool {
    r.mode == Mode::Leased
}
fn deny_cache_rows(r: &RowSpec) -> bool {
    r.mode == Mode::DenyCache
}

/// The limit in force for `p` on the call's key.
fn limit_in_force(ctx: &Ctx<'_>, p: &Policy) -> u64 {
    ctx.model
        .override_of(ctx.call.key().unwrap_or(0), p, ctx.now)
        .map_or(p.limit(), |(limit, _)| limit)
}

/// Item 5, as fixed: a leased store follows a new, changed or removed override of a
/// leasable policy within one lease time (its stated bound: blocks granted under the old
/// limit may be spent until then), while the model applies it at once. Override calls on
/// leased rows are skipped, since the bound row judges every admission at once.
fn override_a_leased_store_refuses(ctx: &Ctx<'_>) -> bool {
    match ctx.call {
        Call::SetOverride { plan, .. } | Call::RemoveOverride { plan, .. } => {
            !ctx.row.redis || tollgate::store::leased::leasable(plan).is_ok()
        }
        _ => false,
    }
}

/// Item 12 (GCRA): a GCRA state keeps its TAT's fraction in `1/N` ms of the `N` it was
/// written under; read under another limit (an override, or a reload), a fraction of `N`
/// or more no longer fits, and `retry_after` is longer than the time the request really
/// waits (both stores: the model, which is their arithmetic, does the same).
fn gcra_state_written_under_another_limit(ctx: &Ctx<'_>) -> bool {
    let Some(key) = ctx.call.key() else {
        return false;
    };
    ctx.call.policies().iter().any(|p| {
        p.algorithm() == Algorithm::Gcra
            && ctx
                .model
                .written_under(key, p)
                .is_some_and(|l| l.limit() != limit_in_force(ctx, p))
    })
}

/// NEW-4: a leased store keeps a GCRA policy's state in its lease ledger while the policy
/// is leasable, and in the wrapped store once it shapes (`max_delay`): a reload that adds
/// or removes shaping starts the key afresh, and the units charged before it no longer
/// count (the store admits what the exact model refuses).
fn gcra_that_changed_sides_in_a_leased_store(ctx: &Ctx<'_>) -> bool {
    let Some(key) = ctx.call.key() else {
        return false;
    };
    ctx.call.policies().iter().any(|p| {
        p.algorithm() == Algorithm::Gcra
            && ctx
                .model
                .written_under(key, p)
                .is_some_and(|l| (l.max_delay_millis() > 0) != p.max_delay().is_some())
    })
}

/// NEW-5: the deny cache keys a denial by key, policy names and costs, and drops it on a
/// refund, settlement, release, reset or override set through it, but not when the store
/// would allow sooner for another reason: a reload that raises a limit or shortens a
/// window, or an override that ends by its TTL. Until the denial's own end (at most
/// `deny_cache_max_age`) it refuses what the store would admit.
fn cached_denial_after_a_reload_or_an_override_end(
    ctx: &Ctx<'_>,
    _model: &Decision,
    store: &Decision,
) -> bool {
    let Some(key) = ctx.call.key() else {
        return false;
    };
    store.decided_by() == tollgate::DecidedBy::CachedDeny
        && ctx.call.policies().iter().any(|p| {
            ctx.reloaded.iter().any(|(r, _)| r == p.name())
                || ctx.model.override_ended(key, p, ctx.now)
        })
}

/// NEW-6: after a reload, a leased store spends the blocks it was granted under the plan
/// before (until they end: one lease time; its decisions still report the old limit), and
/// the ledger reads a state written under the old limits with the new ones (a GCRA policy
/// is leased as a token bucket, whose deficit a reload reads differently; a window state
/// under a changed window): it can admit what the exact model under the new plan refuses.
fn leasable_policy_after_a_reload(ctx: &Ctx<'_>) -> bool {
    let Some(key) = ctx.call.key() else {
        return false;
    };
    ctx.call.policies().iter().any(|p| {
        let blocks = ctx
            .reloaded
            .iter()
            .any(|(r, at)| r == p.name() && ctx.now < at + LEASE_MS);
        // A ledger state written under other limits (a reload changed them) is read under
        // the new ones: for GCRA (leased as a bucket) and, once the window changed, for the
        // windows too (the 10 000-case run found a counter charged under a day's window
        // read as fresh under a 10 s one).
        let stale = ctx.model.written_under(key, p).is_some_and(|l| {
            l.limit() != p.limit()
                || l.window_millis() != p.window_millis()
                || l.capacity() != p.capacity()
        });
        tollgate::store::leased::leasable(p).is_ok() && (blocks || stale)
    })
}

/// The lease time of the leased rows.
const LEASE_MS: u64 = 1_000;

/// NEW-7: a leased store settles an extra charge on the ledger (`Mode::Force`) and leaves
/// the block it holds alone: the ledger's count already includes the block's unspent units,
/// so the key is served those units *and* the extra (and the bucket's overcharge, capped at
/// `2C − 1` against that count, forgives part of the extra). Until the block ends (one lease
/// time) and the state the settlement left stops mattering, the store admits up to a block
/// more than the exact model.
fn admitted_from_a_block_after_an_overcharge(
    ctx: &Ctx<'_>,
    _model: &Decision,
    store: &Decision,
) -> bool {
    let Call::Check { key, policies, .. } = ctx.call else {
        return false;
    };
    store.is_allowed()
        && policies.iter().any(|p| {
            ctx.overcharged.iter().any(|(k, n, at, until)| {
                k == key && n == p.name() && ctx.now < (at + LEASE_MS).max(*until)
            })
        })
}

/// NEW-9: GCRA keeps its debt as a TAT; `backlog` multiplies the time to it by the limit
/// unchecked. A state charged far ahead under a low limit (an override of 1, and an
/// overcharge) and read under a high one (the override removed or ended, a reload)
/// overflows: a panic with overflow checks on, a wrapped backlog (a free pass) without.
fn gcra_backlog_past_u64(ctx: &Ctx<'_>) -> bool {
    let Some(key) = ctx.call.key() else {
        return false;
    };
    ctx.call
        .policies()
        .iter()
        .any(|p| ctx.model.gcra_backlog_past_u64(key, p, ctx.now))
}

/// DOC-1: a store forgets a state when it stops mattering under the limits it was written
/// with, and a log's entries when they leave the window in force when it reads them; a
/// reload that lengthens a sliding window log's window (or lowers a token bucket's limit)
/// makes them matter again, or longer. The reload docs say so of Redis for the log ("Redis
/// may already have expired those older than the old window"), and `TTL_MARGIN_MS` of both
/// stores for the bucket; the memory store does the same to a log (a commit's pruning).
/// The memory rows never sweep within a case ([`memory_store`]), so they forget nothing
/// else.
fn state_dropped_under_earlier_limits(ctx: &Ctx<'_>) -> bool {
    let Some(key) = ctx.call.key() else {
        return false;
    };
    ctx.call.policies().iter().any(|p| {
        ctx.model
            .log_entry_dropped_under_a_shorter_window(key, p, ctx.now)
    })
}

/// NEW-14: a token bucket that has been under a per-key override (set, changed, removed or
/// expired during the case). The stores bring a bucket up to date at the rate in force when
/// an override is set or removed, and so does the model, yet once a reload has changed the
/// window too, or an override ended, their answers still part (times by 1 ms to seconds, and
/// in shrunk cases whether a request fits). Skipped until the cause is found.
fn bucket_after_an_override(ctx: &Ctx<'_>) -> bool {
    let key = ctx.call.key().unwrap_or(0);
    ctx.call
        .policies()
        .iter()
        .any(|p| p.algorithm() == Algorithm::TokenBucket && ctx.model.ever_overridden(key, p))
}

/// NEW-15: a sliding window counter in debt (a settlement far above its reservation) on
/// Redis: once a window boundary passes (or an override changes the rate the debt is paid
/// at), the Lua counter's times can be up to a few windows apart from the Rust algorithm's
/// on a debt. Whether the request is allowed must still agree; only times of a policy owing
/// more than a window are tolerated, within [`apart`].
fn counter_debt_times(ctx: &Ctx<'_>, model: &Decision, store: &Decision) -> bool {
    model.is_allowed() == store.is_allowed()
        && model.policies().len() == store.policies().len()
        && ctx
            .call
            .policies()
            .iter()
            .zip(model.policies().iter().zip(store.policies()))
            .all(|(p, (m, s))| {
                m == s
                    || (p.algorithm() == Algorithm::SlidingWindowCounter
                        && m.is_allowed() == s.is_allowed()
                        && m.remaining() == s.remaining()
                        && m.reset_after_millis() > p.window_millis()
                        && m.reset_after_millis().abs_diff(s.reset_after_millis())
                            <= apart(p, m.reset_after_millis())
                        && m.retry_after_millis().abs_diff(s.retry_after_millis())
                            <= apart(p, m.reset_after_millis()))
            })
}

/// How far apart NEW-15 lets a counter's times be: three windows, or a ten-thousandth of a
/// debt that long (the 10 000-case run saw four windows on a debt of 2·10^8 ms).
fn apart(p: &Policy, reset_after: u64) -> u64 {
    (3 * p.window_millis()).max(reset_after / 10_000)
}

/// The known discrepancies: the calls each one concerns are skipped in the rows it names.
static KNOWN: &[Known] = &[
    Known {
        id: "item 5",
        about: "leased: an override is followed within one lease time, the model at once",
        rows: leased_rows,
        skip: Some(override_a_leased_store_refuses),
        tolerate: None,
        unchecked: None,
    },
    Known {
        id: "item 12",
        about: "gcra: retry_after too long for a state written under another limit",
        rows: all_rows,
        skip: None,
        tolerate: None,
        unchecked: Some(gcra_state_written_under_another_limit),
    },
    Known {
        id: "NEW-4",
        about: "leased: a reload that toggles a GCRA policy's shaping starts the key afresh",
        rows: leased_rows,
        skip: Some(gcra_that_changed_sides_in_a_leased_store),
        tolerate: None,
        unchecked: None,
    },
    Known {
        id: "NEW-5",
        about: "deny cache: a denial outlives a reload or an override's end (up to its max age)",
        rows: deny_cache_rows,
        skip: None,
        tolerate: Some(cached_denial_after_a_reload_or_an_override_end),
        unchecked: None,
    },
    Known {
        id: "NEW-6",
        about: "leased: blocks and ledger states outlive a reload of a leasable policy",
        rows: leased_rows,
        skip: Some(leasable_policy_after_a_reload),
        tolerate: None,
        unchecked: None,
    },
    Known {
        id: "NEW-7",
        about: "leased: a settlement's extra charge leaves the unspent block spendable",
        rows: leased_rows,
        skip: None,
        tolerate: Some(admitted_from_a_block_after_an_overcharge),
        unchecked: None,
    },
    Known {
        id: "NEW-9",
        about: "gcra: the backlog of a state read under a higher limit overflows",
        rows: all_rows,
        skip: Some(gcra_backlog_past_u64),
        tolerate: None,
        unchecked: None,
    },
    Known {
        id: "NEW-14",
        about: "a token bucket once overridden: the model and the stores part",
        rows: all_rows,
        skip: Some(bucket_after_an_override),
        tolerate: None,
        unchecked: None,
    },
    Known {
        id: "NEW-15",
        about: "redis: a counter's debt, times a few windows apart",
        rows: redis_rows,
        skip: None,
        tolerate: Some(counter_debt_times),
        unchecked: None,
    },
    Known {
        id: "DOC-1",
        about: "a reload lengthening a log's window: entries dropped under the old one (docs)",
        rows: all_rows,
        skip: Some(state_dropped_under_earlier_limits),
        tolerate: None,
        unchecked: None,
    },
];

// ---------------------------------------------------------------------------------------
// Rows
// ---------------------------------------------------------------------------------------

const fn row(name: &'static str, mode: Mode, redis: bool) -> RowSpec {
    RowSpec {
        name,
        mode,
        slot_leases: redis,
        anonymous_slots: !redis,
        batched: false,
        redis_overrides: redis,
        redis,
    }
}

const MEMORY: RowSpec = row("memory", Mode::Exact, false);
const DYN: RowSpec = row("dyn(memory)", Mode::Exact, false);
const DENY_CACHE: RowSpec = row("resilient(memory)+deny-cache", Mode::DenyCache, false);
const LEASED_MEMORY: RowSpec = row("leased(memory-ledger)", Mode::Leased, false);
const REDIS: RowSpec = row("redis", Mode::Exact, true);
const REDIS_BATCHED: RowSpec = RowSpec {
    batched: true,
    ..row("redis-batched", Mode::Exact, true)
};
const RESILIENT_REDIS: RowSpec = row("resilient(redis)", Mode::Exact, true);
const LEASED_REDIS: RowSpec = row("leased(redis)", Mode::Leased, true);
const CLUSTER: RowSpec = row("redis-cluster", Mode::Exact, true);
#[cfg(feature = "sentinel")]
const SENTINEL: RowSpec = row("redis-sentinel", Mode::Exact, true);
#[cfg(feature = "regions")]
const LEASED_REGION: RowSpec = row("leased(region(redis) ← home(redis))", Mode::Leased, true);

// ---------------------------------------------------------------------------------------
// Running cases
// ---------------------------------------------------------------------------------------

fn env_number(name: &str, default: u32) -> u32 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Cases per row (over all six algorithms) and the longest trace.
fn budget() -> (u32, usize) {
    (
        env_number("TOLLGATE_CONFORMANCE_CASES", 300).max(6),
        env_number("TOLLGATE_CONFORMANCE_STEPS", 40).max(1) as usize,
    )
}

/// Per row: cases run and the time they took.
#[derive(Default)]
struct Timing(std::sync::Mutex<BTreeMap<&'static str, (u64, Duration)>>);

impl Timing {
    fn add(&self, row: &'static str, took: Duration) {
        let mut t = self.0.lock().unwrap();
        let e = t.entry(row).or_default();
        e.0 += 1;
        e.1 += took;
    }

    fn report(&self, test: &str, tally: &Tally) {
        let t = self.0.lock().unwrap();
        for (row, (cases, took)) in t.iter() {
            eprintln!("conformance {test}: row {row}: {cases} case runs in {took:.2?}");
        }
        eprintln!("conformance {test}: {}", tally.report());
        for k in KNOWN {
            let [skipped, tolerated, unchecked] =
                ["skipped", "tolerated", "unchecked"].map(|w| tally.get(&format!("{w}[{}]", k.id)));
            if skipped + tolerated + unchecked > 0 {
                eprintln!(
                    "conformance {test}: {} ({}): {skipped} calls skipped, {tolerated} differences tolerated, {unchecked} retry contracts not asserted",
                    k.id, k.about
                );
            }
        }
    }
}

/// Panics inside the crate (a store's or an algorithm's) are caught by the harness and
/// reported with the step that raised them; printing each one while a failure shrinks
/// would bury the report.
fn quiet_crate_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !info
                .location()
                .is_some_and(|l| l.file().starts_with("src/"))
            {
                default(info);
            }
        }));
    });
}

/// Runs every case of the budget (one sixth with each algorithm as the plan's first policy)
/// through `each`, shrinking a failure to a minimal trace.
fn for_cases(test: &str, each: impl Fn(&Case) -> Result<(), TestCaseError>) {
    quiet_crate_panics();
    let (cases, steps) = budget();
    let per_algorithm = cases.div_ceil(6);
    for a in Algorithm::ALL {
        let mut runner = TestRunner::new(Config {
            cases: per_algorithm,
            max_shrink_iters: 2_000,
            failure_persistence: None,
            ..Config::default()
        });
        let result = runner.run(&matrix::cases(a, steps), |case| each(&case));
        if let Err(e) = result {
            panic!(
                "conformance {test} ({a:?} first): {}",
                e.to_string().chars().take(12_000).collect::<String>()
            );
        }
    }
}

/// The known discrepancies in force: [`KNOWN`] but the entries named (comma-separated ids)
/// in `TOLLGATE_CONFORMANCE_UNSKIP`, to see what an entry hides before removing it.
fn known() -> Vec<Known> {
    let unskip = std::env::var("TOLLGATE_CONFORMANCE_UNSKIP").unwrap_or_default();
    let unskip: Vec<&str> = unskip.split(',').map(str::trim).collect();
    KNOWN
        .iter()
        .filter(|k| !unskip.contains(&k.id))
        .copied()
        .collect()
}

/// Runs `case` through one row, timed.
async fn run_row<S: Store>(
    row: &RowSpec,
    store: &S,
    clock: &ManualClock,
    case: &Case,
    tally: &Tally,
    timing: &Timing,
) -> Result<(), TestCaseError> {
    let started = Instant::now();
    let mut result = matrix::run(row, store, clock, case, &known(), tally, "").await;
    timing.add(row.name, started.elapsed());
    if result.is_err() && row.redis && started.elapsed() >= REAL_TIME_MARGIN {
        // Redis may have expired a key by its real-time TTL: run the case again, on keys
        // of its own.
        tally.bump(format!("rerun[{}]", row.name));
        result = matrix::run(row, store, clock, case, &known(), tally, "-again").await;
    }
    result
}

/// How long a case may run in real time before a Redis key it wrote may expire while its
/// state still matters on the manual clock: a state key's TTL is its state's remaining
/// life plus at least `TTL_MARGIN_MS − TTL_GRID_MS` (488 ms) of real time. A case that
/// fails after running this long is run once more.
const REAL_TIME_MARGIN: Duration = Duration::from_millis(400);

fn unique(tag: &str) -> String {
    support::scenarios::unique_prefix(tag)
}

// ---------------------------------------------------------------------------------------
// Which Lua entry point a call took
// ---------------------------------------------------------------------------------------

/// `EVALSHA` calls of the decision script seen in Redis's command log, per algorithm id
/// (1 to 6): by `single.lua`'s fast path, or by `decide.lua`.
#[derive(Debug, Default, Clone, Copy)]
struct Paths {
    fast: [u64; 7],
    general: [u64; 7],
}

impl Paths {
    fn plus(mut self, other: Paths) -> Paths {
        for i in 0..7 {
            self.fast[i] += other.fast[i];
            self.general[i] += other.general[i];
        }
        self
    }
}

/// Has `server` log every command with its arguments.
fn log_every_command(server: &RedisServer) {
    let _: () = server
        .query(&["CONFIG", "SET", "slowlog-log-slower-than", "0"])
        .unwrap();
    let _: () = server
        .query(&["CONFIG", "SET", "slowlog-max-len", "100000"])
        .unwrap();
    let _: () = server.query(&["SLOWLOG", "RESET"]).unwrap();
}

/// The algorithm id of the 40-byte policy parameters at `at` in `bytes`, if complete there.
fn algorithm_at(bytes: &[u8], at: usize) -> Option<usize> {
    let id = f64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?);
    (1.0..=6.0)
        .contains(&id)
        .then_some(id as usize)
        .filter(|_| bytes.len() >= at + 40)
}

/// Reads and clears `server`'s command log: the decision script's calls, classified.
fn take_paths(server: &RedisServer) -> Paths {
    let sha = redis::Script::new(tollgate::store::redis::script_source())
        .get_hash()
        .to_owned();
    let log: redis::Value = server.query(&["SLOWLOG", "GET", "-1"]).unwrap();
    let _: () = server.query(&["SLOWLOG", "RESET"]).unwrap();
    let mut paths = Paths::default();
    let redis::Value::Array(entries) = log else {
        panic!("SLOWLOG GET answered {log:?}");
    };
    for entry in entries {
        let redis::Value::Array(fields) = entry else {
            continue;
        };
        let Some(redis::Value::Array(args)) = fields.get(3) else {
            continue;
        };
        let args: Vec<Vec<u8>> = args
            .iter()
            .map(|a| match a {
                redis::Value::BulkString(b) => b.clone(),
                redis::Value::SimpleString(s) => s.clone().into_bytes(),
                _ => Vec::new(),
            })
            .collect();
        if args.len() < 3 || !args[0].eq_ignore_ascii_case(b"evalsha") || args[1] != sha.as_bytes()
        {
            continue;
        }
        let Some(numkeys) = std::str::from_utf8(&args[2])
            .ok()
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        let argv = args.get(3 + numkeys..).unwrap_or(&[]);
        // single.lua: two keys, ARGV = [now, 61 bytes]: one policy (5 f64), its state's
        // policy (u32 1), one request (mode u8, m u32 1, state u32 1, cost f64).
        if numkeys == 2 && argv.len() == 2 && argv[1].len() == 61 {
            let one = &argv[1];
            let u32_at = |i: usize| u32::from_le_bytes(one[i..i + 4].try_into().unwrap());
            let mode = one[44];
            if let Some(id) = algorithm_at(one, 0) {
                let fast = matches!(id, 1 | 3 | 4 | 5)
                    && u32_at(40) == 1
                    && mode <= 1
                    && u32_at(45) == 1
                    && u32_at(49) == 1;
                if fast {
                    paths.fast[id] += 1;
                } else {
                    paths.general[id] += 1;
                }
                continue;
            }
        }
        // decide.lua: the policies' parameters open ARGV[2] (the log keeps 128 bytes of an
        // argument: the first three policies).
        if let Some(params) = argv.get(1) {
            let mut at = 0;
            while let Some(id) = algorithm_at(params, at) {
                paths.general[id] += 1;
                at += 40;
                if argv.len() == 2 {
                    break; // joined: one policy, then the states and requests
                }
            }
        }
    }
    paths
}

// ---------------------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------------------

/// A memory store on the case's clock that never sweeps within a case: when a sweep
/// reaches an entry depends on the shard its key falls in, random per store, so a state
/// kept past its expiry (one written under an override that has since ended, under a
/// reload's earlier limits) would be forgotten in some runs and not in others. The
/// sweeper's own rules are the memory store's tests'.
fn memory_store(clock: &ManualClock) -> MemoryStore {
    MemoryStore::builder()
        .clock(clock.clone())
        .background_sweep(false)
        .sweep_interval(Duration::from_secs(100 * 365 * 86_400))
        .build()
        .unwrap()
}

/// The in-process rows: the memory store, behind `DynStore`, behind a `ResilientStore`
/// with a deny cache, and leased from a memory ledger.
#[test]
fn in_process_stores_answer_as_the_model() {
    let rt = support::runtime();
    let tally = Tally::default();
    let timing = Timing::default();
    let grants = std::cell::Cell::new(0);
    for_cases("in-process", |case| {
        rt.block_on(async {
            let clock = ManualClock::new(case.start);
            let memory = || memory_store(&clock);
            run_row(&MEMORY, &memory(), &clock, case, &tally, &timing).await?;
            run_row(
                &DYN,
                &DynStore::new(memory()),
                &clock,
                case,
                &tally,
                &timing,
            )
            .await?;
            let cached = ResilientStore::builder(memory(), FailureMode::FailClosed)
                .deny_cache(1_000)
                .clock(clock.clone())
                .build()
                .unwrap();
            run_row(&DENY_CACHE, &cached, &clock, case, &tally, &timing).await?;
            let leased = LeasedStore::builder(MemoryLedger::with_clock(clock.clone()))
                .clock(clock.clone())
                .lease_time(Duration::from_millis(LEASE_MS))
                .max_block_fraction(0.5)
                .build()
                .unwrap();
            let result = run_row(&LEASED_MEMORY, &leased, &clock, case, &tally, &timing).await;
            grants.set(grants.get() + leased.stats().grants);
            result
        })
    });
    timing.report("in-process", &tally);
    assert!(grants.get() > 0, "the leased row never leased a block");
    assert!(
        tally.get("cached_denials") > 0,
        "the deny-cache row never answered from its cache"
    );
}

/// The single-node Redis rows: lone calls, coalesced calls, behind a `ResilientStore`.
#[test]
fn redis_stores_answer_as_the_model_on_both_lua_entry_points() {
    let server = RedisServer::start();
    log_every_command(&server);
    let pool = server.pool(8);
    let rt = support::runtime();
    let tally = Tally::default();
    let timing = Timing::default();
    let (lone, batched) = (
        std::cell::Cell::new(Paths::default()),
        std::cell::Cell::new(Paths::default()),
    );
    for_cases("redis", |case| {
        rt.block_on(async {
            let clock = ManualClock::new(case.start);
            let store = |tag: &str| {
                RedisStore::builder()
                    .prefix(unique(tag))
                    .clock(clock.clone())
            };
            let _ = take_paths(&server);
            let result = run_row(
                &REDIS,
                &store("lone").build_with_pool(pool.clone()).unwrap(),
                &clock,
                case,
                &tally,
                &timing,
            )
            .await;
            lone.set(lone.get().plus(take_paths(&server)));
            result?;
            let result = run_row(
                &REDIS_BATCHED,
                &store("batched")
                    .max_in_flight(1)
                    .build_with_pool(pool.clone())
                    .unwrap(),
                &clock,
                case,
                &tally,
                &timing,
            )
            .await;
            batched.set(batched.get().plus(take_paths(&server)));
            result?;
            let resilient = ResilientStore::builder(
                store("resilient").build_with_pool(pool.clone()).unwrap(),
                FailureMode::FailClosed,
            )
            .timeout(Duration::from_secs(10))
            .clock(clock.clone())
            .build()
            .unwrap();
            run_row(&RESILIENT_REDIS, &resilient, &clock, case, &tally, &timing).await
        })
    });
    timing.report("redis", &tally);
    let (lone, batched) = (lone.get(), batched.get());
    eprintln!(
        "conformance redis: lone calls by algorithm id (1..=6): fast {:?}, decide.lua {:?}",
        &lone.fast[1..],
        &lone.general[1..]
    );
    eprintln!(
        "conformance redis: batched calls by algorithm id (1..=6): fast {:?}, decide.lua {:?}",
        &batched.fast[1..],
        &batched.general[1..]
    );
    for id in [1, 3, 4, 5] {
        assert!(
            lone.fast[id] > 0,
            "no lone call of algorithm {id} took single.lua's fast path"
        );
    }
    for id in 1..=6 {
        assert!(
            lone.general[id] > 0,
            "no lone call of algorithm {id} ran decide.lua"
        );
        assert!(
            batched.general[id] > 0,
            "no batched call of algorithm {id} ran decide.lua"
        );
    }
    assert_eq!(
        batched.fast.iter().sum::<u64>(),
        0,
        "a call of the batched row took the fast path"
    );
}

/// Traces the random rows once found a store parting from the model on, run on Redis every
/// time (the rows draw new cases each run).
fn traces_found_before() -> Vec<Case> {
    use matrix::{Actual, Back, Op, Spec, SpecGen, Step, Units};
    let reload = |window| Op::Reload {
        policy: 0,
        spec: SpecGen {
            limit: 1,
            window,
            burst: None,
            max_delay_ms: None,
            huge: false,
            switch_to: None,
        },
    };
    let step = |op| Step { dt: 0, op };
    vec![
        // A refund of nothing moved a counter's debt, kept under a longer window, to a
        // shorter window's index; read under a window between the two, the index lay ahead
        // of the clock and the debt was forgiven.
        Case {
            plan: vec![Spec {
                index: 0,
                algorithm: Algorithm::SlidingWindowCounter,
                limit: 1,
                window_ms: 200,
                burst: None,
                max_delay_ms: None,
            }],
            start: 1_700_000_000_000,
            steps: vec![
                step(reload(15)),
                step(Op::Settle {
                    key: 1,
                    sel: 0,
                    reserved: [Units::Zero; 3],
                    actual: [Actual::Above53, Actual::Zero, Actual::Zero],
                    fallback: false,
                }),
                step(reload(72)),
                step(Op::Refund {
                    key: 1,
                    sel: 0,
                    costs: [Back::Units(Units::Zero); 3],
                    fallback: false,
                }),
                step(reload(49)),
                step(Op::Check {
                    key: 1,
                    sel: 0,
                    costs: [Units::Zero; 3],
                }),
            ],
        },
    ]
}

#[test]
fn redis_answers_as_the_model_on_traces_found_before() {
    let server = RedisServer::start();
    let pool = server.pool(2);
    let rt = support::runtime();
    let (tally, timing) = (Tally::default(), Timing::default());
    for case in traces_found_before() {
        rt.block_on(async {
            let clock = ManualClock::new(case.start);
            let store = RedisStore::builder()
                .prefix(unique("found"))
                .clock(clock.clone())
                .build_with_pool(pool.clone())
                .unwrap();
            run_row(&REDIS, &store, &clock, &case, &tally, &timing).await
        })
        .unwrap_or_else(|e| panic!("{e}\n{case:#?}"));
    }
}

/// A `LeasedStore` leasing from Redis: zero over-admission on the same traces.
#[test]
fn a_store_leased_from_redis_never_admits_more_than_the_model() {
    let server = RedisServer::start();
    let pool = server.pool(8);
    let rt = support::runtime();
    let tally = Tally::default();
    let timing = Timing::default();
    let grants = std::cell::Cell::new(0);
    for_cases("leased-redis", |case| {
        rt.block_on(async {
            let clock = ManualClock::new(case.start);
            let redis = RedisStore::builder()
                .prefix(unique("leased"))
                .clock(clock.clone())
                .build_with_pool(pool.clone())
                .unwrap();
            let leased = LeasedStore::builder(redis)
                .clock(clock.clone())
                .lease_time(Duration::from_millis(LEASE_MS))
                .max_block_fraction(0.5)
                .build()
                .unwrap();
            let result = run_row(&LEASED_REDIS, &leased, &clock, case, &tally, &timing).await;
            grants.set(grants.get() + leased.stats().grants);
            result
        })
    });
    timing.report("leased-redis", &tally);
    assert!(grants.get() > 0, "the leased row never leased a block");
}

/// A `LeasedStore` over a region's `RegionalLedger`, whose deposits come from a home Redis:
/// zero over-admission on the same traces, every operation (what cannot be leased, debts,
/// resets and overrides go to the home).
#[cfg(feature = "regions")]
#[test]
fn a_store_leased_from_a_region_never_admits_more_than_the_model() {
    use tollgate::store::regions::RegionalLedger;
    let (home, region) = (RedisServer::start(), RedisServer::start());
    let (home_pool, region_pool) = (home.pool(8), region.pool(8));
    let rt = support::runtime();
    let tally = Tally::default();
    let timing = Timing::default();
    let deposits = std::cell::Cell::new(0);
    for_cases("leased-region", |case| {
        rt.block_on(async {
            let clock = ManualClock::new(case.start);
            let prefix = unique("region");
            let store = |pool: &deadpool_redis::Pool| {
                RedisStore::builder()
                    .prefix(prefix.clone())
                    .clock(clock.clone())
                    .build_with_pool(pool.clone())
                    .unwrap()
            };
            let ledger = RegionalLedger::builder("r", store(&region_pool), store(&home_pool))
                .build()
                .unwrap();
            let leased = LeasedStore::builder(ledger.clone())
                .clock(clock.clone())
                .lease_time(Duration::from_millis(LEASE_MS))
                .max_block_fraction(0.5)
                .build()
                .unwrap();
            let result = run_row(&LEASED_REGION, &leased, &clock, case, &tally, &timing).await;
            deposits.set(deposits.get() + ledger.stats().deposits);
            result
        })
    });
    timing.report("leased-region", &tally);
    assert!(deposits.get() > 0, "the region never took a deposit");
}

/// The 3-master cluster.
#[test]
fn the_cluster_store_answers_as_the_model() {
    let cluster = RedisCluster::start();
    let pool = deadpool_redis::cluster::Config::from_urls(cluster.urls())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let rt = support::runtime();
    let tally = Tally::default();
    let timing = Timing::default();
    for_cases("cluster", |case| {
        rt.block_on(async {
            let clock = ManualClock::new(case.start);
            let store = RedisClusterStore::builder()
                .prefix(unique("cluster"))
                .clock(clock.clone())
                .build_cluster_with_pool(pool.clone())
                .unwrap();
            run_row(&CLUSTER, &store, &clock, case, &tally, &timing).await
        })
    });
    timing.report("cluster", &tally);
}

/// The Sentinel store, on the master of a master, a replica and three sentinels: the Redis
/// store's script and keys reached through the master Sentinel names.
#[cfg(feature = "sentinel")]
#[test]
fn the_sentinel_store_answers_as_the_model() {
    use support::sentinel::{SentinelSet, MASTER_NAME};
    use tollgate::store::RedisSentinelStore;
    let set = SentinelSet::start();
    let rt = support::runtime();
    let tally = Tally::default();
    let timing = Timing::default();
    for_cases("sentinel", |case| {
        rt.block_on(async {
            let clock = ManualClock::new(case.start);
            let store = RedisSentinelStore::builder()
                .prefix(unique("sentinel"))
                .clock(clock.clone())
                .build_with_sentinel(set.urls(), MASTER_NAME)
                .unwrap();
            run_row(&SENTINEL, &store, &clock, case, &tally, &timing).await
        })
    });
    timing.report("sentinel", &tally);
}
