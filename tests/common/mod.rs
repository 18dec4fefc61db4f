//! Helpers shared by the integration tests.

use std::net::SocketAddr;

use axum::Router;

/// Serves `app` on a free loopback port, recording peer addresses; returns the address.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
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

/// Keys requests by their `x-tenant` header (none: no key).
#[allow(dead_code)] // not every test binary keys by tenant
pub fn by_tenant() -> impl tollgate::key::KeyExtractor {
    tollgate::key::from_fn(|req: &tollgate::key::RequestView<'_>| {
        let tenant = req.headers().get("x-tenant")?.to_str().ok()?;
        Some(tollgate::key::Key::new("tenant", tenant))
    })
}

/// A loopback port that was free when asked (for a server to bind, or for a store that must
/// find nothing listening).
#[allow(dead_code)] // not every test binary needs a port of its own
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}
