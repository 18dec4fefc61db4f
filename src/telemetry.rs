//! Where decisions are reported: metrics through the `metrics` facade (feature `metrics`;
//! no-ops without it) and fields of the current span. The names, kinds and labels are
//! documented for users in [`crate::observability`]; keep the two in step.

use tracing::Span;

use crate::decision::Decision;

/// The span fields a decision fills.
pub(crate) const KEY: &str = "ratelimit.key";
pub(crate) const POLICY: &str = "ratelimit.policy";
pub(crate) const ALLOWED: &str = "ratelimit.allowed";
pub(crate) const REMAINING: &str = "ratelimit.remaining";
pub(crate) const OUTCOME: &str = "ratelimit.outcome";
pub(crate) const REFUSAL: &str = "ratelimit.refusal";

/// The current span, when there is one being recorded. Costs one atomic load when no
/// subscriber was ever set.
#[inline]
pub(crate) fn current_span() -> Option<Span> {
    if !tracing::dispatcher::has_been_set() {
        return None;
    }
    let span = Span::current();
    (!span.is_disabled()).then_some(span)
}

/// Whether `span` takes the key's digest: it declares `ratelimit.key`, or (feature
/// `opentelemetry`) it may be an OpenTelemetry span. The digest is only computed then.
#[inline]
pub(crate) fn span_takes_key(span: &Span) -> bool {
    cfg!(feature = "opentelemetry") || span.has_field(KEY)
}

/// A field's value, recorded as a `tracing` value or an OpenTelemetry attribute.
#[derive(Clone, Copy)]
enum FieldValue<'a> {
    Str(&'a str),
    Bool(bool),
    U64(u64),
}

/// Records `field` on `span`: as the span's own field when it declares it (an OpenTelemetry
/// layer then turns it into an attribute), else, with feature `opentelemetry`, as an
/// attribute of the span's OpenTelemetry span. Never both, so an attribute appears once.
fn set(span: &Span, field: &'static str, value: FieldValue<'_>) {
    if span.has_field(field) {
        match value {
            FieldValue::Str(v) => span.record(field, v),
            FieldValue::Bool(v) => span.record(field, v),
            FieldValue::U64(v) => span.record(field, v),
        };
    } else {
        #[cfg(feature = "opentelemetry")]
        {
            use tracing_opentelemetry::OpenTelemetrySpanExt;
            let value: opentelemetry::Value = match value {
                FieldValue::Str(v) => v.to_owned().into(),
                FieldValue::Bool(v) => v.into(),
                FieldValue::U64(v) => i64::try_from(v).unwrap_or(i64::MAX).into(),
            };
            span.set_attribute(field, value);
        }
    }
}

/// A decision on `span` (once per request: an allowed one by the limiter, a refusal by
/// [`Refusal::log`](crate::Refusal)): the key's digest and the governing policy when known,
/// allowed, and, when the store decided, remaining and outcome; for a refusal its error
/// code.
pub(crate) fn span_decision(
    span: &Span,
    key: Option<&str>,
    policy: Option<&str>,
    decision: Option<&Decision>,
    refusal: Option<&str>,
) {
    if let Some(key) = key {
        set(span, KEY, FieldValue::Str(key));
    }
    if let Some(policy) = policy {
        set(span, POLICY, FieldValue::Str(policy));
    }
    let allowed = refusal.is_none() && decision.is_some_and(Decision::is_allowed);
    set(span, ALLOWED, FieldValue::Bool(allowed));
    if let Some(decision) = decision {
        set(span, REMAINING, FieldValue::U64(decision.remaining()));
        set(
            span,
            OUTCOME,
            FieldValue::Str(decision.decided_by().as_str()),
        );
    }
    if let Some(code) = refusal {
        set(span, REFUSAL, FieldValue::Str(code));
    }
}

#[cfg(feature = "metrics")]
mod counting {
    use std::sync::{Arc, Once, OnceLock};

    use crate::decision::{DecidedBy, Decision};
    use crate::error::StoreError;
    use crate::policy::Policy;

