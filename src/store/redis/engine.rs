//! The engine both Redis stores share, generic over how it reaches Redis (a [`Connector`]):
//! it turns decisions into script calls, sends them (loading the script on `NOSCRIPT`) and
//! hands each caller its answer. One `EVALSHA` decides a request against all its policies:
//! every policy is evaluated, and only if all allow is any of them charged.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};

use super::script_call::ScriptCall;
use smallvec::SmallVec;

use super::batch::{queued_answer, Admission, Lanes, Queued, Request, Runner};
use super::keys::{redis_key, validate_prefix, Holds, DEFAULT_PREFIX};
use super::lease::LedgerRequest;
use super::wire;
pub(crate) use super::wire::Mode;
use super::wire::{assemble, parse_batch_reply_into, Amount, Assembled};
use crate::clock::{Clock, SystemClock};
use crate::decision::Decision;
use crate::error::{Cause, ConfigError, StoreError};
use crate::key::Key;
use crate::overrides::ActiveOverride;
use crate::policy::Policy;
use crate::store::op::refused_misfit;
use crate::store::{Applied, ApplyFuture, BoxFuture, Op};

/// Units per policy, as the script takes them.
fn units(costs: &[u64]) -> SmallVec<[Amount; 2]> {
    costs.iter().map(|&c| Amount::Units(c)).collect()
}

/// Turns a redis-rs error into the store error a `ResilientStore`'s failure mode acts on,
/// keeping the redis-rs error as its source.
pub(crate) fn store_error(e: RedisError) -> StoreError {
    use redis::ErrorKind;
    if e.is_timeout() {
        StoreError::Timeout
    } else if e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_cluster_error()
        || matches!(
            e.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::AuthenticationFailed
                | ErrorKind::InvalidClientConfig
        )
    {
        StoreError::Connection(Cause::with_source(e.to_string(), e))
    } else if matches!(e.kind(), ErrorKind::Parse | ErrorKind::UnexpectedReturnType) {
        StoreError::Protocol(Cause::with_source(e.to_string(), e))
    } else {
        StoreError::Backend(Cause::with_source(e.to_string(), e))
    }
}

/// Where a store gets a connection for one decision.
pub(crate) trait Connector: Send + Sync + 'static {
    /// A connection (or a cheap handle to a shared one).
    type Conn: ConnectionLike + Send;

    /// What decisions must share to go in one script call: nothing on one server, the hash
    /// slot in a cluster.
    type Lane: Copy + std::hash::Hash + Eq + Send + Sync + 'static;

    /// The lane of a state key.
    fn lane(&self, state_key: &str) -> Self::Lane;

    /// A connection for one command.
    fn connection(&self) -> impl Future<Output = Result<Self::Conn, StoreError>> + Send;

    /// What the store's `Debug` shows about its connection.
    fn describe(&self) -> &'static str;

    /// Whether every connection reaches one server, whose `run_id` then tells a restart
    /// (not so on a cluster, where `INFO` answers from any node).
    fn one_server(&self) -> bool {
        true
    }
}

/// A connection from a pool, or a handle to one shared multiplexed connection.
pub(crate) enum PooledOrShared<P, S> {
    Pooled(P),
    Shared(S),
}

