//! Key extractors against hostile input, and end to end behind a real axum server.

mod support;

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use axum::{extract::Request, middleware::Next, response::Response, routing::get, Router};
use http::{HeaderName, HeaderValue, StatusCode};
use proptest::prelude::*;
use tollgate::key::{
    ApiKey, Chain, ClientIp, ForwardedHeader, KeyExtractor, PeerIp, RequestView, TrustedProxies,
    User,
};
use tollgate::{Limiter, MissingKey, Policy, Rate, RateLimitLayer};

/// The client that connected to the first trusted proxy; the proxy wrote this address.
const CLIENT: &str = "203.0.113.7";

fn request(peer: &str, headers: &[(&str, &[u8])]) -> http::Request<()> {
    let mut req = http::Request::new(());
    for (name, value) in headers {
        req.headers_mut().append(
            HeaderName::try_from(*name).unwrap(),
            HeaderValue::from_bytes(value).unwrap(),
        );
    }
    req.extensions_mut()
        .insert(peer.parse::<SocketAddr>().unwrap());
    req
}

fn key_of(extractor: &dyn KeyExtractor, req: &http::Request<()>) -> String {
    extractor
        .extract(&RequestView::new(req))
        .expect("a key")
        .as_str()
        .to_owned()
}

fn private() -> TrustedProxies {
    TrustedProxies::parse(["10.0.0.0/8", "fd00::/8"]).unwrap()
}

fn xff() -> ClientIp {
    ClientIp::new(private())
}

fn forwarded() -> ClientIp {
    ClientIp::new(private()).header(ForwardedHeader::Forwarded)
}

#[test]
fn spoofed_headers_from_untrusted_client_are_ignored() {
    let spoof: &[(&str, &[u8])] = &[
        ("x-forwarded-for", b"1.2.3.4"),
        ("forwarded", b"for=1.2.3.4"),
        ("x-real-ip", b"1.2.3.4"),
    ];
    let real_ip = ClientIp::new(private()).header(ForwardedHeader::from_name("X-Real-IP").unwrap());
    for peer in ["198.51.100.9:443", "[2001:db8::9]:443"] {
        let req = request(peer, spoof);
        let own = key_of(&PeerIp::new(), &req);
        assert!(!own.contains("1.2.3.4"));
        for extractor in [&xff(), &forwarded(), &real_ip] {
            assert_eq!(key_of(extractor, &req), own, "{extractor:?}");
        }
    }
}

/// A trusted proxy that quotes the client's `Host` in its `Forwarded` element: the commas and
/// semicolons the client put in it are not hops, so the client cannot name its own address.
#[test]
fn client_text_a_proxy_quoted_in_forwarded_is_not_a_hop() {
    let written = format!("for={CLIENT};host=\"a,for=6.6.6.6;x=\";proto=https");
    let req = request("10.0.0.2:1", &[("forwarded", written.as_bytes())]);
    assert_eq!(key_of(&forwarded(), &req), format!("ip:{CLIENT}"));
    // One quote left open by the client swallows only its own text.
    let written = format!("for=6.6.6.6;x=\", for={CLIENT}");
    let req = request("10.0.0.2:1", &[("forwarded", written.as_bytes())]);
    assert_eq!(key_of(&forwarded(), &req), format!("ip:{CLIENT}"));
}

#[test]
fn two_trusted_hops_use_third_from_right() {
    let req = request(
        "10.0.0.2:1",
        &[
            ("x-forwarded-for", b"6.6.6.6, 203.0.113.7, 10.0.0.5"),
            (
                "forwarded",
                b"for=6.6.6.6, for=\"203.0.113.7:5123\";proto=https, for=10.0.0.5",
            ),
        ],
    );
    assert_eq!(key_of(&xff(), &req), "ip:203.0.113.7");
    assert_eq!(key_of(&forwarded(), &req), "ip:203.0.113.7");
    // The same chain split over header instances.
    let split = request(
        "10.0.0.2:1",
        &[
            ("x-forwarded-for", b"6.6.6.6"),
            ("x-forwarded-for", b"203.0.113.7"),
            ("x-forwarded-for", b"10.0.0.5"),
        ],
    );
    assert_eq!(key_of(&xff(), &split), "ip:203.0.113.7");
}

