//! Test harness: a Redis master, one replica and three sentinels (quorum 2) on free loopback
//! ports, each with its own temporary directory and config file, all killed on drop (a panic
//! included).
//!
//! Sentinels run as `redis-sentinel <conf>` when that binary exists, else as
//! `redis-server <conf> --sentinel`, which is the same program. They declare the master down
//! after 500 ms, so a killed master is replaced within a couple of seconds.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::free_port;
use super::redis::{query_at, require, temp_dir, wait_for_pong, RedisServer};

/// The name the sentinels monitor the master by.
pub const MASTER_NAME: &str = "mymaster";

/// One sentinel process.
#[derive(Debug)]
struct SentinelProcess {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A master, a replica and three sentinels.
#[derive(Debug)]
pub struct SentinelSet {
    // Sentinels first: dropped before the servers, so none starts a failover meanwhile.
    sentinels: Vec<SentinelProcess>,
    pub master: RedisServer,
    pub replica: RedisServer,
}

fn sentinel_command() -> Command {
    let direct = Command::new("redis-sentinel")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if direct {
        Command::new("redis-sentinel")
    } else {
        require("redis-server");
        Command::new("redis-server")
    }
}

impl SentinelProcess {
    fn start(master_port: u16) -> Self {
        let mut last_error = String::new();
        for _ in 0..5 {
            let port = free_port();
            let dir = temp_dir("sentinel");
            let conf = dir.join("sentinel.conf");
            let text = format!(
                "port {port}\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\ndir {dir}\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} 500\n\
                 sentinel failover-timeout {MASTER_NAME} 3000\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n",
                dir = dir.display()
            );
            std::fs::write(&conf, text).expect("cannot write a sentinel config");
            let mut cmd = sentinel_command();
            let is_server = cmd.get_program() == "redis-server";
            cmd.arg(&conf);
            if is_server {
                cmd.arg("--sentinel");
            }
            let child = cmd
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("cannot start a sentinel");
            let mut sentinel = SentinelProcess { child, port, dir };
            match sentinel.wait_ready() {
                Ok(()) => return sentinel,
                Err(e) => last_error = e,
            }
        }
        panic!("a sentinel did not start: {last_error}");
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn query<T: redis::FromRedisValue>(&self, args: &[&str]) -> redis::RedisResult<T> {
        query_at(&self.url(), args)
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let url = self.url();
        wait_for_pong(&mut self.child, &url)
    }

    /// How many other sentinels and replicas this sentinel knows of.
    fn known(&self) -> (usize, usize) {
        let others: Vec<redis::Value> = self
            .query(&["SENTINEL", "SENTINELS", MASTER_NAME])
            .unwrap_or_default();
        let replicas: Vec<redis::Value> = self
            .query(&["SENTINEL", "REPLICAS", MASTER_NAME])
            .unwrap_or_default();
        (others.len(), replicas.len())
    }
}

impl SentinelSet {
    /// Starts the set and waits until the replica is in sync and every sentinel knows the
    /// other two and the replica (without which no failover can be agreed).
    pub fn start() -> Self {
        // Diskless sync without delay: the replica is in sync at once.
        let master = RedisServer::start_with(&[
            "--repl-diskless-sync",
            "yes",
            "--repl-diskless-sync-delay",
            "0",
        ]);
        let port = master.port().to_string();
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
        wait_until("the replica syncs", Duration::from_secs(15), || {
            replica
                .query::<String>(&["INFO", "replication"])
                .is_ok_and(|i| i.contains("master_link_status:up"))
        });
        let sentinels: Vec<_> = (0..3)
            .map(|_| SentinelProcess::start(master.port()))
            .collect();
        wait_until(
            "the sentinels find each other and the replica",
            Duration::from_secs(30),
            || sentinels.iter().all(|s| s.known() == (2, 1)),
        );
        SentinelSet {
            sentinels,
            master,
            replica,
        }
    }

    /// The sentinels' URLs.
    pub fn urls(&self) -> Vec<String> {
        self.sentinels.iter().map(SentinelProcess::url).collect()
    }

    /// The master's address as the first sentinel that answers names it (`host:port`).
    pub fn master_address(&self) -> Option<String> {
        self.sentinels.iter().find_map(|s| {
            s.query::<(String, String)>(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME])
                .ok()
                .map(|(host, port)| format!("{host}:{port}"))
        })
    }

    /// A manual failover (`SENTINEL FAILOVER`): the replica is promoted once in sync, the
    /// master demoted to its replica.
    pub fn failover(&self) {
        let done = self.sentinels.iter().any(|s| {
            s.query::<String>(&["SENTINEL", "FAILOVER", MASTER_NAME])
                .is_ok_and(|r| r == "OK")
        });
        assert!(done, "no sentinel accepted SENTINEL FAILOVER");
    }

    /// Whether the first server (`master`) is the one the sentinels name as master now.
    fn first_is_master(&self) -> bool {
        let address = self.master_address().expect("no sentinel names a master");
        address.ends_with(&format!(":{}", self.master.port()))
    }

    /// The server the sentinels name as master, and the other one.
    pub fn roles(&self) -> (&RedisServer, &RedisServer) {
        if self.first_is_master() {
            (&self.master, &self.replica)
        } else {
            (&self.replica, &self.master)
        }
    }

    /// Waits until the server that is not the master is its replica, in sync, and every
    /// sentinel knows the other two and that replica: ready for the next failover.
    pub fn wait_settled(&self) {
        wait_until("the set settles", Duration::from_secs(30), || {
            let (master, other) = self.roles();
            // Up, and to the master the sentinels name: after a failover the old master
            // may still be syncing from, or linked to, a server that is no longer master.
            other
                .query::<String>(&["INFO", "replication"])
                .is_ok_and(|i| {
                    i.contains("master_link_status:up")
                        && i.contains(&format!("master_port:{}\r\n", master.port()))
                        && !i.contains("master_sync_in_progress:1")
                })
                && self.sentinels.iter().all(|s| s.known() == (2, 1))
        });
    }

    /// Kills the server the sentinels name as master with SIGKILL: when it is dead.
    ///
    /// First waits until the replica has acknowledged every write the master took so far
    /// (`WAIT 1`): a replica linked and not syncing when the load began can still start a
    /// full resync under it, and a kill in the middle of one would lose everything before
    /// the kill, not only the last moments' writes that a failover may lose by design.
    pub fn kill_master(&mut self) -> Instant {
        let (master, _) = self.roles();
        wait_until(
            "the replica acknowledges the master's writes",
            Duration::from_secs(15),
            || {
                master
                    .query::<i64>(&["WAIT", "1", "500"])
                    .is_ok_and(|acknowledged| acknowledged >= 1)
            },
        );
        if self.first_is_master() {
            self.master.kill();
        } else {
            self.replica.kill();
        }
        Instant::now()
    }
}

/// Polls `done` every 50 ms until it holds; panics after `limit`.
pub fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
