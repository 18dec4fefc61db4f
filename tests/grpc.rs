//! gRPC end to end: `RateLimitLayer` on a real tonic server (the standard health service),
//! called by a real tonic client.
//!
//! One limiter wraps the whole server; per-method limits come from its route table (gRPC
//! methods are paths, `/package.Service/Method`) or from keying by the path.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate::clock::ManualClock;
use tollgate::key::Global;
use tollgate::key::{from_fn, Key};
use tollgate::route::Route;
use tollgate::store::{MemoryStore, Store};
use tollgate::{Algorithm, Limiter, Policy, Rate, RateLimitLayer};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Endpoint, Server};
use tonic::Code;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_types::StatusExt;

// 3.25 s into a 10 s window.
const T0: u64 = 1_796_205_603_250;

async fn serve<St: Store>(layer: RateLimitLayer<St>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    tokio::spawn(async move {
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    addr
}

async fn client(addr: SocketAddr, from: Option<u8>) -> HealthClient<tonic::transport::Channel> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .local_address(from.map(|n| IpAddr::V4(Ipv4Addr::new(127, 0, 0, n))))
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
}

fn check() -> HealthCheckRequest {
    HealthCheckRequest {
        service: String::new(),
    }
}

/// Keyed by the gRPC method: a per-method limit shared by all callers.
fn per_method(
) -> tollgate::key::FnExtractor<impl Fn(&tollgate::key::RequestView<'_>) -> Option<Key>> {
    from_fn(|req| Some(Key::new("grpc-method", req.uri().path())))
}

fn limiter(clock: &ManualClock, policy: Policy) -> Limiter {
    Limiter::builder()
        .store(MemoryStore::builder().clock(clock.clone()).build().unwrap())
        .policy(policy)
        .extractor(per_method())
        .build()
        .unwrap()
}

fn fixed(name: &str, limit: u64) -> tollgate::PolicyBuilder {
    Policy::builder(name, Rate::new(limit, Duration::from_secs(10)))
        .algorithm(Algorithm::FixedWindow)
}

#[tokio::test]
async fn a_denied_call_is_resource_exhausted_with_retry_info() {
    let clock = ManualClock::new(T0);
    let addr = serve(RateLimitLayer::new(limiter(
        &clock,
        fixed("health", 2).build().unwrap(),
    )))
    .await;
    let mut c = client(addr, None).await;
    for remaining in ["1", "0"] {
        let res = c.check(check()).await.expect("allowed");
        assert_eq!(res.get_ref().status, 1); // SERVING
        assert_eq!(
            res.metadata().get("ratelimit-remaining").unwrap(),
            remaining
        );
    }
    let status = c
        .check(check())
        .await
        .expect_err("third call is over the limit");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(
        status.message(),
        "Rate limit exceeded: 2 per 10 seconds (health). Retry in 7 s."
    );
    assert_eq!(status.metadata().get("retry-after").unwrap(), "7");
    // What gRPC's own retry policy reads (it reads neither `retry-after` nor RetryInfo).
    assert_eq!(
        status.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "6750"
    );
    assert_eq!(status.metadata().get("ratelimit-remaining").unwrap(), "0");
    let details = status.get_error_details();
    let retry = details.retry_info().expect("RetryInfo detail");
    // The window ends at :10.000, 6.75 s after T0.
    assert_eq!(retry.retry_delay, Some(Duration::from_millis(6_750)));

    // When the window flips, the method is callable again.
    clock.advance(Duration::from_millis(6_750));
    assert!(c.check(check()).await.is_ok());
}

#[tokio::test]
async fn limits_are_per_method() {
    let clock = ManualClock::new(T0);
    let addr = serve(RateLimitLayer::new(limiter(
        &clock,
        fixed("per-method", 1).build().unwrap(),
    )))
    .await;
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = HealthClient::new(channel.clone());
    assert!(c.check(check()).await.is_ok());
    assert_eq!(
        c.check(check()).await.unwrap_err().code(),
        Code::ResourceExhausted
    );
    // Another method of the same service has its own quota: `Watch` is allowed, and its
    // first message arrives.
    let mut stream = c.watch(check()).await.expect("watch allowed").into_inner();
    assert_eq!(stream.message().await.unwrap().unwrap().status, 1);
}

#[tokio::test]
async fn a_sensitive_policy_says_nothing_about_counts() {
    let clock = ManualClock::new(T0);
    let policy = fixed("auth", 1).sensitive(true).build().unwrap();
    let addr = serve(RateLimitLayer::new(limiter(&clock, policy))).await;
    let mut c = client(addr, None).await;
    let res = c.check(check()).await.unwrap();
    assert!(res.metadata().get("ratelimit-remaining").is_none());
    let status = c.check(check()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(
        status.message(),
        "Too many requests. Please try again later."
    );
    assert!(status.metadata().get("ratelimit-limit").is_none());
    assert!(status.metadata().get("ratelimit-remaining").is_none());
    assert_eq!(status.metadata().get("retry-after").unwrap(), "7");
    assert!(status.get_error_details().retry_info().is_some());
}

#[tokio::test]
async fn a_call_without_a_key_is_invalid_argument() {
    let limiter = Limiter::builder()
        .policy(Policy::new("p", Rate::per_second(10)).unwrap())
        .extractor(from_fn(|req| {
            let tenant = req.headers().get("x-tenant")?;
            Some(Key::new("tenant", tenant.as_bytes()))
        }))
        .build()
        .unwrap();
    let addr = serve(RateLimitLayer::new(limiter)).await;
    let mut c = client(addr, None).await;
    let status = c.check(check()).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let mut req = tonic::Request::new(check());
    req.metadata_mut()
        .insert("x-tenant", "acme".parse().unwrap());
    assert!(c.check(req).await.is_ok());
}

/// A memory store that answers its first check and fails every later one.
#[derive(Debug, Clone)]
struct FailsAfterFirst {
    inner: MemoryStore,
    calls: Arc<AtomicU32>,
}

impl Store for FailsAfterFirst {
    type CheckFuture = std::future::Ready<Result<tollgate::Decision, tollgate::StoreError>>;

    fn check(&self, key: &Key, policies: &[Policy], costs: &[u64]) -> Self::CheckFuture {
        if self.calls.fetch_add(1, Ordering::Relaxed) == 0 {
            std::future::ready(
                self.inner
                    .check_now(key, policies, costs)
                    .expect("answers at once"),
            )
        } else {
            std::future::ready(Err(tollgate::StoreError::Connection("down".into())))
        }
    }

    fn apply(
        &self,
        key: &Key,
        policies: &[Policy],
        op: tollgate::store::Op,
    ) -> tollgate::store::ApplyFuture {
        self.inner.apply(key, policies, op)
    }

    fn now_millis(&self) -> u64 {
        self.inner.now_millis()
    }

    fn name(&self) -> &'static str {
        "fails-after-first"
    }
}

#[tokio::test]
async fn a_failing_store_is_unavailable() {
    // A store that decides the first call and fails every other (fail closed).
    let store = FailsAfterFirst {
        inner: MemoryStore::new(),
        calls: Arc::new(AtomicU32::new(0)),
    };
    let limiter = Limiter::builder()
        .store(store)
        .policy(Policy::new("p", Rate::per_minute(100)).unwrap())
        .extractor(per_method())
        .build()
        .unwrap();
    let addr = serve(RateLimitLayer::new(limiter)).await;
    let mut c = client(addr, None).await;
    assert!(c.check(check()).await.is_ok());
    let status = c.watch(check()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.metadata().get("retry-after").unwrap(), "1");
}

/// With the `tonic` feature the default key, the peer IP, is read from tonic's connection
/// info, so callers on different addresses have separate quotas.
#[cfg(feature = "tonic")]
#[tokio::test]
async fn peer_ip_keys_tonic_calls() {
    let limiter = Limiter::builder()
        .policy(Policy::new("per-ip", Rate::per_minute(1)).unwrap())
        .build()
        .unwrap();
    let addr = serve(RateLimitLayer::new(limiter)).await;
    let mut a = client(addr, Some(2)).await;
    let mut b = client(addr, Some(3)).await;
    assert!(a.check(check()).await.is_ok());
    assert_eq!(
        a.check(check()).await.unwrap_err().code(),
        Code::ResourceExhausted
    );
    assert!(b.check(check()).await.is_ok());
    assert_eq!(
        b.check(check()).await.unwrap_err().code(),
        Code::ResourceExhausted
    );
}

/// Over tonic's own TLS (which records the peer as `TlsConnectInfo<TcpConnectInfo>` and, since
/// 0.14, as `TcpConnectInfo` too), the default key, the peer address, keys each client: no
/// call is refused for want of a key.
#[cfg(feature = "tonic")]
#[tokio::test]
async fn peer_ip_keys_calls_over_tonics_own_tls() {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (cert, key) = (certified.cert.pem(), certified.signing_key.serialize_pem());
    let limiter = Limiter::builder()
        .policy(Policy::new("per-ip", Rate::per_minute(1)).unwrap())
        .build()
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let identity = Identity::from_pem(&cert, &key);
    tokio::spawn(async move {
        Server::builder()
            .tls_config(ServerTlsConfig::new().identity(identity))
            .unwrap()
            .layer(RateLimitLayer::new(limiter))
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&cert))
        .domain_name("localhost");
    let client = |from: u8| {
        let endpoint = Endpoint::from_shared(format!("https://{addr}"))
            .unwrap()
            .tls_config(tls.clone())
            .unwrap()
            .local_address(Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, from))));
        async move { HealthClient::new(endpoint.connect().await.unwrap()) }
    };
    let (mut a, mut b) = (client(2).await, client(3).await);
    for c in [&mut a, &mut b] {
        assert!(c.check(check()).await.is_ok(), "refused for want of a key");
        assert_eq!(
            c.check(check()).await.unwrap_err().code(),
            Code::ResourceExhausted,
            "keyed by its own address"
        );
    }
}

