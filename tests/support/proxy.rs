//! A TCP proxy on loopback that makes a server's replies late: what the client sends goes
//! through at once, what the server answers is delayed (by a set time) or held (until the
//! test releases it). A command sent through it is really sent and executed; only its reply
//! is late, as on a slow network or behind a stalled load balancer.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

struct State {
    upstream: SocketAddr,
    delay_ms: AtomicU64,
    /// Bytes the server has answered so far (held or not).
    answered: AtomicU64,
    /// While true, the server's answers wait in the proxy.
    hold: watch::Sender<bool>,
    /// While true, the link is cut: connections are closed and new ones refused.
    cut: watch::Sender<bool>,
}

/// A delaying proxy in front of `upstream`, running on the current Tokio runtime until
/// dropped.
pub struct Proxy {
    addr: SocketAddr,
    state: Arc<State>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// A proxy to `127.0.0.1:<port>`.
    pub async fn start(port: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            upstream: SocketAddr::from(([127, 0, 0, 1], port)),
            delay_ms: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            hold: watch::channel(false).0,
            cut: watch::channel(false).0,
        });
        let shared = Arc::clone(&state);
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                if *shared.cut.borrow() {
                    drop(client);
                    continue;
                }
                let state = Arc::clone(&shared);
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(state.upstream).await {
                        pump(client, server, state).await;
                    }
                });
            }
        });
        Proxy { addr, state, task }
    }

    /// `redis://` URL of the proxy.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Delays every answer of the server by `delay` from when it reached the proxy.
    pub fn set_delay(&self, delay: Duration) {
        self.state
            .delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// Holds the server's answers in the proxy until [`release`](Self::release).
    pub fn hold(&self) {
        self.state.hold.send_replace(true);
    }

    /// Lets held answers (and later ones) through.
    pub fn release(&self) {
        self.state.hold.send_replace(false);
    }

    /// Cuts the link, as a network partition: open connections are closed and new ones
    /// refused, until [`heal`](Self::heal).
    pub fn cut(&self) {
        self.state.cut.send_replace(true);
    }

    /// Ends a [`cut`](Self::cut).
    pub fn heal(&self) {
        self.state.cut.send_replace(false);
    }

    /// Bytes the server has answered so far, whether or not they reached the client.
    pub fn answered(&self) -> u64 {
        self.state.answered.load(Ordering::SeqCst)
    }

    /// Waits until the server has answered more than `bytes` bytes in all (a command sent
    /// before was executed); false after `within`.
    pub async fn wait_answered_beyond(&self, bytes: u64, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while self.answered() <= bytes {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        true
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pump(client: TcpStream, server: TcpStream, state: Arc<State>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let mut cut = state.cut.subscribe();
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if server_write.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = server_write.shutdown().await;
    };
    let down = async move {
        let mut buf = vec![0u8; 64 * 1024];
        let mut hold = state.hold.subscribe();
        loop {
            match server_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let arrived = tokio::time::Instant::now();
                    state.answered.fetch_add(n as u64, Ordering::SeqCst);
                    if hold.wait_for(|held| !held).await.is_err() {
                        break;
                    }
                    let delay = Duration::from_millis(state.delay_ms.load(Ordering::SeqCst));
                    tokio::time::sleep_until(arrived + delay).await;
                    if client_write.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = client_write.shutdown().await;
    };
    // A cut drops both halves, which closes both sockets.
    tokio::select! {
        _ = async { tokio::join!(up, down) } => {}
        _ = cut.wait_for(|c| *c) => {}
    }
}
