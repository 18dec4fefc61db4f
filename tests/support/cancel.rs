//! Cancelling a future at each of its await points: poll it by hand, count the times it
//! answers `Pending`, and drop it after the k-th one, for k = 0 (never polled), 1, 2, … until
//! a run completes before its k.
//!
//! Each `Pending` is one await point the future stopped at. The driver waits for the
//! future's waker before polling again (so a network reply, a timer or a gate really has to
//! happen), bounded by [`STUCK`]: a future that is never woken fails the test instead of
//! hanging it.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use tokio::sync::Notify;

/// How long a pending future may wait for its waker before the test fails.
pub const STUCK: Duration = Duration::from_secs(10);

/// How long background work (a release, a settlement, a spawned batch) gets to finish
/// after a cancellation before the state is checked.
pub const SETTLE: Duration = Duration::from_millis(200);

/// When, at its k-th pending poll, the future is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    /// As soon as it answers `Pending`: what it waits for may be under way (a command
    /// written, not yet answered).
    Reached,
    /// Once its waker has fired: what it waited for has happened (a reply arrived, a gate
    /// opened) but the future has not seen it.
    Woken,
}

impl fmt::Display for Moment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Moment::Reached => "as it stopped",
            Moment::Woken => "once woken",
        })
    }
}

/// What one run of a future came to.
#[derive(Debug)]
pub enum Run<T> {
    /// Dropped after its k-th pending poll (k = 0: before its first poll).
    Dropped,
    /// It completed, after this many pending polls.
    Completed(T, usize),
}

impl<T> Run<T> {
    /// The output, when the run completed.
    pub fn output(self) -> Option<T> {
        match self {
            Run::Dropped => None,
            Run::Completed(v, _) => Some(v),
        }
    }
}

#[derive(Default)]
struct Flag {
    woken: AtomicBool,
    notify: Notify,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        self.notify.notify_one();
    }
}

impl Flag {
    async fn wait(&self, what: &str) {
        let woken = async {
            while !self.woken.swap(false, Ordering::SeqCst) {
                self.notify.notified().await;
            }
        };
        if tokio::time::timeout(STUCK, woken).await.is_err() {
            panic!("{what}: a pending future was not woken within {STUCK:?}");
        }
    }
}

/// Polls `future` until it completes, or drops it after its `k`-th pending poll at
/// `moment` (`k = 0`: dropped without being polled).
pub async fn drive<F: Future>(future: F, k: usize, moment: Moment) -> Run<F::Output> {
    let mut future = Box::pin(future);
    if k == 0 {
        return Run::Dropped;
    }
    let flag = Arc::new(Flag::default());
    let waker = Waker::from(Arc::clone(&flag));
    let mut cx = Context::from_waker(&waker);
    let mut pending = 0;
    loop {
        flag.woken.store(false, Ordering::SeqCst);
        match future.as_mut().poll(&mut cx) {
            Poll::Ready(v) => return Run::Completed(v, pending),
            Poll::Pending => {
                pending += 1;
                if pending == k && moment == Moment::Reached {
                    return Run::Dropped;
                }
                flag.wait("drive").await;
                if pending == k {
                    return Run::Dropped;
                }
            }
        }
    }
}

/// The points of one operation: k = 0, 1, … until a run completes, and how many pending
/// polls the completed run had.
#[derive(Debug)]
pub struct Points {
    what: String,
    moment: Moment,
    next: usize,
    completed: Option<usize>,
}

impl Points {
    /// Points of operation `what`, dropped at `moment`.
    pub fn new(what: impl Into<String>, moment: Moment) -> Self {
        Self {
            what: what.into(),
            moment,
            next: 0,
            completed: None,
        }
    }

    /// The moment the future is dropped at.
    pub fn moment(&self) -> Moment {
        self.moment
    }

    /// The next k to drop at, or `None` once a run completed. A run that completes is
    /// checked like the others (it may hold something until its output is dropped).
    pub fn next_k(&mut self) -> Option<usize> {
        if self.completed.is_some() {
            return None;
        }
        let k = self.next;
        self.next += 1;
        assert!(k < 200, "{}: more than 200 await points", self.what);
        Some(k)
    }

    /// Drives `future` for the current k.
    pub async fn drive<F: Future>(&mut self, future: F) -> Run<F::Output> {
        let k = self.next - 1;
        let run = drive(future, k, self.moment).await;
        if let Run::Completed(_, pending) = &run {
            self.completed = Some(*pending);
        }
        if std::env::var_os("CANCEL_TRACE").is_some() {
            let how = match &run {
                Run::Dropped => "dropped".to_owned(),
                Run::Completed(_, n) => format!("completed after {n} pending polls"),
            };
            eprintln!("{self}: {how}");
        }
        run
    }

    /// Fails unless the run that completed stopped at `at_least` await points: the
    /// cancellations then reached each of them, and the test did not pass vacuously.
    pub fn assert_visited(&self, at_least: usize) {
        let seen = self
            .completed
            .unwrap_or_else(|| panic!("{}: no run completed", self.what));
        assert!(
            seen >= at_least,
            "{}: the operation stopped at {seen} await points, expected at least {at_least}",
            self.what
        );
    }

    /// How many pending polls the completed run had.
    pub fn visited(&self) -> usize {
        self.completed.unwrap_or(0)
    }
}

impl fmt::Display for Points {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = self.next.saturating_sub(1);
        write!(
            f,
            "{}, dropped after pending poll {k} ({})",
            self.what, self.moment
        )
    }
}

/// Waits until `ready()` holds, for at most [`SETTLE`]; whether it held.
pub async fn settled(mut ready: impl AsyncFnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + SETTLE;
    loop {
        if ready().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The bounds a test found broken, each with the point it was found at. The test fails at
/// its end listing every one, so that one broken point does not hide the others.
#[derive(Debug, Default)]
pub struct Findings(Vec<String>);

impl Findings {
    /// Records `finding()` unless `holds`.
    pub fn check(&mut self, holds: bool, finding: impl FnOnce() -> String) {
        if !holds {
            let finding = finding();
            if std::env::var_os("CANCEL_TRACE").is_some() {
                eprintln!("FINDING: {finding}");
            }
            self.0.push(finding);
        }
    }

    /// Records the error of `result`, if any.
    pub fn add(&mut self, result: Result<(), String>) {
        if let Err(finding) = result {
            self.check(false, || finding);
        }
    }

    /// Fails with every finding, if there is one.
    pub fn assert_none(self) {
        assert!(
            self.0.is_empty(),
            "{} bound(s) broken:\n  {}",
            self.0.len(),
            self.0.join("\n  ")
        );
    }
}
