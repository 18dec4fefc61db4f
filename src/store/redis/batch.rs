//! Coalescing concurrent decisions into one script call.
//!
//! A decision is sent at once when fewer than `max_in_flight` script calls are in flight on
//! its lane (the whole server, or one Cluster hash slot): at low load nothing waits and nothing is
//! added. Otherwise it queues, and when a call comes back the queue leaves as the next call,
//! up to `max_batch` decisions in arrival order. One script call then reads each state once,
//! decides every request in order against the states as the earlier ones left them, and
//! writes each state once, so a hot key costs one read and one write per batch instead of
//! per request, and every caller still gets its own exact decision.
//!
//! Queued batches run in tasks of their own, so a caller that gives up (a timeout) takes no
//! one else's decision with it.
//!
//! The lease ledger's calls (`lua/lease.lua`) queue the same way, on lanes of their own: a
//! batch of them is one script call that runs each in order.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::request::{Mode, Request};

use crate::decision::Decision;
use crate::error::StoreError;

/// Something that can wait in a lane's queue: it carries the sender its answer goes to.
pub(crate) trait Queued: Send + 'static {
    /// What a successful call answers it.
    type Output: Send + 'static;

    /// Where its answer goes, once it is queued.
    fn reply_to(&mut self, tx: oneshot::Sender<Result<Self::Output, StoreError>>);

    /// Whether it is skipped rather than sent: its caller gave up waiting, and it asks only
    /// for an answer or a charge (a look, a check). What gives back or settles (a refund,
    /// a settlement, a slot's release or refresh, a block's return) is sent whoever waits:
    /// a caller's timeout must not leave a slot held until its lease ends, or a settlement
    /// unmade.
    fn abandoned(&self) -> bool;

    /// Whether it may be refused rather than queued when its lane's queue is full: it asks
    /// only for an answer or a charge. What gives back or settles is always queued.
    fn refusable(&self) -> bool;

    /// Sends its answer (dropped when the caller gave up).
    fn answer(self, result: Result<Self::Output, StoreError>);
}

impl Queued for Request {
    type Output = Decision;

    fn reply_to(&mut self, tx: oneshot::Sender<Result<Decision, StoreError>>) {
        self.reply = Some(tx);
    }

    fn abandoned(&self) -> bool {
        self.refusable() && self.reply.as_ref().is_some_and(oneshot::Sender::is_closed)
    }

    fn refusable(&self) -> bool {
        matches!(self.mode, Mode::Peek | Mode::Charge)
    }

    fn answer(self, result: Result<Decision, StoreError>) {
        if let Some(tx) = self.reply {
            // The caller may have given up; its answer is then dropped.
            let _ = tx.send(result);
        }
    }
}

/// How many script calls a lane has under way and who waits for the next one.
struct Lane<R> {
    /// Script calls under way.
    calls: usize,
    waiting: Vec<R>,
}

impl<R> Default for Lane<R> {
    fn default() -> Self {
        Self {
            calls: 0,
            waiting: Vec::new(),
        }
    }
}

/// The lanes of one store, for one kind of call (`R`: decisions, or ledger calls).
pub(crate) struct Lanes<L, R = Request> {
    lanes: Mutex<HashMap<L, Lane<R>>>,
    pub(crate) max_batch: usize,
    pub(crate) max_in_flight: usize,
}

/// What a caller does with its request.
pub(crate) enum Admission<L: Copy + Hash + Eq + Send + 'static, R: Queued = Request> {
    /// Run it now, holding a permit of the lane until the call ends.
    Run(CallPermit<L, R>, R),
    /// Queued: the answer comes through this receiver.
    Queued(oneshot::Receiver<Result<R::Output, StoreError>>),
}

/// Something that runs batches: the store core.
pub(crate) trait Runner<L, R: Queued = Request>: Send + Sync + 'static {
    /// Sends one script call running `batch` in order, answering every request in it.
    fn run(self: Arc<Self>, batch: Vec<R>) -> crate::store::BoxFuture<()>;

    /// The lanes of this runner.
    fn lanes(&self) -> &Lanes<L, R>;
}

impl<L: Copy + Hash + Eq + Send + 'static, R: Queued> Lanes<L, R> {
    pub(crate) fn new(max_batch: usize, max_in_flight: usize) -> Self {
        Self {
            lanes: Mutex::new(HashMap::new()),
            max_batch: max_batch.max(1),
            max_in_flight: max_in_flight.max(1),
        }
    }

    /// Admits `request` on `lane`: to be run by the caller, or queued.
    pub(crate) fn admit<X: Runner<L, R>>(
        runner: &Arc<X>,
        lane: L,
        mut request: R,
    ) -> Admission<L, R> {
        let lanes = runner.lanes();
        let mut map = lanes.lanes.lock();
        let state = map.entry(lane).or_default();
        if state.calls < lanes.max_in_flight || lanes.max_batch == 1 {
            state.calls += 1;
            drop(map);
            let guard = CallPermit {
                runner: Arc::clone(runner) as Arc<dyn Runner<L, R>>,
                lane,
            };
            Admission::Run(guard, request)
        } else {
            let (tx, rx) = oneshot::channel();
            request.reply_to(tx);
            let most = lanes.max_waiting();
            if state.waiting.len() >= most && request.refusable() {
                // A lane whose calls do not come back (a node that stopped answering) would
                // otherwise queue without end: those who gave up go, and past the cap a check
                // is refused at once, for the failure mode to decide.
                state.waiting.retain(|r| !r.abandoned());
                if state.waiting.len() >= most {
                    drop(map);
                    request.answer(Err(StoreError::Connection(crate::error::Cause::from(
                        format!("the store is not keeping up: {most} calls wait on this lane"),
                    ))));
                    return Admission::Queued(rx);
                }
            }
            state.waiting.push(request);
            Admission::Queued(rx)
        }
    }

    /// The most checks a lane queues: 64 full batches (8 192 at the default `max_batch`),
    /// far more than a burst on a healthy store queues, which drains a batch per call.
    fn max_waiting(&self) -> usize {
        self.max_batch.saturating_mul(64).max(1_024)
    }
}

