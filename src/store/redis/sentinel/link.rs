//! The master as Sentinel names it: resolved on first use, dropped when a connection to it
//! fails or a write meets `READONLY`, and resolved again by the next call, at most once per
//! resolve interval.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, ServerErrorKind,
    Value,
};

use super::super::connector::store_error;
use crate::error::{Cause, StoreError};

/// The master in use: its address and the one multiplexed connection to it.
struct Master {
    address: Box<str>,
    connection: MultiplexedConnection,
    /// Which resolution made it, so that a failure on an older master's connection does
    /// not drop a newer one.
    epoch: u64,
    /// How long the master has gone without answering calls given up on.
    silence: Silence,
}

/// What a call given up on says about its master.
#[derive(Debug, PartialEq, Eq)]
enum Silent {
    /// No reply to calls given up on for this long (ms).
    For(u64),
    /// The first call given up on after a quiet time: whether the master answers is unknown.
    AfterQuiet,
}

/// How long a master has gone without a reply while calls to it were given up on, in
/// [`Link::now`] units.
#[derive(Default)]
struct Silence {
    /// When the oldest call still unanswered was sent (0: none): set by a call whose caller
    /// gave up, cleared by any reply.
    unanswered_since: AtomicU64,
    /// When a caller last gave up on a call (0: never).
    last_abandoned: AtomicU64,
}

impl Silence {
    /// A call sent at `sent` was given up at `now`: how long the master has been silent,
    /// counted from the oldest call given up since the last reply — unless no call was
    /// given up for longer than `timeout` before this one was sent: a quiet time with no
    /// calls is not a master that does not answer, and the reply to the call given up
    /// before it may have come unseen. The silence then starts with this call, and the
    /// master is to be asked whether it answers ([`Silent::AfterQuiet`]).
    fn abandoned(&self, sent: u64, now: u64, timeout: u64) -> Silent {
        let last = self.last_abandoned.swap(now, Ordering::AcqRel);
        if last != 0 && sent.saturating_sub(last) > timeout {
            self.unanswered_since.store(sent, Ordering::Release);
            return Silent::AfterQuiet;
        }
        let _ =
            self.unanswered_since
                .compare_exchange(0, sent, Ordering::AcqRel, Ordering::Acquire);
        match self.unanswered_since.load(Ordering::Acquire) {
            0 => Silent::For(0),
            since => Silent::For(now.saturating_sub(since)),
        }
    }

    /// The master answered.
    fn answered(&self) {
        self.unanswered_since.store(0, Ordering::Release);
    }
}

/// One sentinel, with the connection redis-rs keeps to it; locked by the lookup asking it.
type OneSentinel = Arc<tokio::sync::Mutex<Sentinel>>;

/// What a resolution attempt left behind, under the resolution lock.
struct Resolver {
    /// Each sentinel on its own, so that they are asked at once and the first valid answer
    /// is taken: a sentinel that does not answer (its host down behind a firewall) must not
    /// hold up the others.
    sentinels: Box<[OneSentinel]>,
    /// When the last attempt started (successful or not).
    last_attempt: Option<Instant>,
    /// The address of the last master resolved: a different one is a switch.
    last_address: Option<Box<str>>,
    /// Since when no master has been in use (the first failure seen), for the metric.
    lost_since: Option<Instant>,
}

/// The state every connection of one store shares.
pub(crate) struct Link {
    master_name: Box<str>,
    sentinels: Box<[String]>,
    node: SentinelNodeConnectionInfo,
    config: AsyncConnectionConfig,
    /// The bound on one resolution: every sentinel asked, the master connected and checked.
    timeout: Duration,
    /// The least time between two resolution attempts.
    interval: Duration,
    master: ArcSwapOption<Master>,
    resolver: tokio::sync::Mutex<Resolver>,
    epochs: AtomicU64,
    switches: AtomicU64,
    /// The origin of [`Link::now`].
    base: Instant,
}

impl fmt::Debug for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sentinel")
            .field("master_name", &self.master_name)
            .field("sentinels", &self.sentinels)
            .field("master", &self.master_address())
            .field("resolve_interval", &self.interval)
            .finish()
    }
}

