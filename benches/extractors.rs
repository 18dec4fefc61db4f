//! Cost of deriving a key per request.

use std::hint::black_box;
use std::net::SocketAddr;

use criterion::{criterion_group, criterion_main, Criterion};
use tollgate::key::{
    ApiKey, Chain, ClientIp, ForwardedHeader, KeyExtractor, PeerIp, RequestView, TrustedProxies,
    User,
};

fn request(headers: &[(&'static str, &'static str)]) -> http::Request<()> {
    let mut req = http::Request::new(());
    for (name, value) in headers {
        req.headers_mut()
            .append(*name, http::HeaderValue::from_static(value));
    }
    req.extensions_mut()
        .insert("10.0.0.2:40000".parse::<SocketAddr>().unwrap());
    req
}

fn bench(c: &mut Criterion) {
    let trusted = TrustedProxies::private_networks().and(TrustedProxies::loopback());
    let xff = request(&[("x-forwarded-for", "198.51.100.1, 203.0.113.7, 10.0.0.5")]);
    let fwd = request(&[(
        "forwarded",
        "for=198.51.100.1, for=\"[2001:db8:cafe::17]:4711\";proto=https, for=10.0.0.5",
    )]);
    let api = request(&[("x-api-key", "sk_live_0123456789abcdef0123456789abcdef")]);
    let cases: Vec<(&str, Box<dyn KeyExtractor>, &http::Request<()>)> = vec![
        ("peer_ip", Box::new(PeerIp::new()), &xff),
        (
            "client_ip_xff_3_hops",
            Box::new(ClientIp::new(trusted.clone())),
            &xff,
        ),
        (
            "client_ip_forwarded_v6",
            Box::new(ClientIp::new(trusted.clone()).header(ForwardedHeader::Forwarded)),
            &fwd,
        ),
        ("api_key_sha256", Box::new(ApiKey::new()), &api),
        (
            "api_key_hmac",
            Box::new(ApiKey::new().secret([7u8; 32])),
            &api,
        ),
        (
            "chain_user_api_ip",
            Box::new(
                Chain::new(User::<String>::new())
                    .or(ApiKey::new())
                    .or(ClientIp::new(trusted)),
            ),
            &xff,
        ),
    ];
    for (name, extractor, req) in &cases {
        let view = RequestView::new(req);
        c.bench_function(name, |b| b.iter(|| extractor.extract(black_box(&view))));
    }
}

criterion_group! {
    name = benches;
    // No plots: rendering them for every benchmark took minutes of `cargo bench` on a busy
    // machine; the numbers are in target/criterion and benches/scripts/summarize.py reads them.
    config = Criterion::default().without_plots();
    targets = bench
}
criterion_main!(benches);