/// What a client may put in front of the entry the first trusted proxy appends.
fn hostile_prefixes() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = [
        &b""[..],
        b",",
        b",,,,",
        b"   ",
        b"unknown",
        b"_hidden",
        b"garbage",
        b"1.2.3.4:99999",
        b"[1.2.3.4]",
        b"[::1",
        b"10.0.0.9",
        b"1.2.3.4, 10.0.0.9",
        b"for=\"",
        b"for=\"[2001:db8::1]:80, for=1.2.3.4",
        b"for=1.2.3.4;for=5.6.7.8",
        b"\xff\xfe\x80",
        b"1.2.3.4\xff",
        b"\t1.2.3.4\t",
    ]
    .iter()
    .map(|s| s.to_vec())
    .collect();
    // 64 KiB of addresses, and 64 KiB of one token.
    v.push("1.2.3.4,".repeat(64 * 1024 / 8).into_bytes());
    v.push(vec![b'9'; 64 * 1024]);
    v
}

#[test]
fn hostile_prefixes_never_become_the_client() {
    for prefix in hostile_prefixes() {
        let mut x = prefix.clone();
        x.extend_from_slice(b", 203.0.113.7");
        let mut f = prefix.clone();
        f.extend_from_slice(b", for=203.0.113.7");
        let req = request("10.0.0.2:1", &[("x-forwarded-for", &x), ("forwarded", &f)]);
        let shown = String::from_utf8_lossy(&prefix[..prefix.len().min(40)]).into_owned();
        assert_eq!(key_of(&xff(), &req), format!("ip:{CLIENT}"), "{shown:?}");
        assert_eq!(
            key_of(&forwarded(), &req),
            format!("ip:{CLIENT}"),
            "{shown:?}"
        );
    }
}

#[test]
fn many_header_instances() {
    let mut req = request("10.0.0.2:1", &[]);
    for i in 0..1000 {
        let v = format!("1.2.3.{}", i % 250);
        req.headers_mut()
            .append("x-forwarded-for", HeaderValue::from_str(&v).unwrap());
    }
    req.headers_mut()
        .append("x-forwarded-for", HeaderValue::from_static(CLIENT));
    assert_eq!(key_of(&xff(), &req), format!("ip:{CLIENT}"));
    // Only trusted hops, more than the hop limit: the last one examined, never a client's.
    let mut req = request("10.0.0.2:1", &[("x-forwarded-for", b"1.2.3.4")]);
    for _ in 0..1000 {
        req.headers_mut()
            .append("x-forwarded-for", HeaderValue::from_static("10.0.0.3"));
    }
    assert_eq!(key_of(&xff(), &req), "ip:10.0.0.3");
    assert_eq!(key_of(&xff().max_hops(2000).unwrap(), &req), "ip:1.2.3.4");
    assert_eq!(xff().max_hops(0).unwrap_err().field(), "max_hops");
}