/// Whether `e` says the connection may no longer reach a master: the server is gone, or
/// stalled (a timeout: a stopped master stays "up" to its socket while Sentinel promotes
/// another). A slow but healthy master costs one resolution that finds it again.
fn master_lost(e: &RedisError) -> bool {
    e.is_timeout()
        || e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
        || e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
}

/// Whether a reply says the server is a replica now: a write met `READONLY`. Server errors
/// arrive as values here; redis-rs makes them errors only when a reply is read.
fn demoted(reply: &Value) -> bool {
    match reply {
        Value::ServerError(e) => {
            e.kind() == Some(ServerErrorKind::ReadOnly) || e.code() == "READONLY"
        }
        Value::Array(items) => items.iter().any(demoted),
        _ => false,
    }
}

impl Link {
    pub(crate) fn new(
        each: Vec<Sentinel>,
        sentinels: Box<[String]>,
        master_name: Box<str>,
        timeout: Duration,
        interval: Duration,
    ) -> Self {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        Self {
            master_name,
            sentinels,
            node: SentinelNodeConnectionInfo::default(),
            config,
            timeout,
            interval,
            master: ArcSwapOption::empty(),
            resolver: tokio::sync::Mutex::new(Resolver {
                sentinels: each
                    .into_iter()
                    .map(|s| Arc::new(tokio::sync::Mutex::new(s)))
                    .collect(),
                last_attempt: None,
                last_address: None,
                lost_since: None,
            }),
            epochs: AtomicU64::new(0),
            switches: AtomicU64::new(0),
            base: Instant::now(),
        }
    }

    pub(crate) fn master_name(&self) -> &str {
        &self.master_name
    }

    pub(crate) fn master_address(&self) -> Option<String> {
        self.master.load().as_ref().map(|m| m.address.to_string())
    }

    /// How many masters the link has connected to (the epoch of the latest).
    pub(crate) fn epoch(&self) -> u64 {
        self.epochs.load(Ordering::Acquire)
    }

    pub(crate) fn switches(&self) -> u64 {
        self.switches.load(Ordering::Relaxed)
    }

    /// A connection to the master, resolving it first when none is in use.
    pub(crate) async fn connection(self: &Arc<Self>) -> Result<Watched, StoreError> {
        if let Some(master) = self.master.load_full() {
            return Ok(self.watched(&master));
        }
        // A task of its own: callers give up after their own (often far shorter) timeout,
        // and a resolution that each of them cancelled would never finish.
        let link = Arc::clone(self);
        match tokio::spawn(link.resolve()).await {
            Ok(master) => master.map(|m| self.watched(&m)),
            Err(e) => Err(StoreError::Connection(Cause::from(format!(
                "the resolution of the Redis master failed: {e}"
            )))),
        }
    }

    fn watched(self: &Arc<Self>, master: &Arc<Master>) -> Watched {
        Watched {
            connection: master.connection.clone(),
            link: Arc::clone(self),
            master: Arc::clone(master),
        }
    }