#[tokio::test]
async fn per_method_policies_from_the_route_table() {
    let clock = ManualClock::new(T0);
    let limiter = Limiter::builder()
        .store(MemoryStore::builder().clock(clock.clone()).build().unwrap())
        .policy(fixed("default", 100).build().unwrap())
        .route(
            "/grpc.health.v1.Health/Check",
            Route::new().policy(fixed("health-check", 2).build().unwrap()),
        )
        .route(
            "/grpc.health.v1.Health/Watch",
            Route::new().policy(fixed("health-watch", 1).sensitive(true).build().unwrap()),
        )
        .extractor(Global::new())
        .build()
        .unwrap();
    let addr = serve(RateLimitLayer::new(limiter)).await;
    let mut c = client(addr, None).await;
    for remaining in ["1", "0"] {
        let res = c.check(check()).await.unwrap();
        assert_eq!(res.metadata().get("ratelimit-limit").unwrap(), "2");
        assert_eq!(
            res.metadata().get("ratelimit-remaining").unwrap(),
            remaining
        );
    }
    let status = c.check(check()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    // The refusal names the method's policy, not the default route's.
    assert_eq!(
        status.message(),
        "Rate limit exceeded: 2 per 10 seconds (health-check). Retry in 7 s."
    );
    assert_eq!(status.metadata().get("ratelimit-limit").unwrap(), "2");

    // Watch has its own, sensitive policy: refusals say nothing about counts.
    let first = c.watch(check()).await.unwrap();
    assert!(first.metadata().get("ratelimit-remaining").is_none());
    drop(first);
    let status = c.watch(check()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(
        status.message(),
        "Too many requests. Please try again later."
    );
    assert!(status.metadata().get("ratelimit-limit").is_none());
    assert!(status.get_error_details().retry_info().is_some());
}

/// Over HTTP on a real axum server: only gRPC content types get the gRPC rendering; one that
/// merely starts like one (`application/grpcx`), or a `GET` with a gRPC content type, gets
/// the HTTP 429.
#[tokio::test]
async fn only_grpc_content_types_get_grpc_refusals() {
    let limiter = Limiter::builder()
        .policy(Policy::new("p", Rate::per_minute(1)).unwrap())
        .extractor(Global::new())
        .build()
        .unwrap();
    let app = axum::Router::new()
        .route(
            "/",
            axum::routing::post(|| async { "ok" }).get(|| async { "home" }),
        )
        .layer(RateLimitLayer::new(limiter));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = reqwest::Client::new();
    let send = |ct: &'static str| {
        client
            .post(format!("http://{addr}/"))
            .header("content-type", ct)
            .send()
    };
    assert_eq!(send("application/json").await.unwrap().status(), 200);
    let grpcx = send("application/grpcx").await.unwrap();
    assert_eq!(grpcx.status(), 429);
    assert!(!grpcx.headers().contains_key("grpc-status"));
    for ct in [
        "application/grpc",
        "application/grpc+proto",
        "application/grpc-web",
    ] {
        let res = send(ct).await.unwrap();
        assert_eq!(res.status(), 200, "{ct}");
        assert_eq!(res.headers()["grpc-status"], "8", "{ct}");
        assert_eq!(res.headers()["cache-control"], "no-store", "{ct}");
    }
    // gRPC calls are POSTs: a GET claiming to be one gets the HTTP refusal, never an empty
    // 200 that a cache in front of the site would keep and serve to every visitor.
    let get = client
        .get(format!("http://{addr}/"))
        .header("content-type", "application/grpc")
        .send()
        .await
        .unwrap();
    assert_eq!(get.status(), 429);
    assert_eq!(get.headers()["cache-control"], "no-store");
    assert!(!get.headers().contains_key("grpc-status"));
}

/// A limiter on every method whose route counts only the calls `when` accepts.
fn counting(clock: &ManualClock, limit: u64, when: tollgate::route::CountWhen) -> Limiter {
    Limiter::builder()
        .store(MemoryStore::builder().clock(clock.clone()).build().unwrap())
        .default_route(
            Route::new()
                .policy(fixed("calls", limit).build().unwrap())
                .count_when(when),
        )
        .extractor(per_method())
        .build()
        .unwrap()
}

fn check_of(service: &str) -> HealthCheckRequest {
    HealthCheckRequest {
        service: service.to_owned(),
    }
}

// A gRPC call is HTTP 200 whatever its outcome: counting "failures" must read `grpc-status`
// (in the trailers of a success, in the head of tonic's trailers-only error), or a brute force
// over gRPC is never limited.
#[tokio::test]
async fn counting_failures_reads_the_grpc_status() {
    let clock = ManualClock::new(T0);
    let limiter = counting(&clock, 2, tollgate::route::CountWhen::failures());
    let addr = serve(RateLimitLayer::new(limiter.clone())).await;
    let mut c = client(addr, None).await;
    for _ in 0..5 {
        // OK, its status in the trailers: refunded.
        assert!(c.check(check()).await.is_ok());
    }
    for _ in 0..2 {
        // NOT_FOUND, trailers-only: counted.
        let status = c.check(check_of("no.such.Service")).await.unwrap_err();
        assert_eq!(status.code(), Code::NotFound);
    }
    let status = c.check(check()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    let key = Key::new("grpc-method", "/grpc.health.v1.Health/Check");
    assert_eq!(limiter.peek(&key).await.unwrap().remaining(), 0);
}

#[tokio::test]
async fn counting_successes_reads_the_status_in_the_trailers() {
    let clock = ManualClock::new(T0);
    let limiter = counting(&clock, 2, tollgate::route::CountWhen::successes());
    let addr = serve(RateLimitLayer::new(limiter)).await;
    let mut c = client(addr, None).await;
    for _ in 0..5 {
        let status = c.check(check_of("no.such.Service")).await.unwrap_err();
        assert_eq!(status.code(), Code::NotFound);
    }
    assert!(c.check(check()).await.is_ok());
    assert!(c.check(check()).await.is_ok());
    let status = c.check(check()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
}

// A stream the client cancels never sends its status: with no outcome, the charge stands
// (as for an HTTP request that never got a response head).
#[tokio::test]
async fn a_stream_cut_before_its_status_keeps_its_charge() {
    let clock = ManualClock::new(T0);
    let limiter = counting(&clock, 2, tollgate::route::CountWhen::successes());
    let addr = serve(RateLimitLayer::new(limiter.clone())).await;
    let mut c = client(addr, None).await;
    let key = Key::new("grpc-method", "/grpc.health.v1.Health/Watch");
    for _ in 0..2 {
        let mut stream = c.watch(check()).await.expect("allowed").into_inner();
        assert_eq!(stream.message().await.unwrap().unwrap().status, 1);
        drop(stream);
    }
    // The server drops the cancelled streams' bodies shortly after the resets arrive.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(limiter.peek(&key).await.unwrap().remaining(), 0);
    let status = c.watch(check()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
}

/// One gRPC-Web call over HTTP/1 (as a browser's client makes it) of `Health/Check` for
/// `service`: the status, from the response head (trailers-only) or the trailers frame at
/// the end of the body.
async fn grpc_web_check(client: &reqwest::Client, addr: SocketAddr, service: &str) -> String {
    grpc_web_check_as(client, addr, service, None).await
}

/// [`grpc_web_check`] with a username in `x-username`.
async fn grpc_web_check_as(
    client: &reqwest::Client,
    addr: SocketAddr,
    service: &str,
    user: Option<&str>,
) -> String {
    // The request message: field 1, the service name.
    let mut message = vec![];
    if !service.is_empty() {
        message.extend([0x0a, service.len() as u8]);
        message.extend(service.as_bytes());
    }
    let mut body = vec![0];
    body.extend((message.len() as u32).to_be_bytes());
    body.extend(message);
    let mut request = client
        .post(format!("http://{addr}/grpc.health.v1.Health/Check"))
        .header("content-type", "application/grpc-web+proto")
        .header("x-grpc-web", "1");
    if let Some(user) = user {
        request = request.header("x-username", user);
    }
    let res = request.body(body).send().await.unwrap();
    if let Some(status) = res.headers().get("grpc-status") {
        return status.to_str().unwrap().to_owned();
    }
    let bytes = res.bytes().await.unwrap();
    let mut rest = &bytes[..];
    while rest.len() >= 5 {
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        let (flag, payload) = (rest[0], &rest[5..5 + len]);
        if flag & 0x80 != 0 {
            let text = String::from_utf8_lossy(payload).to_lowercase();
            return text
                .lines()
                .find_map(|l| l.trim().strip_prefix("grpc-status:"))
                .unwrap()
                .trim()
                .to_owned();
        }
        rest = &rest[5 + len..];
    }
    panic!("no grpc-status in {bytes:?}");
}

// gRPC-Web translated inside the layer: the trailers travel at the end of the body, where the
// counting rule reads the call's status.
#[tokio::test]
async fn counting_reads_the_status_in_a_grpc_web_body() {
    let clock = ManualClock::new(T0);
    let limiter = counting(&clock, 2, tollgate::route::CountWhen::failures());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let layers = tower::ServiceBuilder::new()
        .layer(RateLimitLayer::new(limiter))
        .layer(tonic_web::GrpcWebLayer::new())
        .into_inner();
    tokio::spawn(async move {
        Server::builder()
            .accept_http1(true)
            .layer(layers)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    let client = reqwest::Client::new();
    for _ in 0..5 {
        // OK, in the body's trailers: refunded.
        assert_eq!(grpc_web_check(&client, addr, "").await, "0");
    }
    for _ in 0..2 {
        assert_eq!(grpc_web_check(&client, addr, "no.such.Service").await, "5");
    }
    assert_eq!(
        grpc_web_check(&client, addr, "").await,
        "8",
        "RESOURCE_EXHAUSTED"
    );
}

/// The login layer on a tonic server: the username comes from metadata, the outcome from the
/// call's gRPC status (the health service's: `OK` for the server as a whole — in the
/// trailers, after the body — and `NOT_FOUND`, here a wrong password, for an unknown service).
/// tonic's request body is not built from bytes, so the request is mapped to axum's body first.
/// With `web`, gRPC-Web is translated inside the layer: the status travels in the body. The
/// guard allows 3 attempts an hour per (IP, user).
async fn serve_login(web: bool) -> SocketAddr {
    use tollgate::login::{LoginLayer, LoginOutcome};
    let guard = tollgate::login::LoginGuard::builder()
        .ip_user_rate(Rate::per_hour(3))
        .build()
        .unwrap();
    let login =
        LoginLayer::header(guard, http::HeaderName::from_static("x-username")).classify(|status| {
            match status {
                http::StatusCode::NOT_FOUND => LoginOutcome::Failure,
                other => LoginOutcome::from_status(other),
            }
        });
    let layers = tower::ServiceBuilder::new()
        .map_request(|req: http::Request<tonic::body::Body>| req.map(axum::body::Body::new))
        .layer(login)
        .option_layer(web.then(tonic_web::GrpcWebLayer::new));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    tokio::spawn(async move {
        Server::builder()
            .accept_http1(web)
            .layer(layers)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    addr
}

async fn log_in(
    client: &mut HealthClient<tonic::transport::Channel>,
    user: &str,
    right_password: bool,
) -> Code {
    let service = if right_password {
        ""
    } else {
        "no.such.Service"
    };
    let mut request = tonic::Request::new(check_of(service));
    request
        .metadata_mut()
        .insert("x-username", user.parse().unwrap());
    match client.check(request).await {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

// Every gRPC call is HTTP 200: a login layer that read only the HTTP status counted each
// wrong password as a success, cleared the user's failures, and never locked anyone out.
#[tokio::test]
async fn the_login_layer_reads_a_grpc_calls_outcome_from_its_status() {
    let addr = serve_login(false).await;
    let mut client = client(addr, None).await;
    for _ in 0..2 {
        assert_eq!(log_in(&mut client, "alice", false).await, Code::NotFound);
    }
    // The right password (its `OK` comes in the trailers) clears alice's failures from here…
    assert_eq!(log_in(&mut client, "alice", true).await, Code::Ok);
    for _ in 0..3 {
        assert_eq!(log_in(&mut client, "alice", false).await, Code::NotFound);
    }
    // …and three wrong ones since lock her out of this address, the right password too.
    assert_eq!(
        log_in(&mut client, "alice", true).await,
        Code::ResourceExhausted
    );
    // Another user from the same address is not locked out.
    assert_eq!(log_in(&mut client, "bob", true).await, Code::Ok);
}

/// Two wrong passwords, the right one, three wrong ones, the right one: the success clears
/// the failures before it, so only the last attempt is refused (`RESOURCE_EXHAUSTED`), under a
/// limit of 3 attempts per (IP, user). `log_in(right)` answers the call's gRPC status code.
async fn lockout_after_a_success<F, Fut>(log_in: F)
where
    F: Fn(bool) -> Fut,
    Fut: std::future::Future<Output = String>,
{
    for _ in 0..2 {
        assert_eq!(log_in(false).await, "5");
    }
    assert_eq!(log_in(true).await, "0");
    for _ in 0..3 {
        assert_eq!(log_in(false).await, "5");
    }
    assert_eq!(log_in(true).await, "8", "RESOURCE_EXHAUSTED");
}

// The same over gRPC-Web, translated inside the layer: a success's status is in the trailers
// frame at the end of the body.
#[tokio::test]
async fn the_login_layer_reads_a_grpc_web_calls_outcome_from_its_body() {
    let addr = serve_login(true).await;
    let client = reqwest::Client::new();
    let log_in = |right: bool| {
        let service = if right { "" } else { "no.such.Service" };
        grpc_web_check_as(&client, addr, service, Some("alice"))
    };
    lockout_after_a_success(log_in).await;
}

// The text form (base64, grpc-web's JavaScript default): a success's status is in a base64
// trailers frame. Unread, each right password counted as a failure and locked the user out.
#[tokio::test]
async fn the_login_layer_reads_a_grpc_web_text_calls_outcome() {
    let addr = serve_login(true).await;
    let client = reqwest::Client::new();
    // The request frames, base64: the server as a whole (`OK`) or `no.such.Service`.
    let log_in = |right: bool| {
        let body = if right {
            "AAAAAAA="
        } else {
            "AAAAABEKD25vLnN1Y2guU2VydmljZQ=="
        };
        let request = client
            .post(format!("http://{addr}/grpc.health.v1.Health/Check"))
            .header("content-type", "application/grpc-web-text")
            .header("accept", "application/grpc-web-text")
            .header("x-grpc-web", "1")
            .header("x-username", "alice")
            .body(body);
        async move {
            let res = request.send().await.unwrap();
            assert_eq!(res.status(), 200);
            // A failure or a refusal is trailers-only; a success's status is in the body.
            let status = res
                .headers()
                .get("grpc-status")
                .map(|s| s.to_str().unwrap().to_owned());
            let _ = res.bytes().await.unwrap();
            status.unwrap_or_else(|| "0".to_owned())
        }
    };
    lockout_after_a_success(log_in).await;
}

/// A call whose cost is above the capacity can never pass: its refusal tells gRPC's own
/// retry policy not to retry (`grpc-retry-pushback-ms: -1`) and carries no wait.
#[tokio::test]
async fn a_call_no_wait_admits_tells_the_client_not_to_retry() {
    let clock = ManualClock::new(T0);
    let limiter = Limiter::builder()
        .store(MemoryStore::builder().clock(clock.clone()).build().unwrap())
        .default_route(
            tollgate::route::Route::new()
                .policy(fixed("health", 2).build().unwrap())
                .cost_fn(|_| 5),
        )
        .extractor(per_method())
        .build()
        .unwrap();
    let addr = serve(RateLimitLayer::new(limiter)).await;
    let mut c = client(addr, None).await;
    let status = c.check(check()).await.expect_err("a cost of 5 against 2");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(
        status.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "-1"
    );
    assert!(status.metadata().get("retry-after").is_none());
}

/// A unary `Check` call sent with another HTTP method than `POST`: tonic serves a call
/// whatever its method, so a route declared as `POST /pkg.Service/Method` must count it. It
/// once fell to the default route (here exempt), and a `PUT` was never limited.
async fn check_with_method(
    channel: &mut tonic::transport::Channel,
    method: &[u8],
    content_type: Option<&str>,
) -> String {
    use tower::{Service, ServiceExt};
    let mut request = http::Request::builder()
        .method(http::Method::from_bytes(method).unwrap())
        .uri("/grpc.health.v1.Health/Check")
        .header("te", "trailers");
    if let Some(content_type) = content_type {
        request = request.header("content-type", content_type);
    }
    let framed = tonic::body::Body::new(http_body_util::Full::new(bytes::Bytes::from_static(&[
        0, 0, 0, 0, 0,
    ])));
    let res = channel
        .ready()
        .await
        .unwrap()
        .call(request.body(framed).unwrap())
        .await
        .unwrap();
    if let Some(status) = res.headers().get("grpc-status") {
        return status.to_str().unwrap().to_owned();
    }
    use http_body_util::BodyExt;
    let trailers = res.into_body().collect().await.unwrap().trailers().cloned();
    trailers
        .and_then(|t| t.get("grpc-status").map(|v| v.to_str().unwrap().to_owned()))
        .unwrap_or_else(|| "429".to_owned())
}

#[tokio::test]
async fn a_method_route_counts_a_grpc_call_whatever_its_http_method() {
    let clock = ManualClock::new(T0);
    let limiter = Limiter::builder()
        .store(MemoryStore::builder().clock(clock.clone()).build().unwrap())
        .default_route(Route::exempt())
        .route(
            "POST /grpc.health.v1.Health/Check",
            Route::new().policy(fixed("health-check", 2).build().unwrap()),
        )
        .extractor(Global::new())
        .build()
        .unwrap();
    let addr = serve(RateLimitLayer::new(limiter)).await;
    let mut channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let grpc = Some("application/grpc");
    assert_eq!(check_with_method(&mut channel, b"PUT", grpc).await, "0");
    assert_eq!(check_with_method(&mut channel, b"post", None).await, "0");
    // The third call, whatever its method, is over the route's limit of 2.
    for (method, content_type) in [(&b"PUT"[..], grpc), (b"GET", None), (b"POST", grpc)] {
        let status = check_with_method(&mut channel, method, content_type).await;
        assert_ne!(status, "0", "{}", String::from_utf8_lossy(method));
    }
}

/// The same for a login route declared with its method: a `PUT` is guarded too.
#[tokio::test]
async fn a_login_route_with_a_method_guards_a_grpc_call_whatever_its_http_method() {
    use tollgate::login::{LoginLayer, LoginOutcome};
    let guard = tollgate::login::LoginGuard::builder()
        .ip_user_rate(Rate::per_hour(2))
        .build()
        .unwrap();
    let login = LoginLayer::header(guard, http::HeaderName::from_static("x-username"))
        .classify(|_| LoginOutcome::Failure)
        .routes(["POST /grpc.health.v1.Health/Check"])
        .unwrap();
    let layers = tower::ServiceBuilder::new()
        .map_request(|req: http::Request<tonic::body::Body>| req.map(axum::body::Body::new))
        .layer(login);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    tokio::spawn(async move {
        Server::builder()
            .layer(layers)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    let mut channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut statuses = vec![];
    for _ in 0..3 {
        statuses.push(check_with_method(&mut channel, b"PUT", None).await);
    }
    assert_eq!(statuses[..2], ["0", "0"]);
    assert_ne!(statuses[2], "0", "the third attempt is over the limit");
}

/// A rule over the whole head (`CountWhen::from_fn`) sees a successful call's initial
/// metadata and extensions, though its status comes later, in the trailers: it once saw the
/// trailers alone, so a handler's mark was never seen (every call refunded) and a header
/// telling a cache hit never read (every hit counted).
#[tokio::test]
async fn a_rule_over_the_head_sees_the_metadata_of_a_call_whose_status_is_in_the_trailers() {
    #[derive(Clone)]
    struct Billable;
    async fn serve_marked(limiter: Limiter) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (_reporter, health) = tonic_health::server::health_reporter();
        let layers = tower::ServiceBuilder::new()
            .layer(RateLimitLayer::new(limiter))
            .map_response(|mut res: http::Response<tonic::body::Body>| {
                res.extensions_mut().insert(Billable);
                res.headers_mut()
                    .insert("x-cache-hit", http::HeaderValue::from_static("1"));
                res
            });
        tokio::spawn(async move {
            Server::builder()
                .layer(layers)
                .add_service(health)
                .serve_with_incoming(TcpIncoming::from(listener))
                .await
                .unwrap();
        });
        addr
    }
    use tollgate::route::CountWhen;
    let clock = ManualClock::new(T0);
    let marked = CountWhen::from_fn(|head| head.extensions.get::<Billable>().is_some());
    let addr = serve_marked(counting(&clock, 2, marked)).await;
    let mut c = client(addr, None).await;
    for _ in 0..2 {
        assert!(c.check(check()).await.is_ok());
    }
    let status = c.check(check()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "marked calls count");

    let misses = CountWhen::from_fn(|head| !head.headers.contains_key("x-cache-hit"));
    let addr = serve_marked(counting(&clock, 2, misses)).await;
    let mut c = client(addr, None).await;
    for _ in 0..5 {
        assert!(c.check(check()).await.is_ok(), "cache hits do not count");
    }
}

/// A gRPC response body: one message, then trailers with `grpc-status: 0` and the tokens the
/// call used (known only at the end, so reported as trailing metadata).
struct AnswerThenTrailers {
    sent: u8,
    used: &'static str,
}

impl http_body::Body for AnswerThenTrailers {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        self.sent += 1;
        std::task::Poll::Ready(match self.sent {
            1 => Some(Ok(http_body::Frame::data(bytes::Bytes::from_static(&[
                0, 0, 0, 0, 0,
            ])))),
            2 => {
                let mut trailers = http::HeaderMap::new();
                trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                trailers.insert("x-tokens-used", http::HeaderValue::from_static(self.used));
                Some(Ok(http_body::Frame::trailers(trailers)))
            }
            _ => None,
        })
    }
}

/// `settle_from_header` reads a gRPC call's cost from its trailers when the head has none,
/// and removes it there: a gRPC server knows what a call used at its end. The reservation once
/// stood and the header reached the client.
#[tokio::test]
async fn a_grpc_calls_cost_reported_in_its_trailers_settles_its_reservation() {
    use http_body_util::BodyExt;
    use tollgate::route::Meter;
    use tower::{Service, ServiceExt};
    let clock = ManualClock::new(T0);
    let tokens = fixed("tokens", 1_000).build().unwrap();
    let limiter = Limiter::builder()
        .store(MemoryStore::builder().clock(clock.clone()).build().unwrap())
        .default_route(Route::new().metered(
            tokens,
            Meter::fixed(100).settle_from_header("x-tokens-used".parse().unwrap()),
        ))
        .extractor(Global::new())
        .build()
        .unwrap();
    let mut service = tower::ServiceBuilder::new()
        .layer(RateLimitLayer::new(limiter.clone()))
        .service_fn(|_req: http::Request<axum::body::Body>| async {
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .header("content-type", "application/grpc")
                    .body(AnswerThenTrailers { sent: 0, used: "7" })
                    .unwrap(),
            )
        });
    let call = || {
        http::Request::post("/demo.v1.Llm/Complete")
            .header("content-type", "application/grpc")
            .body(axum::body::Body::empty())
            .unwrap()
    };
    let res = service.ready().await.unwrap().call(call()).await.unwrap();
    let key = Key::global("all");
    // Reserved while the answer streams (a peek answers as for one more unit).
    assert_eq!(limiter.peek(&key).await.unwrap().remaining(), 899);
    let body = res.into_body().collect().await.unwrap();
    let trailers = body.trailers().cloned().unwrap();
    assert_eq!(trailers.get("grpc-status").unwrap(), "0");
    assert!(trailers.get("x-tokens-used").is_none(), "{trailers:?}");
    assert_eq!(
        limiter.peek(&key).await.unwrap().remaining(),
        992,
        "settled at the 7 tokens the trailers reported"
    );
}