impl<P: ConnectionLike, S: ConnectionLike> ConnectionLike for PooledOrShared<P, S> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Pooled(c) => c.req_packed_command(cmd),
            Self::Shared(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Pooled(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Shared(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Pooled(c) => c.get_db(),
            Self::Shared(c) => c.get_db(),
        }
    }
}

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
    connector: C,
    prefix: Box<str>,
    clock: Arc<dyn Clock>,
    lanes: Lanes<C::Lane>,
    /// The lease ledger's calls queue on lanes of their own (see `lease.rs`).
    ledger_lanes: Lanes<C::Lane, LedgerRequest>,
    /// Bumped when the server answers with another `run_id` than before: it restarted (or
    /// failed over) and lost the state it held. See [`Store::generation`](crate::store::Store).
    generation: AtomicU64,
    /// Set at start and after any connection failure: the next call that gets through also
    /// reads the server's `run_id`.
    verify: AtomicBool,
    run_id: parking_lot::Mutex<Option<Box<str>>>,
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
            generation: AtomicU64::new(0),
            verify: AtomicBool::new(true),
            run_id: parking_lot::Mutex::new(None),
        }
    }

    /// See [`Store::generation`](crate::store::Store::generation).
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Reads the server's `run_id` and bumps the generation when it is not the one seen
    /// before. A failure leaves the check for the next call.
    async fn verify_server(&self, conn: &mut C::Conn) {
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
        if known.as_ref().is_some_and(|k| *k != run_id) {
            self.generation.fetch_add(1, Ordering::AcqRel);
            tracing::warn!(
                target: "tollgate::store",
                "the Redis server restarted or failed over (new run_id): its rate-limit state was lost"
            );
        }
        *known = Some(run_id);
    }

    /// One script call on a connection of the connector.
    ///
    /// A call refused at connect time was never sent, so it is tried once more: a connection
    /// manager hands back its last failed reconnect once (starting a new one), and without the
    /// second try the first call after Redis is back would fail on that stale error and waste
    /// the circuit breaker's probe. After any connection failure, the next call that gets
    /// through also reads the server's `run_id` (see [`Store::generation`](crate::store::Store)).
    pub(crate) async fn invoke(&self, inv: &ScriptCall) -> Result<Vec<u8>, StoreError> {
        let mut conn = match self.connector.connection().await {
            Ok(c) => c,
            Err(e) => {
                self.verify.store(true, Ordering::Release);
                return Err(e);
            }
        };
        let mut reply = inv.send(&mut conn).await;
        if reply.as_ref().is_err_and(RedisError::is_connection_refusal) {
            conn = match self.connector.connection().await {
                Ok(c) => c,
                Err(e) => {
                    self.verify.store(true, Ordering::Release);
                    return Err(e);
                }
            };
            reply = inv.send(&mut conn).await;
        }
        match reply {
            Ok(r) => {
                if self.connector.one_server() && self.verify.swap(false, Ordering::AcqRel) {
                    self.verify_server(&mut conn).await;
                }
                Ok(r)
            }
            Err(e) => {
                if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
                    self.verify.store(true, Ordering::Release);
                }
                Err(store_error(e))
            }
        }
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

    /// Sends `PING`.
    pub(crate) async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.connector.connection().await?;
        let _: String = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .map_err(store_error)?;
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
                .map(|p| redis_key(&self.prefix, key, p.name(), Holds::State(p.algorithm())))
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
        wire::invocation(batch, now)
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
            Admission::Run(place, request) => {
                let core = Arc::clone(self);
                Box::pin(async move {
                    let result = core.call_ref(std::slice::from_ref(&request)).await.pop();
                    drop(place);
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

    /// Applies `op` (see [`Store::apply`](crate::store::Store::apply)): one request of the
    /// decision script in the op's mode, batched like any other, so one atomic script call;
    /// a reset is one `UNLINK`.
    pub(crate) fn apply(self: &Arc<Self>, key: &Key, policies: &[Policy], op: Op) -> ApplyFuture {
        if let Some(refused) = refused_misfit(&op, policies.len()) {
            return refused;
        }
        let call = match op {
            Op::Check { costs } => {
                let call = self.charge(key, policies, &costs);
                return Box::pin(async move { call.await.map(Applied::Decision) });
            }
            Op::Peek { costs } => {
                let call = self.decide(key, policies, units(&costs), Mode::Peek);
                return Box::pin(async move { call.await.map(Applied::Decision) });
            }
            Op::Refund { costs } => self.refund(key, policies, &costs),
            Op::Settle { reserved, actual } => self.settle(key, policies, &reserved, &actual),
            Op::Release { slot } => self.slot(key, policies, slot, Mode::Refund),
            Op::Refresh { slot } => self.slot(key, policies, slot, Mode::Refresh),
            Op::Reset => return self.reset(key, policies),
        };
        match call {
            Some(call) => Box::pin(async move { call.await.map(|_| Applied::Done) }),
            None => Box::pin(std::future::ready(Ok(Applied::Done))),
        }
    }

    /// A charge, taking an in-flight slot for each in-flight policy: the request names its
    /// slot (see [`next_slot`]) in place of that policy's cost, and an allowed decision
    /// carries it for the release.
    pub(crate) fn charge(
        self: &Arc<Self>,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
    ) -> BoxFuture<Result<Decision, StoreError>> {
        if !policies.iter().any(Policy::is_in_flight) {
            return self.decide(key, policies, units(costs), Mode::Charge);
        }
        let slot = next_slot();
        let named = policies
            .iter()
            .zip(costs)
            .map(|(p, &c)| {
                if p.is_in_flight() {
                    Amount::Slot(slot)
                } else {
                    Amount::Units(c)
                }
            })
            .collect();
        let call = self.decide(key, policies, named, Mode::Charge);
        Box::pin(SlotCharge {
            call: Some(call),
            core: Arc::clone(self),
            key: key.clone(),
            held: policies
                .iter()
                .filter(|p| p.is_in_flight())
                .cloned()
                .collect(),
            slot,
        })
    }

    /// A settlement ([`Op::Settle`]): one request in settle mode with each policy's
    /// settlement; `None` when every policy settles at what it reserved.
    fn settle(
        self: &Arc<Self>,
        key: &Key,
        policies: &[Policy],
        reserved: &[u64],
        actual: &[u64],
    ) -> Option<BoxFuture<Result<Decision, StoreError>>> {
        // A policy settled at what it reserved changes nothing (as in the memory store): it
        // is not sent, so the script neither writes its state nor logs an entry of 0.
        let (policies, amounts): (SmallVec<[Policy; 2]>, SmallVec<[Amount; 2]>) = policies
            .iter()
            .zip(reserved.iter().zip(actual))
            .filter(|(_, (r, a))| r != a)
            .map(|(p, (&reserved, &actual))| (p.clone(), Amount::Settled { reserved, actual }))
            .unzip();
        (!policies.is_empty()).then(|| self.decide(key, &policies, amounts, Mode::Settle))
    }

    /// Gives back (`Mode::Refund`) or extends (`Mode::Refresh`) the in-flight slot `slot`;
    /// `None` for slot 0, which names no slot here (a failure mode decided the request).
    fn slot(
        self: &Arc<Self>,
        key: &Key,
        policies: &[Policy],
        slot: u64,
        mode: Mode,
    ) -> Option<BoxFuture<Result<Decision, StoreError>>> {
        (slot != 0).then(|| {
            let slots = policies.iter().map(|_| Amount::Slot(slot)).collect();
            self.decide(key, policies, slots, mode)
        })
    }

    /// A refund ([`Op::Refund`]): units only; a slot comes back only by its release (the
    /// script's refund of an in-flight state reads the amount as the slot's name).
    fn refund(
        self: &Arc<Self>,
        key: &Key,
        policies: &[Policy],
        costs: &[u64],
    ) -> Option<BoxFuture<Result<Decision, StoreError>>> {
        let (policies, amounts): (SmallVec<[Policy; 2]>, SmallVec<[Amount; 2]>) = policies
            .iter()
            .zip(costs)
            .filter(|(p, _)| !p.is_in_flight())
            .map(|(p, &c)| (p.clone(), Amount::Units(c)))
            .unzip();
        Some(self.decide(key, &policies, amounts, Mode::Refund))
    }

    /// One `UNLINK` of every state key of these policies (all algorithms), in one slot.
    fn reset(self: &Arc<Self>, key: &Key, policies: &[Policy]) -> ApplyFuture {
        if policies.is_empty() {
            // `UNLINK` with no keys is a syntax error; there is nothing to forget.
            return Box::pin(std::future::ready(Ok(Applied::Done)));
        }
        let mut cmd = redis::cmd("UNLINK");
        for p in policies {
            for a in crate::Algorithm::ALL {
                cmd.arg(redis_key(&self.prefix, key, p.name(), Holds::State(a)));
            }
        }
        let core = Arc::clone(self);
        Box::pin(async move {
            let mut conn = core.connector.connection().await?;
            let _: i64 = cmd.query_async(&mut conn).await.map_err(store_error)?;
            Ok(Applied::Done)
        })
    }

    /// See [`OverrideStore::set`](crate::store::OverrideStore::set): one `SET` of the
    /// state's override key, with `PX` when it expires; for a token bucket, one script that
    /// also brings the bucket up to date under the rate in force until now and keeps its
    /// state key as long as the override's refill rate needs (`lua/set_override.lua`).
    pub(crate) fn set_override(
        self: &Arc<Self>,
        key: &Key,
        policy: &Policy,
        ttl: Option<Duration>,
    ) -> BoxFuture<Result<(), StoreError>> {
        let ttl = ttl.map(|ttl| u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1));
        if policy.algorithm() == crate::policy::Algorithm::TokenBucket {
            return self.bucket_override(key, policy, Some(ttl));
        }
        let core = Arc::clone(self);
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.override_key(key, policy))
            .arg(wire::override_value(policy));
        if let Some(ttl) = ttl {
            cmd.arg("PX").arg(ttl);
        }
        Box::pin(async move {
            let mut conn = core.connector.connection().await?;
            let _: () = cmd.query_async(&mut conn).await.map_err(store_error)?;
            Ok(())
        })
    }

    /// The key of `key`'s override of `policy`.
    fn override_key(&self, key: &Key, policy: &Policy) -> String {
        redis_key(
            &self.prefix,
            key,
            policy.name(),
            Holds::Override(policy.algorithm()),
        )
    }

    /// Sets (`Some` TTL or none) or removes (`None`) a token bucket's override in one
    /// script (`lua/set_override.lua`): the time before the change refills at the rate in
    /// force then, as the memory store does.
    fn bucket_override(
        self: &Arc<Self>,
        key: &Key,
        policy: &Policy,
        set: Option<Option<u64>>,
    ) -> BoxFuture<Result<(), StoreError>> {
        let core = Arc::clone(self);
        let mut call = super::script::set_override_script().prepare_invoke();
        call.key(redis_key(
            &self.prefix,
            key,
            policy.name(),
            Holds::State(policy.algorithm()),
        ))
        .key(self.override_key(key, policy));
        match set {
            Some(ttl) => call
                .arg(wire::override_value(policy))
                .arg(ttl.map_or_else(String::new, |t| t.to_string())),
            None => call.arg("").arg(""),
        };
        call.arg(policy.plan_limits().limit())
            .arg(if self.clock.is_injected() {
                self.clock.now_millis().to_string()
            } else {
                String::new() // the script reads TIME
            });
        Box::pin(async move {
            let mut conn = core.connector.connection().await?;
            let _: i64 = call.invoke_async(&mut conn).await.map_err(store_error)?;
            Ok(())
        })
    }

    /// See [`OverrideStore::remove`](crate::store::OverrideStore::remove): one `UNLINK`;
    /// for a token bucket, the script of [`set_override`](Self::set_override).
    pub(crate) fn remove_override(
        self: &Arc<Self>,
        key: &Key,
        policy: &Policy,
    ) -> BoxFuture<Result<(), StoreError>> {
        if policy.algorithm() == crate::policy::Algorithm::TokenBucket {
            return self.bucket_override(key, policy, None);
        }
        let mut cmd = redis::cmd("UNLINK");
        cmd.arg(self.override_key(key, policy));
        let core = Arc::clone(self);
        Box::pin(async move {
            let mut conn = core.connector.connection().await?;
            let _: i64 = cmd.query_async(&mut conn).await.map_err(store_error)?;
            Ok(())
        })
    }

    /// See [`OverrideStore::list`](crate::store::OverrideStore::list): a `GET` and a `PTTL` per
    /// policy, in one pipeline.
    pub(crate) fn overrides(
        self: &Arc<Self>,
        key: &Key,
        policies: &[Policy],
    ) -> BoxFuture<Result<Vec<ActiveOverride>, StoreError>> {
        let mut pipe = redis::pipe();
        for p in policies {
            let k = self.override_key(key, p);
            pipe.cmd("GET").arg(&k).cmd("PTTL").arg(&k);
        }
        let names: Vec<String> = policies.iter().map(|p| p.name().to_owned()).collect();
        let core = Arc::clone(self);
        Box::pin(async move {
            if names.is_empty() {
                return Ok(vec![]);
            }
            let mut conn = core.connector.connection().await?;
            let replies: Vec<(Option<Vec<u8>>, i64)> =
                pipe.query_async(&mut conn).await.map_err(store_error)?;
            Ok(names
                .into_iter()
                .zip(replies)
                .filter_map(|(name, (value, pttl))| {
                    let (limit, capacity) = wire::read_override(&value?)?;
                    let expires = (pttl > 0).then(|| Duration::from_millis(pttl as u64));
                    Some(ActiveOverride::new(name, limit, capacity, expires))
                })
                .collect())
        })
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

/// The future of a charge that takes an in-flight slot. The slot is named by the client
/// ([`next_slot`]), so a caller that gives up before the answer (a timeout, a client gone,
/// an HTTP/2 stream reset) does not need the reply to give it back: when this future is
/// dropped unfinished, the call it was waiting on is finished on the current Tokio runtime
/// and, if it took the slot, the slot is released at once. The release is sent after the
/// charge's reply, so it cannot overtake the charge on another connection. Without a
/// runtime (dropped outside one), the slot comes back when its lease ends.
struct SlotCharge<C: Connector> {
    /// `None` once answered.
    call: Option<BoxFuture<Result<Decision, StoreError>>>,
    core: Arc<Core<C>>,
    key: Key,
    /// The in-flight policies of the charge: the ones a release names.
    held: SmallVec<[Policy; 1]>,
    slot: u64,
}

impl<C: Connector> Future for SlotCharge<C> {
    type Output = Result<Decision, StoreError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let Some(call) = self.call.as_mut() else {
            return std::task::Poll::Ready(Err(StoreError::Protocol(Cause::from(
                "a slot charge polled after it answered",
            ))));
        };
        let outcome = std::task::ready!(call.as_mut().poll(cx));
        self.call = None;
        let slot = self.slot;
        std::task::Poll::Ready(outcome.map(|d| if d.is_allowed() { d.with_slot(slot) } else { d }))
    }
}

impl<C: Connector> Drop for SlotCharge<C> {
    fn drop(&mut self) {
        let Some(call) = self.call.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                target: "tollgate::store",
                "an in-flight charge was dropped outside a Tokio runtime; its slot, if taken, comes back when its lease ends"
            );
            return;
        };
        let core = Arc::clone(&self.core);
        let key = self.key.clone();
        let held = std::mem::take(&mut self.held);
        let slot = self.slot;
        runtime.spawn(async move {
            if let Ok(decision) = call.await {
                if decision.is_allowed() {
                    if let Err(error) = core.apply(&key, &held, Op::Release { slot }).await {
                        tracing::warn!(
                            target: "tollgate::store",
                            %error,
                            "giving back the slot of a cancelled in-flight charge failed; it comes back when its lease ends"
                        );
                    }
                }
            }
        });
    }
}

/// A name for an in-flight slot, unique among the slots held at once: 32 random bits per
/// process, then a 21-bit counter, so below 2^53 (exact as a Lua number) and never 0. Two
/// processes collide only if they drew the same 32 bits; a counter wraps after two million
/// slots, long after any slot of its first round has been given back or has expired.
pub(crate) fn next_slot() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    static BASE: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let base = *BASE.get_or_init(|| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        h.write_u64(nanos);
        (h.finish() & 0xFFFF_FFFF) << 21
    });
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed) & 0x1F_FFFF;
        if n != 0 {
            return base | n;
        }
    }
}

#[cfg(test)]
mod tests;