#[test]
fn malformed_trusted_side_falls_back_to_last_trusted_address() {
    for (header, value) in [
        ("x-forwarded-for", &b"6.6.6.6, unknown, 10.0.0.3"[..]),
        ("x-forwarded-for", b"6.6.6.6, garbage, 10.0.0.3"),
        ("x-forwarded-for", b"6.6.6.6,, 10.0.0.3"),
        ("x-forwarded-for", b"6.6.6.6, \xff, 10.0.0.3"),
        ("forwarded", b"for=6.6.6.6, for=_obf, for=10.0.0.3"),
        ("forwarded", b"for=6.6.6.6, proto=https, for=10.0.0.3"),
        ("forwarded", b"for=6.6.6.6, for=\"[::1, for=10.0.0.3"),
    ] {
        let req = request("10.0.0.2:1", &[(header, value)]);
        let ex = if header == "forwarded" {
            forwarded()
        } else {
            xff()
        };
        assert_eq!(
            key_of(&ex, &req),
            "ip:10.0.0.3",
            "{:?}",
            String::from_utf8_lossy(value)
        );
    }
    // Every hop trusted: the leftmost.
    let req = request("10.0.0.2:1", &[("x-forwarded-for", b"10.0.0.4, 10.0.0.3")]);
    assert_eq!(key_of(&xff(), &req), "ip:10.0.0.4");
    // Empty header from a trusted peer: the peer.
    let req = request("10.0.0.2:1", &[("x-forwarded-for", b"")]);
    assert_eq!(key_of(&xff(), &req), "ip:10.0.0.2");
}

#[test]
fn ports_and_brackets_in_the_trusted_part() {
    for (value, expect) in [
        (&b"[2001:db8:1:2::7]:443"[..], "ip:2001:db8:1::/56"),
        (b"203.0.113.7:65535", "ip:203.0.113.7"),
        (b"2001:db8:1:2::7", "ip:2001:db8:1::/56"),
        (b"[fd00::3]:80, 203.0.113.7", "ip:203.0.113.7"),
    ] {
        let req = request("[fd00::1]:1", &[("x-forwarded-for", value)]);
        assert_eq!(key_of(&xff(), &req), expect);
    }
    let req = request(
        "10.0.0.2:1",
        &[("forwarded", b"for=\"[2001:db8:1:2::7]:4711\";by=_proxy")],
    );
    assert_eq!(key_of(&forwarded(), &req), "ip:2001:db8:1::/56");
}

#[test]
fn ipv6_clients_share_a_key_per_56() {
    let key = |addr: &str| {
        key_of(
            &xff(),
            &request("10.0.0.2:1", &[("x-forwarded-for", addr.as_bytes())]),
        )
    };
    assert_eq!(
        key("2001:db8:aa:bb::1"),
        key("2001:db8:aa:bb:ffff:ffff:ffff:ffff")
    );
    // Another /64 of the same /56 (one subscriber's site) shares the key; another /56 not.
    assert_eq!(key("2001:db8:aa:bb::1"), key("2001:db8:aa:bc::1"));
    assert_ne!(key("2001:db8:aa:bb::1"), key("2001:db8:aa:1bb::1"));
    let peer = |addr: &str| key_of(&PeerIp::new(), &request(addr, &[]));
    assert_eq!(peer("[2001:db8:aa:bb::1]:1"), peer("[2001:db8:aa:ff::2]:2"));
    assert_ne!(
        peer("[2001:db8:aa:bb::1]:1"),
        peer("[2001:db8:aa:1bb::1]:1")
    );
    let per_64 = |addr: &str| key_of(&PeerIp::new().ipv6_prefix(64).unwrap(), &request(addr, &[]));
    assert_ne!(
        per_64("[2001:db8:aa:bb::1]:1"),
        per_64("[2001:db8:aa:bc::1]:1")
    );
}

/// Bytes a header value may hold (visible ASCII, space, tab, obs-text).
fn header_bytes() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(
        prop_oneof![
            Just(b'\t'),
            0x20u8..0x7f,
            0x80u8..=0xff,
            Just(b','),
            Just(b'"'),
            Just(b';')
        ],
        0..300,
    )
}

