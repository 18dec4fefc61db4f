//! How the engine reaches Redis: a [`Connector`] hands out connections (from a pool, or a
//! handle to one shared connection), and redis-rs and pool errors become [`StoreError`]s.

use std::future::Future;

use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};

use crate::error::{Cause, StoreError};

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
    type Conn: ConnectionLike + Send + 'static;

    /// What decisions must share to go in one script call: nothing on one server, the hash
    /// hash slot in a cluster.
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

    /// How many servers the connector has moved to (a Sentinel store's masters; always 0
    /// for a fixed address): when it moves, the next answer comes from another server,
    /// whose `run_id` is read then, whatever ended the last one (a failure, `READONLY`, a
    /// stall callers gave up on).
    fn server_epoch(&self) -> u64 {
        0
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

/// A pool that could not hand out a connection.
pub(crate) fn pool_error(e: deadpool_redis::PoolError) -> StoreError {
    match e {
        deadpool_redis::PoolError::Timeout(_) => StoreError::Timeout,
        deadpool_redis::PoolError::Backend(e) => store_error(e),
        other => StoreError::Connection(Cause::from(other.to_string())),
    }
}
