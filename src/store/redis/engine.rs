//! The engine both Redis stores share, generic over how it reaches Redis (a [`Connector`]):
//! it turns decisions into script calls, sends them (loading the script on `NOSCRIPT`) and
//! hands each caller its answer. One `EVALSHA` decides a request against all its policies:
//! every policy is evaluated, and only if all allow is any of them charged. The operations
//! are in [`ops`](super::ops), the per-key overrides in [`overrides`](super::overrides).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::RedisError;
use smallvec::SmallVec;

use super::batch::{queued_answer, Admission, Lanes, Queued, Runner};
use super::connector::{store_error, Connector};
use super::keys::{redis_key, validate_prefix, KeyFor, DEFAULT_PREFIX};
use super::ledger_call::LedgerRequest;
use super::request::{Amount, Mode, Request};
use super::script_call::ScriptCall;
use super::wire::{self, assemble, parse_batch_reply_into, Assembled};
use crate::clock::{Clock, SystemClock};
use crate::decision::Decision;
use crate::error::{ConfigError, StoreError};
use crate::key::Key;
use crate::policy::Policy;
use crate::store::BoxFuture;

/// Settings common to both Redis stores.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) prefix: Box<str>,
    pub(crate) clock: Option<Arc<dyn Clock>>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) max_batch: usize,
    pub(crate) max_in_flight: usize,
}

/// The default cap on decisions per script call.
pub const DEFAULT_MAX_BATCH: usize = 128;

/// The default number of script calls in flight per lane before decisions queue.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 2;

/// Sets the store's `verify` flag again when dropped: a `run_id` read that did not finish.
struct VerifyPending<'a>(&'a AtomicBool);

impl Drop for VerifyPending<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// How often a store on one server reads the server's `run_id` while calls go through, to
/// see a restart that no failed call revealed: see [`Store::generation`](crate::store::Store::generation).
pub(crate) const VERIFY_INTERVAL: Duration = Duration::from_secs(1);

/// The largest `max_batch` accepted: a script call blocks Redis while it runs.
pub(crate) const MAX_BATCH_LIMIT: usize = 1024;

impl Default for Options {
    fn default() -> Self {
        Self {
            prefix: DEFAULT_PREFIX.into(),
            clock: None,
            timeout: None,
            max_batch: DEFAULT_MAX_BATCH,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
        }
    }
}

/// The store logic shared by [`RedisStore`](crate::store::RedisStore) and the cluster store: it knows
/// the keys, the script and the reply, and nothing about how connections are made.
pub(crate) struct Core<C: Connector> {
    pub(super) connector: C,
    pub(super) prefix: Box<str>,
    pub(super) clock: Arc<dyn Clock>,
    lanes: Lanes<C::Lane>,
    /// The lease ledger's calls queue on lanes of their own (see `lease.rs`).
    ledger_lanes: Lanes<C::Lane, LedgerRequest>,
    /// Which server answers, as far as its `run_id` tells.
    server: Arc<ServerIdentity>,
}

/// The server's `run_id` as last read, and when to read it again.
struct ServerIdentity {
    /// Bumped when the server answers with another `run_id` than before: it restarted (or
    /// failed over) and lost the state it held. See [`Store::generation`](crate::store::Store).
    generation: AtomicU64,
    /// Set at start, after any connection failure and on `NOSCRIPT`: the next call that gets
    /// through also reads the server's `run_id`.
    verify: AtomicBool,
    /// When the `run_id` was last read, in ms since `started`: it is read again after
    /// [`VERIFY_INTERVAL`] of calls, so that a restart hidden from the store (a pool that
    /// replaces a dead connection while recycling it, a RESP3 connection that reconnects on
    /// the server's disconnect notice, another instance that reloaded the script first) is
    /// seen within that interval.
    verified_at: AtomicU64,
    started: std::time::Instant,
    /// The connector's [server epoch](Connector::server_epoch) when the `run_id` was last
    /// read: a connector that has moved to another server since has it read again.
    verified_epoch: AtomicU64,
    run_id: parking_lot::Mutex<Option<Box<str>>>,
}

