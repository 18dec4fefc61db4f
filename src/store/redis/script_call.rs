//! One `EVALSHA`, built straight into the command's buffer.
//!
//! redis-rs's `ScriptInvocation` keeps each key and argument in a `Vec` of its own and copies
//! them all into a new command on every send: a dozen allocations and copies per decision on
//! the store's hottest path. A [`ScriptCall`] writes keys and arguments once, in order, into
//! one [`Cmd`], and loads the script on `NOSCRIPT` as `ScriptInvocation` does.

use std::sync::atomic::{AtomicBool, Ordering};

use redis::{Cmd, ErrorKind, RedisResult, Script, ServerErrorKind, ToRedisArgs};

/// An `EVALSHA` of `script` naming as many keys as it was made for: the keys first
/// ([`key`](Self::key)), then the arguments ([`arg`](Self::arg)).
pub(crate) struct ScriptCall {
    script: &'static Script,
    cmd: Cmd,
    keys: usize,
    args: usize,
}

impl std::fmt::Debug for ScriptCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Keys and arguments carry request data: only their counts are shown.
        f.debug_struct("ScriptCall")
            .field("script", &self.script.get_hash())
            .field("keys", &self.keys)
            .field("args", &self.args)
            .finish()
    }
}

impl ScriptCall {
    /// A call of `script` naming `keys` keys, with room for about `args` arguments of
    /// `bytes` bytes in all.
    pub(crate) fn new(script: &'static Script, keys: usize, args: usize, bytes: usize) -> Self {
        let mut cmd = Cmd::with_capacity(3 + keys + args, 64 + bytes);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
        Self {
            script,
            cmd,
            keys,
            args: 0,
        }
    }

    pub(crate) fn key(&mut self, key: impl ToRedisArgs) -> &mut Self {
        self.cmd.arg(key);
        self
    }

    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.cmd.arg(arg);
        self.args += 1;
        self
    }

    /// The command as it will be sent.
    #[cfg(test)]
    pub(crate) fn cmd(&self) -> &Cmd {
        &self.cmd
    }

    /// Sends the call; on `NOSCRIPT` (a restarted or flushed server) loads the script and
    /// sends it once more, and sets `reloaded`: the server may be another one than before.
    pub(crate) async fn send<C>(&self, conn: &mut C, reloaded: &AtomicBool) -> RedisResult<Vec<u8>>
    where
        C: redis::aio::ConnectionLike + Send,
    {
        match self.cmd.query_async(conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                reloaded.store(true, Ordering::Release);
                self.script.load_async(conn).await?;
                self.cmd.query_async(conn).await
            }
            other => other,
        }
    }
}
