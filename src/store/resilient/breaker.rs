//! The circuit breaker of a [`ResilientStore`](super::ResilientStore): after `threshold`
//! consecutive failures the store is skipped for a cool-down, then one probe decides whether
//! it closes again.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use crate::telemetry;

/// Consecutive-failure circuit breaker; lock-free on the happy path.
pub(super) struct Breaker {
    pub(super) threshold: u32,
    pub(super) cooldown_ms: u64,
    pub(super) failures: AtomicU32,
    /// 0 while closed; otherwise when the cool-down ends.
    pub(super) open_until: AtomicU64,
    pub(super) probing: AtomicBool,
    /// When the current probe started: a probe whose caller went away (its future dropped)
    /// must not hold the breaker open forever.
    pub(super) probe_started: AtomicU64,
}

pub(super) enum Gate {
    Call,
    Probe,
    Skip,
}

impl Breaker {
    pub(super) fn gate(&self, now: u64) -> Gate {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Gate::Call;
        }
        if now < until {
            return Gate::Skip;
        }
        let stale = now
            >= self
                .probe_started
                .load(Ordering::Acquire)
                .saturating_add(self.cooldown_ms.max(1_000));
        if self
            .probing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
            || (stale && self.probing.load(Ordering::Acquire))
        {
            self.probe_started.store(now, Ordering::Release);
            tracing::info!(target: "tollgate::breaker", state = "half_open", "rate-limit store circuit half-open: probing");
            telemetry::breaker("half_open");
            Gate::Probe
        } else {
            Gate::Skip
        }
    }

    /// Whether the circuit is open (or half-open, a probe deciding): a look at the store
    /// goes through only while it is closed, and neither probes nor closes it — a store
    /// that answers looks but fails checks (full, or a read-only replica after a failover)
    /// must still open the circuit.
    pub(super) fn is_open(&self) -> bool {
        self.open_until.load(Ordering::Acquire) != 0
    }

    pub(super) fn success(&self) {
        self.failures.store(0, Ordering::Release);
        if self.open_until.swap(0, Ordering::AcqRel) != 0 {
            self.probing.store(false, Ordering::Release);
            tracing::info!(target: "tollgate::breaker", state = "closed", "rate-limit store circuit closed: store healthy again");
            telemetry::breaker("closed");
        }
    }

    /// A failed call. The circuit opens once the failures reach the threshold: one thread
    /// opens it (a compare-and-swap), so concurrent failures count one opening. A failed probe
    /// keeps it open for another cool-down and is not counted as an opening (the circuit was
    /// never closed): every `open` transition is followed by one `closed`, which the alert
    /// rules' `open - closed` relies on.
    pub(super) fn failure(&self, now: u64, probe: bool) {
        let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        let until = now.saturating_add(self.cooldown_ms).max(1);
        if probe {
            self.open_until.store(until, Ordering::Release);
            self.probing.store(false, Ordering::Release);
            tracing::warn!(target: "tollgate::breaker", state = "open", failures, cooldown_ms = self.cooldown_ms, "rate-limit store probe failed: circuit stays open");
            return;
        }
        if failures >= self.threshold
            && self
                .open_until
                .compare_exchange(0, until, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.probing.store(false, Ordering::Release);
            tracing::warn!(target: "tollgate::breaker", state = "open", failures, cooldown_ms = self.cooldown_ms, "rate-limit store circuit open: skipping the store");
            telemetry::breaker("open");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker() -> Breaker {
        Breaker {
            threshold: 3,
            cooldown_ms: 500,
            failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
            probing: AtomicBool::new(false),
            probe_started: AtomicU64::new(0),
        }
    }

    #[test]
    fn opens_after_n_failures_then_probes_once_and_closes() {
        let b = breaker();
        for _ in 0..2 {
            assert!(matches!(b.gate(1_000), Gate::Call));
            b.failure(1_000, false);
        }
        assert!(matches!(b.gate(1_000), Gate::Call));
        b.failure(1_000, false);
        assert!(matches!(b.gate(1_001), Gate::Skip));
        assert!(matches!(b.gate(1_499), Gate::Skip));
        assert!(matches!(b.gate(1_500), Gate::Probe));
        assert!(matches!(b.gate(1_500), Gate::Skip), "one probe at a time");
        b.success();
        assert!(matches!(b.gate(1_501), Gate::Call));
    }

    #[test]
    fn a_failed_probe_reopens_and_a_lost_probe_is_replaced() {
        let b = breaker();
        for _ in 0..3 {
            b.failure(0, false);
        }
        assert!(matches!(b.gate(500), Gate::Probe));
        b.failure(500, true);
        assert!(matches!(b.gate(999), Gate::Skip));
        assert!(matches!(b.gate(1_000), Gate::Probe));
        // That probe's caller went away without an answer: after a while another probe goes.
        assert!(matches!(b.gate(1_500), Gate::Skip));
        assert!(matches!(b.gate(2_000), Gate::Probe));
    }

    /// The transitions counted for an outage of three cool-downs: one opening and one
    /// closing, so the alert rule's `open - closed` is 0 once the store is back. Failed
    /// probes were once counted as openings and kept the alert firing after recovery, and
    /// failures at the same moment could each count one.
    #[cfg(feature = "metrics")]
    #[test]
    fn an_outage_counts_one_opening_and_one_closing_whatever_the_probes() {
        use std::collections::BTreeMap;
        use std::sync::{Arc, Mutex};

        #[derive(Default)]
        struct Counts(Mutex<BTreeMap<String, u64>>);
        struct One(Arc<Counts>, String);
        impl metrics::CounterFn for One {
            fn increment(&self, by: u64) {
                *self.0 .0.lock().unwrap().entry(self.1.clone()).or_default() += by;
            }
            fn absolute(&self, _: u64) {}
        }
        struct Recorder(Arc<Counts>);
        impl metrics::Recorder for Recorder {
            fn describe_counter(
                &self,
                _: metrics::KeyName,
                _: Option<metrics::Unit>,
                _: metrics::SharedString,
            ) {
            }
            fn describe_gauge(
                &self,
                _: metrics::KeyName,
                _: Option<metrics::Unit>,
                _: metrics::SharedString,
            ) {
            }
            fn describe_histogram(
                &self,
                _: metrics::KeyName,
                _: Option<metrics::Unit>,
                _: metrics::SharedString,
            ) {
            }
            fn register_counter(
                &self,
                key: &metrics::Key,
                _: &metrics::Metadata<'_>,
            ) -> metrics::Counter {
                let state = key
                    .labels()
                    .find(|l| l.key() == "state")
                    .map_or_else(String::new, |l| l.value().to_owned());
                metrics::Counter::from_arc(Arc::new(One(Arc::clone(&self.0), state)))
            }
            fn register_gauge(
                &self,
                _: &metrics::Key,
                _: &metrics::Metadata<'_>,
            ) -> metrics::Gauge {
                metrics::Gauge::noop()
            }
            fn register_histogram(
                &self,
                _: &metrics::Key,
                _: &metrics::Metadata<'_>,
            ) -> metrics::Histogram {
                metrics::Histogram::noop()
            }
        }

        let counts = Arc::new(Counts::default());
        let recorder = Recorder(Arc::clone(&counts));
        metrics::with_local_recorder(&recorder, || {
            let b = breaker();
            for _ in 0..5 {
                b.failure(0, false);
            }
            let mut now = 500;
            for _ in 0..3 {
                assert!(matches!(b.gate(now), Gate::Probe));
                b.failure(now, true);
                now += 500;
            }
            assert!(matches!(b.gate(now), Gate::Probe));
            b.success();
        });
        let counts = counts.0.lock().unwrap().clone();
        assert_eq!(counts.get("open"), Some(&1), "{counts:?}");
        assert_eq!(counts.get("closed"), Some(&1), "{counts:?}");
        assert_eq!(counts.get("half_open"), Some(&4), "{counts:?}");
    }
}