/// A permit to run a script call on a lane (one of `max_in_flight`). When it is given back
/// (the call ended, or its caller gave up), the requests that queued meanwhile leave as the
/// next call, in a task of their own.
pub(crate) struct CallPermit<L: Copy + Hash + Eq + Send + 'static, R: Queued = Request> {
    runner: Arc<dyn Runner<L, R>>,
    lane: L,
}

impl<L: Copy + Hash + Eq + Send + 'static, R: Queued> Drop for CallPermit<L, R> {
    fn drop(&mut self) {
        loop {
            let batch = {
                let mut map = self.runner.lanes().lanes.lock();
                let max_batch = self.runner.lanes().max_batch;
                let Some(state) = map.get_mut(&self.lane) else {
                    return;
                };
                state.waiting.retain(|r| !r.abandoned());
                if state.waiting.is_empty() {
                    state.calls -= 1;
                    if state.calls == 0 {
                        map.remove(&self.lane);
                    }
                    return;
                }
                let n = state.waiting.len().min(max_batch);
                state.waiting.drain(..n).collect::<Vec<_>>()
            };
            match tokio::runtime::Handle::try_current() {
                Ok(handle) => {
                    // The permit passes to the next call.
                    let next = CallPermit {
                        runner: Arc::clone(&self.runner),
                        lane: self.lane,
                    };
                    let run = Arc::clone(&next.runner).run(batch);
                    handle.spawn(async move {
                        run.await;
                        drop(next);
                    });
                    return;
                }
                Err(_) => {
                    for r in batch {
                        r.answer(Err(StoreError::Connection(crate::error::Cause::from(
                            "no tokio runtime to send the decision from",
                        ))));
                    }
                    // This permit stays taken: the loop hands it to the next batch.
                }
            }
        }
    }
}

/// The answer of a queued request; an error when its call was dropped unanswered (the
/// runtime shut down under it).
pub(crate) async fn queued_answer<T>(
    rx: oneshot::Receiver<Result<T, StoreError>>,
) -> Result<T, StoreError> {
    rx.await.unwrap_or_else(|_| {
        Err(StoreError::Connection(crate::error::Cause::from(
            "the batched script call was dropped before it answered",
        )))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::redis::request::Amount;

    /// A runner whose calls never come back: a node that stopped answering.
    struct Silent {
        lanes: Lanes<u8>,
    }

    impl Runner<u8> for Silent {
        fn run(self: Arc<Self>, _batch: Vec<Request>) -> crate::store::BoxFuture<()> {
            Box::pin(std::future::pending())
        }

        fn lanes(&self) -> &Lanes<u8> {
            &self.lanes
        }
    }

    fn request(mode: Mode) -> Request {
        Request {
            keys: ["k".to_owned()].into_iter().collect(),
            params: [[5, 10, 1_000, 10, 0]].into_iter().collect(),
            amounts: [Amount::Units(1)].into_iter().collect(),
            mode,
            reply: None,
        }
    }

    /// Behind a call that never ends, a lane queues at most 64 batches of checks and
    /// refuses the rest at once; checks whose callers gave up make room; what gives back is
    /// queued whatever the length.
    #[test]
    fn a_lane_whose_calls_never_end_queues_a_bounded_number_of_checks() {
        let runner = Arc::new(Silent {
            lanes: Lanes::new(16, 1),
        });
        let Admission::Run(permit, _) = Lanes::admit(&runner, 0, request(Mode::Charge)) else {
            panic!("the first call runs");
        };
        let (mut waiting, mut refused) = (Vec::new(), 0);
        for _ in 0..1_500 {
            let Admission::Queued(mut rx) = Lanes::admit(&runner, 0, request(Mode::Charge)) else {
                panic!("queued or refused");
            };
            match rx.try_recv() {
                Ok(Err(_)) => refused += 1,
                _ => waiting.push(rx),
            }
        }
        assert_eq!((waiting.len(), refused), (1_024, 476));
        // The callers give up: their checks make room for new ones.
        waiting.clear();
        let Admission::Queued(mut rx) = Lanes::admit(&runner, 0, request(Mode::Charge)) else {
            panic!("queued");
        };
        assert!(rx.try_recv().is_err(), "queued, not refused");
        let mut give_backs = Vec::new();
        for _ in 0..200 {
            let Admission::Queued(mut rx) = Lanes::admit(&runner, 0, request(Mode::Refund)) else {
                panic!("queued");
            };
            assert!(rx.try_recv().is_err(), "a give-back is never refused");
            give_backs.push(rx);
        }
        drop(permit);
    }
}
