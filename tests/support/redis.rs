//! Test harness: real `redis-server` processes on free loopback ports, stopped on drop.
//!
//! [`RedisServer::start`] spawns one node; [`RedisCluster::start`] spawns three masters with
//! cluster mode on and assigns the slots with `redis-cli --cluster create`. Each process gets
//! its own temporary directory, no persistence, and is killed when the value is dropped.
//! Without `redis-server` on `PATH` the harness fails loudly; it never skips.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::free_port;

const INSTALL_HINT: &str = "redis-server (and redis-cli) must be on PATH for the Redis tests: \
     install them with `apt-get install redis-server` (Debian/Ubuntu) or `brew install redis`";

pub(super) fn require(binary: &str) {
    let found = Command::new(binary)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(found, "`{binary}` was not found. {INSTALL_HINT}");
}

pub(super) fn temp_dir(tag: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "tollgate-{tag}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("cannot create a temporary directory");
    dir
}

/// Sends one command to `url` over a fresh synchronous connection.
pub(super) fn query_at<T: redis::FromRedisValue>(
    url: &str,
    args: &[&str],
) -> redis::RedisResult<T> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(&mut conn)
}

/// Waits up to 10 s for the process `child` to answer `PING` at `url`.
pub(super) fn wait_for_pong(child: &mut Child, url: &str) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("the process exited with {status}"));
        }
        if query_at::<String>(url, &["PING"]).is_ok_and(|s| s == "PONG") {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err("no PONG within 10 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One `redis-server` process.
#[derive(Debug)]
pub struct RedisServer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl RedisServer {
    /// A standalone server.
    pub fn start() -> Self {
        Self::spawn(&[])
    }

    /// A standalone server started with `extra` arguments (`--replicaof`, …).
    pub fn start_with(extra: &[&str]) -> Self {
        Self::spawn(extra)
    }

    fn spawn(extra: &[&str]) -> Self {
        require("redis-server");
        let mut last_error = String::new();
        for _ in 0..5 {
            let port = free_port();
            let dir = temp_dir("redis");
            let mut cmd = Command::new("redis-server");
            cmd.arg("--port")
                .arg(port.to_string())
                .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .args(["--protected-mode", "no", "--daemonize", "no"])
                .arg("--dir")
                .arg(&dir)
                .args(extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if extra.contains(&"--cluster-enabled") {
                // The cluster bus needs a second free port.
                cmd.args(["--cluster-port", &free_port().to_string()]);
            }
            let child = cmd
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start redis-server: {e}. {INSTALL_HINT}"));
            let mut server = RedisServer { child, port, dir };
            match server.wait_ready() {
                Ok(()) => return server,
                Err(e) => last_error = e, // most likely the port was taken: try another
            }
        }
        panic!("redis-server did not start: {last_error}");
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let url = self.url();
        wait_for_pong(&mut self.child, &url)
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The process id (to stop and continue it).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The server's clock (`TIME`) in ms since the epoch.
    pub fn now_millis(&self) -> u64 {
        let (s, us): (u64, u64) = self.query(&["TIME"]).unwrap();
        s * 1000 + us / 1000
    }

    /// Sends one command over a fresh synchronous connection.
    pub fn query<T: redis::FromRedisValue>(&self, args: &[&str]) -> redis::RedisResult<T> {
        query_at(&self.url(), args)
    }

    /// Every key matching `pattern`, by `SCAN`.
    pub fn scan(&self, pattern: &str) -> Vec<String> {
        let client = redis::Client::open(self.url()).unwrap();
        let mut conn = client.get_connection().unwrap();
        let mut cursor: u64 = 0;
        let mut keys = Vec::new();
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .query(&mut conn)
                .unwrap();
            keys.extend(batch);
            if next == 0 {
                return keys;
            }
            cursor = next;
        }
    }

    /// A `deadpool-redis` pool of at most `size` connections to this server.
    pub fn pool(&self, size: usize) -> deadpool_redis::Pool {
        let mut cfg = deadpool_redis::Config::from_url(self.url());
        cfg.pool = Some(deadpool_redis::PoolConfig::new(size));
        cfg.create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .unwrap()
    }

    /// Kills the process with SIGKILL (no clean shutdown), keeping the port for
    /// [`restart`](Self::restart).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts a fresh server (empty, as after a crash without persistence) on the same port.
    pub fn restart(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let child = Command::new("redis-server")
                .arg("--port")
                .arg(self.port.to_string())
                .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .args(["--protected-mode", "no", "--daemonize", "no"])
                .arg("--dir")
                .arg(&self.dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start redis-server: {e}. {INSTALL_HINT}"));
            self.child = child;
            match self.wait_ready() {
                Ok(()) => return,
                Err(e) if Instant::now() > deadline => panic!("redis-server did not restart: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Calls of a command so far, from `INFO commandstats` (e.g. `evalsha`).
    pub fn command_calls(&self, command: &str) -> u64 {
        let info: String = self.query(&["INFO", "commandstats"]).unwrap();
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// Sends a signal (`STOP`, `CONT`) to the process.
    pub fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{signal} failed");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // A stopped process must be continued to die promptly after SIGKILL on some systems.
        let _ = Command::new("kill")
            .arg("-CONT")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Three cluster-mode masters sharing the 16384 slots.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three masters, assigns the slots and waits for `cluster_state:ok` everywhere.
    pub fn start() -> Self {
        require("redis-cli");
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                RedisServer::spawn(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli: {e}. {INSTALL_HINT}"));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_ok();
        cluster
    }

    fn wait_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = self.nodes.iter().all(|n| {
                n.query::<String>(&["CLUSTER", "INFO"])
                    .is_ok_and(|info| info.contains("cluster_state:ok"))
            });
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not reach cluster_state:ok in 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Every node's URL.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The node that owns `key`'s slot.
    pub fn owner(&self, key: &str) -> usize {
        let slot: u16 = self.nodes[0].query(&["CLUSTER", "KEYSLOT", key]).unwrap();
        let slots: redis::Value = self.nodes[0].query(&["CLUSTER", "SLOTS"]).unwrap();
        let redis::Value::Array(ranges) = slots else {
            panic!("unexpected CLUSTER SLOTS reply")
        };
        for range in ranges {
            let redis::Value::Array(parts) = range else {
                continue;
            };
            let (redis::Value::Int(lo), redis::Value::Int(hi)) = (&parts[0], &parts[1]) else {
                continue;
            };
            if (*lo..=*hi).contains(&i64::from(slot)) {
                let redis::Value::Array(master) = &parts[2] else {
                    continue;
                };
                let redis::Value::Int(port) = master[1] else {
                    continue;
                };
                return self
                    .nodes
                    .iter()
                    .position(|n| i64::from(n.port()) == port)
                    .expect("slot owned by an unknown node");
            }
        }
        panic!("slot {slot} is not assigned");
    }

    /// Every key matching `pattern` on every node.
    pub fn scan(&self, pattern: &str) -> Vec<String> {
        self.nodes.iter().flat_map(|n| n.scan(pattern)).collect()
    }
}