    /// Milliseconds since the link was made, plus one (0 means "none" where it is stored).
    fn now(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1)
    }

    /// A call to `master` sent at `sent` was given up by its caller. Callers usually give up
    /// long before the connection's own timeout, so a stalled master (a stopped process, a
    /// partition) would never fail a call: once calls have gone unanswered for longer than
    /// the timeout, with no reply meanwhile, the master is dropped as lost.
    fn abandoned(self: &Arc<Self>, master: &Arc<Master>, sent: u64) {
        let timeout = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
        match master.silence.abandoned(sent, self.now(), timeout) {
            Silent::For(silent) if silent > timeout => {
                self.lose(master.epoch, format_args!("no reply for {silent} ms"));
            }
            Silent::For(_) => {}
            Silent::AfterQuiet => self.probe(master),
        }
    }

    /// Asks `master` for a `PING` within the timeout, in a task of its own: a reply ends
    /// its silence, none drops it as lost. Without a runtime, the next call given up on
    /// counts the silence from this one.
    fn probe(self: &Arc<Self>, master: &Arc<Master>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (link, master) = (Arc::clone(self), Arc::clone(master));
        let mut connection = master.connection.clone();
        runtime.spawn(async move {
            let ping = redis::cmd("PING");
            match tokio::time::timeout(link.timeout, ping.query_async::<String>(&mut connection))
                .await
            {
                Ok(Ok(_)) => master.silence.answered(),
                Ok(Err(e)) if !master_lost(&e) => master.silence.answered(),
                Ok(Err(e)) => link.lose(master.epoch, format_args!("{e}")),
                Err(_) => link.lose(
                    master.epoch,
                    format_args!("no reply to a PING for {} ms", link.timeout.as_millis()),
                ),
            }
        });
    }

    /// Drops the master of `epoch`, unless another has replaced it; later calls resolve
    /// again.
    fn lose(&self, epoch: u64, reason: fmt::Arguments<'_>) {
        let current = self.master.load();
        if current.as_ref().is_some_and(|m| m.epoch == epoch) {
            self.master.store(None);
            tracing::warn!(
                target: "tollgate::store",
                master = %self.master_name,
                reason = %reason,
                "lost the Redis master: asking Sentinel again"
            );
        }
    }

    /// Drops `master` when `reply` says it is lost or demoted.
    fn check<T>(
        &self,
        master: &Master,
        reply: &redis::RedisResult<T>,
        demoted: impl Fn(&T) -> bool,
    ) {
        match reply {
            Err(e) if master_lost(e) => self.lose(master.epoch, format_args!("{e}")),
            Err(_) => {}
            Ok(value) => {
                master.silence.answered();
                if demoted(value) {
                    self.lose(master.epoch, format_args!("READONLY: it is a replica now"));
                }
            }
        }
    }

    /// Asks the sentinels for the master and connects to it. One resolution at a time; a
    /// call that waited for another one's uses its master. Within the resolve interval of
    /// the last attempt, fails at once instead of asking again, so that neither a burst of
    /// requests nor a dead sentinel list turns into a storm of sentinel queries.
    async fn resolve(self: Arc<Self>) -> Result<Arc<Master>, StoreError> {
        let mut resolver = self.resolver.lock().await;
        if let Some(master) = self.master.load_full() {
            return Ok(master);
        }
        let now = Instant::now();
        resolver.lost_since.get_or_insert(now);
        if let Some(last) = resolver.last_attempt {
            let next = last + self.interval;
            if now < next {
                return Err(StoreError::Connection(Cause::from(format!(
                    "no Redis master for {:?} yet; Sentinel is asked again in {} ms",
                    self.master_name,
                    next.duration_since(now).as_millis()
                ))));
            }
        }
        resolver.last_attempt = Some(now);
        let found = tokio::time::timeout(self.timeout, self.find(&resolver.sentinels)).await;
        let (address, connection) = match found {
            Ok(Ok(found)) => found,
            Ok(Err(e)) => return Err(store_error(e)),
            Err(_) => return Err(StoreError::Timeout),
        };
        if resolver
            .last_address
            .as_ref()
            .is_some_and(|last| *last != address)
        {
            self.switches.fetch_add(1, Ordering::Relaxed);
            let lost_for = resolver.lost_since.map(|t| t.elapsed()).unwrap_or_default();
            crate::telemetry::sentinel_switch(lost_for);
            tracing::warn!(
                target: "tollgate::store",
                master = %self.master_name,
                address = %address,
                lost_ms = lost_for.as_millis() as u64,
                "the Redis master failed over: deciding on the new master"
            );
        }
        resolver.last_address = Some(address.clone());
        resolver.lost_since = None;
        let master = Arc::new(Master {
            address,
            connection,
            epoch: self.epochs.fetch_add(1, Ordering::AcqRel) + 1,
            silence: Silence::default(),
        });
        self.master.store(Some(Arc::clone(&master)));
        Ok(master)
    }

    /// The master the sentinels name, checked to be a master (`ROLE`) by redis-rs, and a
    /// connection to it. Every sentinel is asked at once; the first that names a master
    /// which answers as one wins, whatever its place in the list (the others' lookups are
    /// dropped).
    async fn find(
        &self,
        sentinels: &[OneSentinel],
    ) -> redis::RedisResult<(Box<str>, MultiplexedConnection)> {
        let mut lookups = tokio::task::JoinSet::new();
        for sentinel in sentinels {
            let sentinel = Arc::clone(sentinel);
            let name = self.master_name.clone();
            let node = self.node.clone();
            lookups.spawn(async move {
                let mut sentinel = sentinel.lock().await;
                sentinel.async_master_for(&name, Some(&node)).await
            });
        }
        let mut failure = RedisError::from((ErrorKind::EmptySentinelList, "no sentinel to ask"));
        while let Some(answer) = lookups.join_next().await {
            let client = match answer {
                Ok(Ok(client)) => client,
                Ok(Err(e)) => {
                    failure = e;
                    continue;
                }
                Err(e) => {
                    failure = RedisError::from((
                        ErrorKind::Client,
                        "a sentinel lookup failed",
                        e.to_string(),
                    ));
                    continue;
                }
            };
            let address = client.get_connection_info().addr().to_string();
            match client
                .get_multiplexed_async_connection_with_config(&self.config)
                .await
            {
                Ok(connection) => return Ok((address.into_boxed_str(), connection)),
                Err(e) => failure = e,
            }
        }
        Err(failure)
    }
}

