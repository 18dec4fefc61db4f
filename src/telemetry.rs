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
        return;
    }
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
    use std::sync::{Arc, Once};

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
                "tollgate_lease_units_total",
                "Units of leased quota blocks, by event: granted, returned unused, dropped unused (under-admission until their window or refill frees them)."
            );
        });
    }

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

    pub(crate) fn decision(
        decision: &Decision,
        store: &'static str,
        policies: &[Policy],
        route: &Arc<str>,
    ) {
        describe();
        let policy: metrics::SharedString = match policies.get(decision.governing_index()) {
            Some(p) => Arc::clone(p.shared_name()).into(),
            None => metrics::SharedString::const_str(""),
        };
        metrics::counter!(
            "tollgate_decisions_total",
            "outcome" => decision.decided_by().as_str(),
            "allowed" => if decision.is_allowed() { "true" } else { "false" },
            "store" => store,
            "policy" => policy,
            "route" => Arc::clone(route)
        )
        .increment(1);
    }

    /// A refusal of `kind` ([`RefusalKind::as_str`](crate::RefusalKind::as_str)).
    pub(crate) fn refusal(kind: &'static str) {
        describe();
        metrics::counter!("tollgate_refusals_total", "kind" => kind).increment(1);
    }

    pub(crate) fn outcome(outcome: DecidedBy) {
        describe();
        metrics::counter!("tollgate_degraded_total", "outcome" => outcome.as_str()).increment(1);
    }

    pub(crate) fn store_error(error: &StoreError) {
        describe();
        metrics::counter!("tollgate_store_errors_total", "kind" => error_kind(error)).increment(1);
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

    pub(crate) fn plan_reload(ok: bool) {
        describe();
        let result = if ok { "ok" } else { "refused" };
        metrics::counter!("tollgate_plan_reloads_total", "result" => result).increment(1);
    }
}

#[cfg(not(feature = "metrics"))]
mod counting {
    use std::sync::Arc;

    use crate::decision::{DecidedBy, Decision};
    use crate::error::StoreError;
    use crate::policy::Policy;

    #[inline(always)]
    pub(crate) fn decision(_: &Decision, _: &'static str, _: &[Policy], _: &Arc<str>) {}
    #[inline(always)]
    pub(crate) fn refusal(_: &'static str) {}
    #[inline(always)]
    pub(crate) fn outcome(_: DecidedBy) {}
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
    #[inline(always)]
    pub(crate) fn lease_units(_: &'static str, _: u64) {}
}

pub(crate) use counting::*;