proptest! {
    #[test]
    fn any_client_prefix_leaves_the_proxy_written_address(prefix in header_bytes()) {
        let mut x = prefix.clone();
        x.extend_from_slice(b",203.0.113.7");
        let mut f = prefix;
        f.extend_from_slice(b",for=203.0.113.7");
        let req = request("10.0.0.2:1", &[("x-forwarded-for", &x), ("forwarded", &f)]);
        prop_assert_eq!(key_of(&xff(), &req), format!("ip:{CLIENT}"));
        prop_assert_eq!(key_of(&forwarded(), &req), format!("ip:{CLIENT}"));
    }

    #[test]
    fn any_header_from_an_untrusted_peer_is_ignored(value in header_bytes()) {
        let req = request("198.51.100.1:1", &[("x-forwarded-for", &value), ("forwarded", &value)]);
        prop_assert_eq!(key_of(&xff(), &req), "ip:198.51.100.1");
        prop_assert_eq!(key_of(&forwarded(), &req), "ip:198.51.100.1");
    }

    #[test]
    fn trusted_peer_result_is_trusted_or_listed(value in header_bytes()) {
        let req = request("10.0.0.2:1", &[("x-forwarded-for", &value)]);
        let ip = xff().client_ip(&RequestView::new(&req)).unwrap();
        let listed = value
            .split(|&b| b == b',')
            .any(|e| tollgate::key::forwarded::parse_node(e) == tollgate::key::forwarded::Hop::Addr(ip));
        prop_assert!(private().contains(ip) || listed, "{ip}");
    }
}

// ---- end to end ----

#[derive(Clone, Debug)]
struct UserId(String);

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A stand-in auth layer: `x-user: <id>` authenticates as that user.
async fn fake_auth(mut req: Request, next: Next) -> Response {
    let user = req
        .headers()
        .get("x-user")
        .and_then(|v| v.to_str().ok())
        .map(|v| UserId(v.to_owned()));
    if let Some(user) = user {
        req.extensions_mut().insert(user);
    }
    next.run(req).await
}

async fn serve(extractor: impl KeyExtractor, missing: MissingKey) -> SocketAddr {
    let limiter = Limiter::builder()
        .policy(Policy::new("e2e", Rate::per_minute(2)).unwrap())
        .extractor(extractor)
        .missing_key(missing)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(limiter))
        .layer(axum::middleware::from_fn(fake_auth));
    support::serve(app).await
}

/// An HTTP client whose connections come from `local` (any 127.0.0.0/8 address works).
fn client_from(local: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(local.parse::<IpAddr>().unwrap())
        .build()
        .unwrap()
}

async fn status(
    client: &reqwest::Client,
    server: SocketAddr,
    headers: &[(&str, &str)],
) -> StatusCode {
    let mut req = client.get(format!("http://{server}/"));
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let code = req.send().await.unwrap().status().as_u16();
    StatusCode::from_u16(code).unwrap()
}

const OK: StatusCode = StatusCode::OK;
const LIMITED: StatusCode = StatusCode::TOO_MANY_REQUESTS;

fn user_then_ip(trusted: TrustedProxies) -> Chain {
    Chain::new(User::<UserId>::new())
        .or(ApiKey::new())
        .or(ClientIp::new(trusted))
}

#[tokio::test]
async fn two_users_behind_one_ip_get_separate_limits() {
    let server = serve(user_then_ip(TrustedProxies::none()), MissingKey::Reject).await;
    let c = client_from("127.0.0.1");
    let (ann, bob) = ([("x-user", "ann")], [("x-user", "bob")]);
    assert_eq!(status(&c, server, &ann).await, OK);
    assert_eq!(status(&c, server, &ann).await, OK);
    assert_eq!(status(&c, server, &ann).await, LIMITED);
    assert_eq!(status(&c, server, &bob).await, OK);
    assert_eq!(status(&c, server, &bob).await, OK);
    assert_eq!(status(&c, server, &bob).await, LIMITED);
    // The anonymous bucket of this address is a third, separate key.
    assert_eq!(status(&c, server, &[]).await, OK);
}

