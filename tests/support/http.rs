//! Serving an axum app on loopback, reading what a test server logged, keying by tenant.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;

/// Serves `app` on a free loopback port, recording peer addresses; returns the address.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    serve_on(listener, app)
}

/// Serves `app` on `listener` (an IPv6 one, say), recording peer addresses.
pub fn serve_on(listener: tokio::net::TcpListener, app: Router) -> SocketAddr {
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

/// Captures what a `tracing` subscriber writes, for tests that check log lines.
#[derive(Clone, Default)]
pub struct Logs(pub Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// Captures what this thread logs at `level` and above until the guard is dropped.
    pub fn capture(level: tracing::Level) -> (Self, tracing::subscriber::DefaultGuard) {
        let logs = Self::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Keys requests by their `x-tenant` header (none: no key).
pub fn by_tenant() -> impl tollgate::key::KeyExtractor {
    tollgate::key::from_fn(|req: &tollgate::key::RequestView<'_>| {
        let tenant = req.headers().get("x-tenant")?.to_str().ok()?;
        Some(tollgate::key::Key::new("tenant", tenant))
    })
}
