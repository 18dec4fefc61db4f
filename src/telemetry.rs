//! Metrics through the `metrics` facade (feature `metrics`); no-ops without it.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `tollgate_decisions_total` | counter | `outcome` (`decided`, `fail_open`, `fail_closed`, `fallback`, `cached_deny`), `allowed` (`true`/`false`), `store` |
//! | `tollgate_degraded_total` | counter | `outcome` (`fail_open`, `fail_closed`, `fallback`, `cached_deny`) |
//! | `tollgate_store_errors_total` | counter | `kind` (`connection`, `timeout`, `backend`, `protocol`, `circuit_open`, `capacity`) |
//! | `tollgate_store_latency_seconds` | histogram | `store` |
//! | `tollgate_breaker_transitions_total` | counter | `state` (`open`, `half_open`, `closed`) |
//! | `tollgate_memory_evictions_total` | counter | — (live entries a full memory store evicted to admit a new key) |
//! | `tollgate_memory_evicted_usage_ratio` | histogram | — (the share of its limit each evicted entry had used) |
//! | `tollgate_fallback_overadmitted_total` | counter | — (requests the local fallback admitted that the store, answering late, refused) |

#[cfg(feature = "metrics")]
use crate::decision::Outcome;
#[cfg(feature = "metrics")]
use crate::error::StoreError;

#[cfg(feature = "metrics")]
fn error_kind(e: &StoreError) -> &'static str {
    match e {
        StoreError::Connection(_) => "connection",
        StoreError::Timeout => "timeout",
        StoreError::Backend(_) => "backend",
        StoreError::Protocol(_) => "protocol",
        StoreError::CircuitOpen => "circuit_open",
        StoreError::Capacity => "capacity",
    }
}

#[cfg(feature = "metrics")]
pub(crate) fn decision(outcome: Outcome, allowed: bool, store: &'static str) {
    metrics::counter!(
        "tollgate_decisions_total",
        "outcome" => outcome.as_str(),
        "allowed" => if allowed { "true" } else { "false" },
        "store" => store
    )
    .increment(1);
}

#[cfg(feature = "metrics")]
pub(crate) fn outcome(outcome: Outcome) {
    metrics::counter!("tollgate_degraded_total", "outcome" => outcome.as_str()).increment(1);
}

#[cfg(feature = "metrics")]
pub(crate) fn store_error(error: &StoreError) {
    metrics::counter!("tollgate_store_errors_total", "kind" => error_kind(error)).increment(1);
}

#[cfg(feature = "metrics")]
pub(crate) fn store_latency(store: &'static str, elapsed: std::time::Duration) {
    metrics::histogram!("tollgate_store_latency_seconds", "store" => store)
        .record(elapsed.as_secs_f64());
}

#[cfg(feature = "metrics")]
pub(crate) fn breaker(state: &'static str) {
    metrics::counter!("tollgate_breaker_transitions_total", "state" => state).increment(1);
}

#[cfg(feature = "metrics")]
pub(crate) fn memory_eviction(usage: f64) {
    metrics::counter!("tollgate_memory_evictions_total").increment(1);
    metrics::histogram!("tollgate_memory_evicted_usage_ratio").record(usage);
}

#[cfg(feature = "metrics")]
pub(crate) fn fallback_overadmitted() {
    metrics::counter!("tollgate_fallback_overadmitted_total").increment(1);
}

#[cfg(not(feature = "metrics"))]
mod noop {
    use crate::decision::Outcome;
    use crate::error::StoreError;

    #[inline(always)]
    pub(crate) fn decision(_: Outcome, _: bool, _: &'static str) {}
    #[inline(always)]
    pub(crate) fn outcome(_: Outcome) {}
    #[inline(always)]
    pub(crate) fn store_error(_: &StoreError) {}
    #[inline(always)]
    pub(crate) fn store_latency(_: &'static str, _: std::time::Duration) {}
    #[inline(always)]
    pub(crate) fn breaker(_: &'static str) {}
    #[inline(always)]
    pub(crate) fn memory_eviction(_: f64) {}
    #[inline(always)]
    pub(crate) fn fallback_overadmitted() {}
}

#[cfg(not(feature = "metrics"))]
pub(crate) use noop::*;