    /// Describes every metric to the recorder, once (on the first metric recorded), so that
    /// an exposition has help text for each.
    fn describe() {
        static DESCRIBED: Once = Once::new();
        DESCRIBED.call_once(|| {
            use metrics::{describe_counter, describe_histogram, Unit};
            describe_counter!(
                "tollgate_decisions_total",
                "Rate-limit decisions, by outcome, allowed, store, governing policy and route."
            );
            describe_counter!(
                "tollgate_refusals_total",
                "Answers tollgate gave instead of the guarded service, by kind."
            );
            describe_counter!(
                "tollgate_degraded_total",
                "Decisions a failure mode took because the store failed, by outcome."
            );
            describe_counter!(
                "tollgate_store_errors_total",
                "Failed store calls, by kind of error."
            );
            describe_histogram!(
                "tollgate_store_latency_seconds",
                Unit::Seconds,
                "Time of each call to the store a ResilientStore wraps, timeouts included."
            );
            describe_counter!(
                "tollgate_breaker_transitions_total",
                "Circuit breaker transitions, by the state entered."
            );
            describe_counter!(
                "tollgate_memory_evictions_total",
                "Live entries a full memory store evicted to admit a new key."
            );
            describe_histogram!(
                "tollgate_memory_evicted_usage_ratio",
                "The share of its limit each evicted memory-store entry had used."
            );
            describe_counter!(
                "tollgate_plan_reloads_total",
                "Plan reloads, by result (ok, or refused: the plan in force stayed)."
            );
            describe_counter!(
                "tollgate_fallback_overadmitted_total",
                "Requests the local fallback admitted that the store, answering late, refused."
            );
            describe_counter!(
                "tollgate_sentinel_switches_total",
                "Redis master switches a Sentinel store followed (failovers)."
            );
            describe_histogram!(
                "tollgate_sentinel_failover_seconds",
                "For each master switch, how long the Sentinel store had been without a master."
            );
            describe_counter!(
                "tollgate_region_home_calls_total",
                "Calls a region made to the home ledger, by region and call: grant (a deposit), exact (one request), refused, return, error."
            );
            describe_counter!(
                "tollgate_region_units_total",
                "Units flowing between a region and the home ledger, by region and flow: deposited, returned home, dropped (under-admission until their window or refill frees them)."
            );
            describe_counter!(
                "tollgate_lease_units_total",
                "Units of leased quota blocks, by event: granted, returned unused, dropped unused (under-admission until their window or refill frees them)."
            );
        });
    }

    /// The metadata every metric is registered with: what `metrics::counter!` gives in
    /// this module.
    static METADATA: metrics::Metadata<'static> =
        metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

    /// The counter of `key` in the recorder in force (a no-op one when none is installed).
    #[inline]
    fn counter(key: &metrics::Key) -> metrics::Counter {
        metrics::with_recorder(|recorder| recorder.register_counter(key, &METADATA))
    }

    /// How many [`DecidedBy`] outcomes there are: the width of [`DecisionKeys`]' table.
    const OUTCOMES: usize = 5;

    fn outcome_index(outcome: DecidedBy) -> usize {
        match outcome {
            DecidedBy::Decided => 0,
            DecidedBy::FailOpen => 1,
            DecidedBy::FailClosed => 2,
            DecidedBy::Fallback => 3,
            DecidedBy::CachedDeny => 4,
        }
    }