impl ServerIdentity {
    fn new() -> Self {
        Self {
            generation: AtomicU64::new(0),
            verify: AtomicBool::new(true),
            verified_at: AtomicU64::new(0),
            started: std::time::Instant::now(),
            verified_epoch: AtomicU64::new(0),
            run_id: parking_lot::Mutex::new(None),
        }
    }

    /// Whether the `run_id` was last read [`VERIFY_INTERVAL`] ago or more; if so, the
    /// interval starts again for every other call (one reads it).
    fn verify_due(&self) -> bool {
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let last = self.verified_at.load(Ordering::Relaxed);
        now.saturating_sub(last) >= VERIFY_INTERVAL.as_millis() as u64
            && self
                .verified_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Reads the server's `run_id` and bumps the generation when it is not the one seen
    /// before. A failure leaves the check for the next call. With `epoch`, what is read is
    /// kept only if the connector is still on that server's epoch as far as the last read
    /// knows (a read on an old master's connection that answers after the new master's is
    /// not taken for another restart).
    async fn verify_server(&self, conn: &mut impl redis::aio::ConnectionLike, epoch: Option<u64>) {
        let info: Result<String, _> = redis::cmd("INFO").arg("server").query_async(conn).await;
        let run_id = info.ok().and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("run_id:"))
                .map(|id| Box::<str>::from(id.trim()))
        });
        let Some(run_id) = run_id else {
            self.verify.store(true, Ordering::Release);
            return;
        };
        let mut known = self.run_id.lock();
        if epoch.is_some_and(|e| e != self.verified_epoch.load(Ordering::Acquire)) {
            return;
        }
        if known.as_ref().is_some_and(|k| *k != run_id) {
            self.generation.fetch_add(1, Ordering::AcqRel);
            tracing::warn!(
                target: "tollgate::store",
                "the Redis server restarted or failed over (new run_id): its rate-limit state was lost"
            );
        }
        *known = Some(run_id);
    }
}

impl<C: Connector> fmt::Debug for Core<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisCore")
            .field("connection", &self.connector.describe())
            .field("prefix", &self.prefix)
            .field("clock", &self.clock)
            .field("max_batch", &self.lanes.max_batch)
            .field("max_in_flight", &self.lanes.max_in_flight)
            .finish()
    }
}

impl<C: Connector> Core<C> {
    /// Checks the options and builds the core.
    pub(crate) fn new(connector: C, options: Options) -> Result<Self, ConfigError> {
        validate_prefix(&options.prefix)?;
        if let Some(t) = options.timeout.filter(|t| *t < Duration::from_millis(1)) {
            return Err(ConfigError::new(
                "timeout",
                format_args!("{t:?}"),
                "at least 1 ms (every call would time out)",
            ));
        }
        if !(1..=MAX_BATCH_LIMIT).contains(&options.max_batch) {
            return Err(ConfigError::new(
                "max_batch",
                options.max_batch,
                format!("must be 1 to {MAX_BATCH_LIMIT} (1 sends every decision alone)"),
            ));
        }
        if options.max_in_flight == 0 {
            return Err(ConfigError::new(
                "max_in_flight",
                options.max_in_flight,
                "must be at least 1",
            ));
        }
        Ok(Self::unchecked(connector, options))
    }

    /// Builds the core from options already checked (or the defaults).
    pub(crate) fn unchecked(connector: C, options: Options) -> Self {
        Self {
            connector,
            prefix: options.prefix,
            clock: options
                .clock
                .unwrap_or_else(|| Arc::new(SystemClock::new())),
            lanes: Lanes::new(options.max_batch, options.max_in_flight),
            ledger_lanes: Lanes::new(options.max_batch, options.max_in_flight),
            server: Arc::new(ServerIdentity::new()),
        }
    }