#[tokio::test]
async fn one_user_on_two_ips_shares_one_limit() {
    let server = serve(user_then_ip(TrustedProxies::none()), MissingKey::Reject).await;
    let (a, b) = (client_from("127.0.0.1"), client_from("127.0.0.2"));
    let cat = [("x-user", "cat")];
    assert_eq!(status(&a, server, &cat).await, OK);
    assert_eq!(status(&b, server, &cat).await, OK);
    assert_eq!(status(&a, server, &cat).await, LIMITED);
    assert_eq!(status(&b, server, &cat).await, LIMITED);
    // Anonymous traffic is keyed per address, so 127.0.0.2 still has its own budget.
    assert_eq!(status(&b, server, &[]).await, OK);
}

#[tokio::test]
async fn spoofed_forwarding_headers_do_not_buy_a_fresh_limit() {
    // Only 127.0.0.2 is a proxy; 127.0.0.1 is an ordinary client.
    let trusted = TrustedProxies::parse(["127.0.0.2"]).unwrap();
    let server = serve(user_then_ip(trusted), MissingKey::Reject).await;
    let (client, proxy) = (client_from("127.0.0.1"), client_from("127.0.0.2"));
    for (i, expect) in [OK, OK, LIMITED, LIMITED].into_iter().enumerate() {
        let fake = format!("1.2.3.{i}");
        let headers = [
            ("x-forwarded-for", fake.as_str()),
            ("forwarded", "for=9.9.9.9"),
        ];
        assert_eq!(
            status(&client, server, &headers).await,
            expect,
            "request {i}"
        );
    }
    // The trusted proxy's clients are told apart by the header.
    for i in 0..3 {
        let real = format!("198.51.100.{i}");
        assert_eq!(
            status(&proxy, server, &[("x-forwarded-for", &real)]).await,
            OK
        );
    }
}

#[tokio::test]
async fn missing_key_rejects_or_shares_as_configured() {
    let reject = serve(User::<UserId>::new(), MissingKey::Reject).await;
    let c = client_from("127.0.0.1");
    assert_eq!(status(&c, reject, &[]).await, StatusCode::BAD_REQUEST);
    assert_eq!(status(&c, reject, &[("x-user", "dan")]).await, OK);

    let shared = serve(User::<UserId>::new(), MissingKey::Shared).await;
    let other = client_from("127.0.0.3");
    assert_eq!(status(&c, shared, &[]).await, OK);
    assert_eq!(status(&other, shared, &[]).await, OK);
    assert_eq!(status(&c, shared, &[]).await, LIMITED);
    assert_eq!(status(&c, shared, &[("x-user", "dan")]).await, OK);
}

/// One of the crate's extractors, or a composite of them, for the key-space property below.
#[derive(Debug, Clone)]
enum Ex {
    User,
    ApiKey,
    Peer,
    IpUa,
    Global(String),
    Composite(Vec<Ex>),
}

/// What a request carries for the extractors to read.
#[derive(Debug, Clone)]
struct Inputs {
    user: String,
    api_key: String,
    peer: std::net::Ipv4Addr,
    ua: String,
}

/// Who an extractor names on a request: two keys must be equal exactly when this is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Principal {
    User(String),
    ApiKey(String),
    Ip(std::net::Ipv4Addr),
    IpUa(std::net::Ipv4Addr, String),
    Global(String),
    Tuple(Vec<Principal>),
}

impl Ex {
    fn build(&self) -> Box<dyn KeyExtractor> {
        match self {
            Ex::User => Box::new(User::<String>::new()),
            Ex::ApiKey => Box::new(ApiKey::new()),
            Ex::Peer => Box::new(PeerIp::new()),
            Ex::IpUa => Box::new(tollgate::key::IpUserAgent::new(ClientIp::default())),
            Ex::Global(name) => Box::new(tollgate::key::Global::named(name)),
            Ex::Composite(parts) => {
                let mut c = tollgate::key::Composite::default();
                for p in parts {
                    c = c.and(BoxedEx(p.build()));
                }
                Box::new(c)
            }
        }
    }