/// A connection to the master that reports its failures to the [`Link`].
pub(crate) struct Watched {
    connection: MultiplexedConnection,
    link: Arc<Link>,
    master: Arc<Master>,
}

/// A call in flight: dropped before it is answered, it tells the link its caller gave up.
struct InFlight<'a> {
    link: &'a Arc<Link>,
    master: &'a Arc<Master>,
    sent: u64,
    answered: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.link.abandoned(self.master, self.sent);
        }
    }
}

impl<'a> InFlight<'a> {
    fn new(link: &'a Arc<Link>, master: &'a Arc<Master>) -> Self {
        InFlight {
            link,
            master,
            sent: link.now(),
            answered: false,
        }
    }
}

impl Watched {
    /// Sends one call through `send` and tells the link what came of it.
    fn watch<'a, T: Send + 'a>(
        &'a mut self,
        send: impl FnOnce(&'a mut MultiplexedConnection) -> RedisFuture<'a, T> + Send + 'a,
        demoted: fn(&T) -> bool,
    ) -> RedisFuture<'a, T> {
        Box::pin(async move {
            let Watched {
                connection,
                link,
                master,
            } = self;
            let mut call = InFlight::new(link, master);
            let reply = send(connection).await;
            call.answered = true;
            link.check(master, &reply, demoted);
            reply
        })
    }
}

impl ConnectionLike for Watched {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.watch(move |c| c.req_packed_command(cmd), demoted)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.watch(
            move |c| c.req_packed_commands(pipeline, offset, count),
            |values| values.iter().any(demoted),
        )
    }

    fn get_db(&self) -> i64 {
        self.connection.get_db()
    }
}

#[cfg(test)]
mod tests {
    use super::{Silence, Silent};

    #[test]
    fn calls_given_up_without_a_reply_for_longer_than_the_timeout_are_silence() {
        let silence = Silence::default();
        // A stalled master under load: a call given up every 50 ms, none answered.
        let mut silent = Silent::For(0);
        for sent in (1..=600).step_by(50) {
            silent = silence.abandoned(sent, sent + 50, 500);
        }
        assert_eq!(silent, Silent::For(600));
        // A reply ends it.
        silence.answered();
        assert_eq!(silence.abandoned(700, 750, 500), Silent::For(50));
    }

    #[test]
    fn a_quiet_time_between_two_calls_given_up_is_not_silence() {
        let silence = Silence::default();
        // One call given up, then nothing for ten seconds, then another given up 5 ms after
        // it was sent: the master was not asked meanwhile, and is asked now (a PING).
        assert_eq!(silence.abandoned(1, 51, 500), Silent::For(50));
        assert_eq!(silence.abandoned(10_000, 10_005, 500), Silent::AfterQuiet);
        // Calls given up on after it count from it.
        assert_eq!(silence.abandoned(10_050, 10_100, 500), Silent::For(100));
    }
}