    /// See [`Store::generation`](crate::store::Store::generation).
    pub(crate) fn generation(&self) -> u64 {
        self.server.generation.load(Ordering::Acquire)
    }

    /// One script call on a connection of the connector.
    ///
    /// A call refused at connect time was never sent, so it is tried once more: a connection
    /// manager hands back its last failed reconnect once (starting a new one), and without the
    /// second try the first call after Redis is back would fail on that stale error and waste
    /// the circuit breaker's probe. After any connection failure, the next call that gets
    /// through also reads the server's `run_id` (see [`Store::generation`](crate::store::Store)),
    /// and so does the first call after the connector moved to another server.
    pub(crate) async fn invoke(&self, inv: &ScriptCall) -> Result<Vec<u8>, StoreError> {
        let server = &self.server;
        // Read before the connection: a move while it is made is then seen by this call or
        // the next, never missed.
        let epoch = self.connector.server_epoch();
        let mut conn = match self.connector.connection().await {
            Ok(c) => c,
            Err(e) => {
                server.verify.store(true, Ordering::Release);
                return Err(e);
            }
        };
        let mut reply = inv.send(&mut conn, &server.verify).await;
        if reply.as_ref().is_err_and(RedisError::is_connection_refusal) {
            conn = match self.connector.connection().await {
                Ok(c) => c,
                Err(e) => {
                    server.verify.store(true, Ordering::Release);
                    return Err(e);
                }
            };
            reply = inv.send(&mut conn, &server.verify).await;
        }
        match reply {
            Ok(r) => {
                if self.connector.one_server() {
                    let moved = self.connector.server_epoch()
                        != server.verified_epoch.load(Ordering::Acquire);
                    if server.verify.swap(false, Ordering::AcqRel) || moved {
                        server.verified_epoch.store(epoch, Ordering::Release);
                        // A caller that gives up during the read (a timeout, a hang-up)
                        // leaves it to the next call, rather than taking it along.
                        let pending = VerifyPending(&server.verify);
                        server.verify_server(&mut conn, None).await;
                        std::mem::forget(pending);
                    } else if server.verify_due() {
                        self.verify_later(conn, epoch);
                    }
                }
                Ok(r)
            }
            Err(e) => {
                if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
                    server.verify.store(true, Ordering::Release);
                }
                Err(store_error(e))
            }
        }
    }

    /// The once-a-second `run_id` read, off the answer's path: in a task of its own on
    /// `conn` (the callers of this call have their answer meanwhile). Without a runtime, the
    /// next call reads it.
    fn verify_later(&self, mut conn: C::Conn, epoch: u64) {
        let server = Arc::clone(&self.server);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            server.verify.store(true, Ordering::Release);
            return;
        };
        runtime.spawn(async move {
            let pending = VerifyPending(&server.verify);
            // Bounded: a connection that never answers must not be held for good.
            if tokio::time::timeout(
                VERIFY_INTERVAL,
                server.verify_server(&mut conn, Some(epoch)),
            )
            .await
            .is_ok()
            {
                std::mem::forget(pending);
            }
        });
    }

    /// The lane a call whose first key is `state_key` runs on.
    pub(crate) fn lane(&self, state_key: &str) -> C::Lane {
        self.connector.lane(state_key)
    }

    pub(crate) fn ledger_lanes(&self) -> &Lanes<C::Lane, LedgerRequest> {
        &self.ledger_lanes
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Sends `PING`, then loads the decision and lease scripts (`SCRIPT LOAD`, on every
    /// primary of a cluster), so that the first decision after start-up is one round trip
    /// rather than three (`NOSCRIPT`, the load, the call again): a first decision within a
    /// tight timeout.
    pub(crate) async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.connector.connection().await?;
        let _: String = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .map_err(store_error)?;
        for script in [super::script::script(), super::ledger_call::script()] {
            script
                .prepare_invoke()
                .load_async(&mut conn)
                .await
                .map_err(store_error)?;
        }
        Ok(())
    }

    pub(crate) fn now_millis(&self) -> u64 {
        self.clock.now_millis()
    }

    /// The injected clock's time, for scripts that otherwise read the server's `TIME`.
    pub(crate) fn injected_now(&self) -> Option<u64> {
        self.clock.is_injected().then(|| self.clock.now_millis())
    }

    /// The request for one decision: its state keys and each policy's parameters.
    pub(crate) fn request(
        &self,
        key: &Key,
        policies: &[Policy],
        amounts: SmallVec<[Amount; 2]>,
        mode: Mode,
    ) -> Request {
        debug_assert_eq!(policies.len(), amounts.len());
        Request {
            keys: policies
                .iter()
                .map(|p| redis_key(&self.prefix, key, p.name(), KeyFor::State(p.algorithm())))
                .collect(),
            params: policies.iter().map(wire::params).collect(),
            amounts,
            mode,
            reply: None,
        }
    }

    /// The script call for one assembled batch.
    pub(crate) fn invocation(&self, batch: &Assembled<'_>) -> ScriptCall {
        let now = self.clock.is_injected().then(|| self.clock.now_millis());
        wire::invocation(super::script::script(), batch, now)
    }

    /// Decides (or refunds, by `mode`) now when the lane has room, else queues for the next
    /// call of the lane.
    pub(crate) fn decide(
        self: &Arc<Self>,
        key: &Key,
        policies: &[Policy],
        amounts: SmallVec<[Amount; 2]>,
        mode: Mode,
    ) -> BoxFuture<Result<Decision, StoreError>> {
        if policies.is_empty() {
            // Nothing to decide (every policy allows vacuously): no call, and no state key
            // to pick the lane by.
            return Box::pin(std::future::ready(Ok(Decision::from_policies([]))));
        }
        let request = self.request(key, policies, amounts, mode);
        let lane = self.connector.lane(&request.keys[0]);
        match Lanes::admit(self, lane, request) {
            Admission::Run(permit, request) => {
                let core = Arc::clone(self);
                Box::pin(async move {
                    let result = core.call_ref(std::slice::from_ref(&request)).await.pop();
                    drop(permit);
                    result.unwrap_or_else(|| {
                        Err(StoreError::Protocol(crate::error::Cause::from(
                            "the decision script answered nothing",
                        )))
                    })
                })
            }
            Admission::Queued(rx) => Box::pin(queued_answer(rx)),
        }
    }

    /// One `EVALSHA` per assembled part of `batch` (reloading the script once on
    /// `NOSCRIPT`): the results of its requests, in order.
    async fn call_ref(&self, batch: &[Request]) -> Vec<Result<Decision, StoreError>> {
        let mut results = Vec::with_capacity(batch.len());
        for (assembled, requests) in assemble(batch) {
            let inv = self.invocation(&assembled);
            let reply = self.invoke(&inv).await;
            if let Err(e) = reply.and_then(|r| parse_batch_reply_into(&r, requests, &mut results)) {
                results.extend(requests.iter().map(|_| Err(e.clone())));
            }
        }
        results
    }
}

impl<C: Connector> Runner<C::Lane> for Core<C> {
    fn run(self: Arc<Self>, batch: Vec<Request>) -> BoxFuture<()> {
        Box::pin(async move {
            // Requests whose callers gave up are skipped before the call is sent.
            let batch: Vec<Request> = batch.into_iter().filter(|r| !r.abandoned()).collect();
            if batch.is_empty() {
                return;
            }
            let results = self.call_ref(&batch).await;
            for (request, result) in batch.into_iter().zip(results) {
                request.answer(result);
            }
        })
    }

    fn lanes(&self) -> &Lanes<C::Lane> {
        &self.lanes
    }
}

#[cfg(test)]
mod tests;