    fn principal(&self, i: &Inputs) -> Principal {
        match self {
            Ex::User => Principal::User(i.user.clone()),
            Ex::ApiKey => Principal::ApiKey(i.api_key.clone()),
            Ex::Peer => Principal::Ip(i.peer),
            Ex::IpUa => Principal::IpUa(i.peer, i.ua.clone()),
            Ex::Global(name) => Principal::Global(name.clone()),
            // A tuple of one is its part.
            Ex::Composite(parts) if parts.len() == 1 => parts[0].principal(i),
            Ex::Composite(parts) => {
                Principal::Tuple(parts.iter().map(|p| p.principal(i)).collect())
            }
        }
    }
}

struct BoxedEx(Box<dyn KeyExtractor>);

impl fmt::Debug for BoxedEx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BoxedEx")
    }
}

impl KeyExtractor for BoxedEx {
    fn extract(&self, request: &RequestView<'_>) -> Option<tollgate::key::Key> {
        self.0.extract(request)
    }
}

/// Short strings over an alphabet that makes the dangerous coincidences likely: separators,
/// and the text of other extractors' sources.
fn tricky() -> impl Strategy<Value = String> {
    "(user:|ip:|apikey:|global:|user\\+ip:)?[a|:!#%]{0,3}"
}

fn leaf() -> impl Strategy<Value = Ex> {
    prop_oneof![
        Just(Ex::User),
        Just(Ex::ApiKey),
        Just(Ex::Peer),
        Just(Ex::IpUa),
        tricky().prop_map(Ex::Global),
    ]
}

fn extractor() -> impl Strategy<Value = Ex> {
    leaf().prop_recursive(2, 8, 3, |inner| {
        proptest::collection::vec(inner, 1..=3).prop_map(Ex::Composite)
    })
}

fn inputs() -> impl Strategy<Value = Inputs> {
    (tricky(), "[a-c]{1,2}", (0u8..2, 0u8..2), "[a|:/]{0,2}").prop_map(
        |(user, api_key, (a, b), ua)| Inputs {
            user,
            api_key,
            peer: std::net::Ipv4Addr::new(10, 0, a, b),
            ua,
        },
    )
}

fn key_for(ex: &Ex, i: &Inputs) -> String {
    let req = request(
        &format!("{}:1", i.peer),
        &[
            ("x-api-key", i.api_key.as_bytes()),
            ("user-agent", i.ua.as_bytes()),
        ],
    );
    let mut req = req;
    req.extensions_mut().insert(i.user.clone());
    key_of(ex.build().as_ref(), &req)
}

#[test]
fn a_composite_of_one_user_is_not_the_user_with_a_prefixed_id() {
    let a = Inputs {
        user: "a".into(),
        api_key: "k".into(),
        peer: std::net::Ipv4Addr::new(10, 0, 0, 1),
        ua: String::new(),
    };
    let prefixed = Inputs {
        user: "user:a".into(),
        ..a.clone()
    };
    let composite = key_for(&Ex::Composite(vec![Ex::User]), &a);
    assert_ne!(composite, key_for(&Ex::User, &prefixed));
    assert_eq!(
        composite,
        key_for(&Ex::User, &a),
        "a tuple of one is its part"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    /// Over every extractor and every composite of them (nested too): two requests get one key
    /// exactly when they name one principal.
    #[test]
    fn keys_are_injective_across_extractors(
        a in extractor(), ia in inputs(), b in extractor(), ib in inputs(),
    ) {
        let (ka, kb) = (key_for(&a, &ia), key_for(&b, &ib));
        let (pa, pb) = (a.principal(&ia), b.principal(&ib));
        prop_assert_eq!(ka == kb, pa == pb, "{} vs {}: {:?} vs {:?}", ka, kb, pa, pb);
    }
}