    /// The `tollgate_decisions_total` keys of one policy set: its labels are the set's
    /// route, the store, the governing policy (or none), the outcome and allowed, so each
    /// is built (and hashed) once, on first use, rather than on every decision. A key is
    /// kept with the store name it was built for, and used only for that store.
    pub(crate) struct DecisionKeys {
        keys: Box<[OnceLock<(&'static str, metrics::Key)>]>,
    }

    impl DecisionKeys {
        /// The table for a set of `policies` enforced policies.
        pub(crate) fn new(policies: usize) -> Self {
            let len = (policies + 1) * OUTCOMES * 2;
            Self {
                keys: (0..len).map(|_| OnceLock::new()).collect(),
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn decision_key(
        decision: &Decision,
        store: &'static str,
        policies: &[Policy],
        route: &Arc<str>,
    ) -> metrics::Key {
        let policy: metrics::SharedString = match policies.get(decision.governing_index()) {
            Some(p) => Arc::clone(p.shared_name()).into(),
            None => metrics::SharedString::const_str(""),
        };
        let labels = vec![
            metrics::Label::new("outcome", decision.decided_by().as_str()),
            metrics::Label::new(
                "allowed",
                if decision.is_allowed() {
                    "true"
                } else {
                    "false"
                },
            ),
            metrics::Label::new("store", store),
            metrics::Label::new("policy", policy),
            metrics::Label::new("route", Arc::clone(route)),
        ];
        metrics::Key::from_parts("tollgate_decisions_total", labels)
    }

    pub(crate) fn decision(
        decision: &Decision,
        store: &'static str,
        policies: &[Policy],
        route: &Arc<str>,
        keys: &DecisionKeys,
    ) {
        describe();
        // A governing index past the policies is labelled with no policy: one entry for all.
        let governing = decision.governing_index().min(policies.len());
        let index = (governing * OUTCOMES + outcome_index(decision.decided_by())) * 2
            + usize::from(decision.is_allowed());
        let built = keys
            .keys
            .get(index)
            .map(|slot| {
                slot.get_or_init(|| (store, decision_key(decision, store, policies, route)))
            })
            .filter(|(built_for, _)| std::ptr::eq(*built_for, store) || *built_for == store);
        match built {
            Some((_, key)) => counter(key).increment(1),
            None => counter(&decision_key(decision, store, policies, route)).increment(1),
        }
        // One request (or login attempt) decided by a failure mode: counted here, once, not
        // per store call (a login attempt asks three limits, a shadow policy asks again).
        if matches!(
            decision.decided_by(),
            DecidedBy::FailOpen | DecidedBy::FailClosed | DecidedBy::Fallback
        ) {
            outcome(decision.decided_by());
        }
    }

    /// A refusal of `kind` ([`RefusalKind::as_str`](crate::RefusalKind::as_str)), counted
    /// under a key built at compile time for every kind tollgate has.
    pub(crate) fn refusal(kind: &'static str) {
        describe();
        macro_rules! by_kind {
            ($($kind:literal),* $(,)?) => {
                match kind {
                    $($kind => metrics::counter!("tollgate_refusals_total", "kind" => $kind),)*
                    other => metrics::counter!("tollgate_refusals_total", "kind" => other),
                }
            };
        }
        by_kind!(
            "rate_limited",
            "cost_exceeds_capacity",
            "missing_key",
            "forbidden",
            "store_unavailable",
            "login_refused",
            "login_body_too_large",
            "login_body_unreadable",
            "login_username_ambiguous",
        )
        .increment(1);
    }

    fn outcome(outcome: DecidedBy) {
        describe();
        match outcome {
            DecidedBy::Decided => {
                metrics::counter!("tollgate_degraded_total", "outcome" => "decided")
            }
            DecidedBy::FailOpen => {
                metrics::counter!("tollgate_degraded_total", "outcome" => "fail_open")
            }
            DecidedBy::FailClosed => {
                metrics::counter!("tollgate_degraded_total", "outcome" => "fail_closed")
            }
            DecidedBy::Fallback => {
                metrics::counter!("tollgate_degraded_total", "outcome" => "fallback")
            }
            DecidedBy::CachedDeny => {
                metrics::counter!("tollgate_degraded_total", "outcome" => "cached_deny")
            }
        }
        .increment(1);
    }

    pub(crate) fn store_error(error: &StoreError) {
        describe();
        match error {
            StoreError::Connection(_) => {
                metrics::counter!("tollgate_store_errors_total", "kind" => "connection")
            }
            StoreError::Timeout => {
                metrics::counter!("tollgate_store_errors_total", "kind" => "timeout")
            }
            StoreError::Backend(_) => {
                metrics::counter!("tollgate_store_errors_total", "kind" => "backend")
            }
            StoreError::Protocol(_) => {
                metrics::counter!("tollgate_store_errors_total", "kind" => "protocol")
            }
            StoreError::CircuitOpen => {
                metrics::counter!("tollgate_store_errors_total", "kind" => "circuit_open")
            }
            StoreError::Capacity => {
                metrics::counter!("tollgate_store_errors_total", "kind" => "capacity")
            }
        }
        .increment(1);
    }

    pub(crate) fn store_latency(store: &'static str, elapsed: std::time::Duration) {
        describe();
        metrics::histogram!("tollgate_store_latency_seconds", "store" => store)
            .record(elapsed.as_secs_f64());
    }

    pub(crate) fn breaker(state: &'static str) {
        describe();
        metrics::counter!("tollgate_breaker_transitions_total", "state" => state).increment(1);
    }

    pub(crate) fn memory_eviction(usage: f64) {
        describe();
        metrics::counter!("tollgate_memory_evictions_total").increment(1);
        metrics::histogram!("tollgate_memory_evicted_usage_ratio").record(usage);
    }

    pub(crate) fn fallback_overadmitted() {
        describe();
        metrics::counter!("tollgate_fallback_overadmitted_total").increment(1);
    }

    pub(crate) fn lease_units(event: &'static str, units: u64) {
        describe();
        metrics::counter!("tollgate_lease_units_total", "event" => event).increment(units);
    }

    #[cfg(feature = "regions")]
    pub(crate) fn region_home_call(region: &str, call: &'static str) {
        describe();
        metrics::counter!("tollgate_region_home_calls_total", "region" => region.to_owned(), "call" => call)
            .increment(1);
    }

    #[cfg(feature = "regions")]
    pub(crate) fn region_units(region: &str, flow: &'static str, units: u64) {
        describe();
        metrics::counter!("tollgate_region_units_total", "region" => region.to_owned(), "flow" => flow)
            .increment(units);
    }

    #[cfg(feature = "sentinel")]
    pub(crate) fn sentinel_switch(without_master: std::time::Duration) {
        describe();
        metrics::counter!("tollgate_sentinel_switches_total").increment(1);
        metrics::histogram!("tollgate_sentinel_failover_seconds")
            .record(without_master.as_secs_f64());
    }

    pub(crate) fn plan_reload(ok: bool) {
        describe();
        if ok {
            metrics::counter!("tollgate_plan_reloads_total", "result" => "ok").increment(1);
        } else {
            metrics::counter!("tollgate_plan_reloads_total", "result" => "refused").increment(1);
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod counting {
    use std::sync::Arc;

    use crate::decision::Decision;
    use crate::error::StoreError;
    use crate::policy::Policy;

    /// Nothing to keep without metrics.
    pub(crate) struct DecisionKeys;

    impl DecisionKeys {
        #[inline(always)]
        pub(crate) fn new(_: usize) -> Self {
            DecisionKeys
        }
    }

    #[inline(always)]
    pub(crate) fn decision(
        _: &Decision,
        _: &'static str,
        _: &[Policy],
        _: &Arc<str>,
        _: &DecisionKeys,
    ) {
    }
    #[inline(always)]
    pub(crate) fn refusal(_: &'static str) {}
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
    #[inline(always)]
    pub(crate) fn plan_reload(_: bool) {}
    #[cfg(feature = "sentinel")]
    #[inline(always)]
    pub(crate) fn sentinel_switch(_: std::time::Duration) {}
    #[cfg(feature = "regions")]
    #[inline(always)]
    pub(crate) fn region_home_call(_: &str, _: &'static str) {}
    #[cfg(feature = "regions")]
    #[inline(always)]
    pub(crate) fn region_units(_: &str, _: &'static str, _: u64) {}
    #[inline(always)]
    pub(crate) fn lease_units(_: &'static str, _: u64) {}
}

pub(crate) use counting::*;
