//! Drives each server example once: starts the compiled example on a free port, sends real
//! requests, and stops it.
//!
//! `cargo test` builds the examples before running tests; with a `--test examples` filter it
//! does not, so build them first (`cargo build --all-features --examples`).

#[cfg(feature = "redis")]
mod support;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The examples directory next to this test binary (`target/<profile>/examples`).
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap().join("examples");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} was not built: run `cargo build --all-features --examples`",
        path.display()
    );
    path
}

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(name: &str, envs: &[(&str, String)]) -> (Running, String) {
    start_with_args(name, &[], envs)
}

fn start_with_args(name: &str, args: &[&str], envs: &[(&str, String)]) -> (Running, String) {
    // The port is free when chosen but not held: something else can take it before the
    // example binds (then the example exits before saying it listens), so a lost race is
    // retried on a new port.
    for _ in 0..3 {
        if let Some(started) = try_start(name, args, envs) {
            return started;
        }
    }
    panic!("{name} exited before listening, three times");
}

fn try_start(name: &str, args: &[&str], envs: &[(&str, String)]) -> Option<(Running, String)> {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let child = Command::new(example(name))
        .args(args)
        .env("ADDR", &addr)
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut running = Running(child);
    // Readiness is the example saying it listens on `addr`, which it prints only after its
    // own bind succeeded. A connection probe is not enough: when another process holds the
    // port, the probe reaches that process while this example is about to exit.
    let stdout = running.0.stdout.take().unwrap();
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let url = format!("http://{addr}");
    let wanted = url.clone();
    std::thread::spawn(move || {
        // Keeps draining after readiness so the example never blocks on a full pipe.
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
            let Ok(line) = line else { break };
            if line.contains(&wanted) {
                let _ = ready_tx.send(());
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if ready.recv_timeout(Duration::from_millis(50)).is_ok() {
            return Some((running, url));
        }
        if running.0.try_wait().unwrap().is_some() {
            return None;
        }
        assert!(Instant::now() < deadline, "{name} did not listen on {addr}");
    }
}

async fn statuses(client: &reqwest::Client, method: &str, url: &str, n: usize) -> Vec<u16> {
    let mut out = vec![];
    for _ in 0..n {
        let req = client.request(method.parse().unwrap(), url);
        out.push(req.send().await.unwrap().status().as_u16());
    }
    out
}

#[tokio::test]
async fn quickstart_limits_five_per_ten_seconds() {
    let (_server, base) = start("quickstart", &[]);
    let client = reqwest::Client::new();
    assert_eq!(
        statuses(&client, "GET", &format!("{base}/"), 6).await,
        [200, 200, 200, 200, 200, 429]
    );
}

#[tokio::test]
async fn llm_tokens_settles_the_streamed_tokens() {
    let (_server, base) = start("llm_tokens", &[]);
    let client = reqwest::Client::new();
    let complete = || {
        client
            .post(format!("{base}/v1/completions"))
            .header("content-type", "application/json")
            .body(r#"{"prompt":"hi","max_tokens":200}"#)
            .send()
    };
    let first = complete().await.unwrap();
    assert_eq!(first.status(), 200);
    // Sent before the stream: the reservation of 200 tokens.
    let ratelimit = first.headers()["ratelimit"].to_str().unwrap().to_owned();
    assert!(ratelimit.contains("\"tokens\";r=1800"), "{ratelimit}");
    let body = first.text().await.unwrap();
    let tokens = body.matches("data:").count() - 1; // without [DONE]
    assert_eq!(tokens, 24);
    // The stream settled at 24 tokens: 176 came back before the next reservation.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let second = complete().await.unwrap();
    let ratelimit = second.headers()["ratelimit"].to_str().unwrap().to_owned();
    assert!(
        ratelimit.contains(&format!("\"tokens\";r={}", 2000 - 24 - 200)),
        "{ratelimit}"
    );
    second.text().await.unwrap();
}

#[cfg(feature = "watch")]
#[tokio::test]
async fn reload_applies_an_edited_plan_file() {
    let dir = std::env::temp_dir().join(format!("tollgate-example-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plan = dir.join("plan.toml");
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/reload.toml"))
            .unwrap();
    std::fs::write(&plan, &text).unwrap();
    let (_server, base) = start_with_args("reload", &[plan.to_str().unwrap()], &[]);
    let client = reqwest::Client::new();
    let limit = |res: &reqwest::Response| {
        res.headers()["ratelimit-limit"]
            .to_str()
            .unwrap()
            .to_owned()
    };
    let res = client.get(format!("{base}/")).send().await.unwrap();
    assert_eq!(limit(&res), "10");
    std::fs::write(&plan, text.replace("limit = 10", "limit = 100")).unwrap();
    let start = std::time::Instant::now();
    loop {
        let res = client.get(format!("{base}/")).send().await.unwrap();
        if limit(&res) == "100" {
            // The two requests before the edit still count.
            break;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "the edit was not applied"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(feature = "metrics")]
#[tokio::test]
async fn metrics_labels_decisions_by_policy_and_route() {
    let metrics_port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let (_server, base) = start("metrics", &[("METRICS_ADDR", metrics_addr.clone())]);
    let client = reqwest::Client::new();
    assert_eq!(
        statuses(&client, "GET", &format!("{base}/search"), 2).await,
        [200, 429]
    );
    let home = client.get(format!("{base}/")).send().await.unwrap();
    assert_eq!(home.text().await.unwrap(), "hello: 4 of 5 left\n");
    let scrape = client
        .get(format!("http://{metrics_addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = |needles: &[&str]| {
        scrape
            .lines()
            .find(|l| needles.iter().all(|n| l.contains(n)))
            .unwrap_or_else(|| panic!("no line with {needles:?} in\n{scrape}"))
            .to_owned()
    };
    let denied = line(&[
        "tollgate_decisions_total{",
        "allowed=\"false\"",
        "policy=\"search\"",
        "route=\"GET /search\"",
    ]);
    assert!(denied.ends_with(" 1"), "{denied}");
    let home = line(&[
        "tollgate_decisions_total{",
        "policy=\"per-ip\"",
        "route=\"default\"",
    ]);
    assert!(home.ends_with(" 1"), "{home}");
    assert!(line(&["tollgate_refusals_total{kind=\"rate_limited\"}"]).ends_with(" 1"));
    assert!(scrape.contains("# HELP tollgate_decisions_total "));
}

#[tokio::test]
async fn from_config_serves_its_plan() {
    let (_server, base) = start("from_config", &[]);
    let client = reqwest::Client::new();
    // Wrong passwords: the plan's login guard counts each failure; the route policy refuses
    // the sixth request.
    assert_eq!(
        statuses(&client, "POST", &format!("{base}/login"), 6).await,
        [401, 401, 401, 401, 401, 429]
    );
    assert!(statuses(&client, "GET", &format!("{base}/health"), 30)
        .await
        .iter()
        .all(|s| *s == 200));
    // `/api/…` is keyed by API key (the route's own key): one key's minute spent, another
    // key from the same address still has its own.
    let api = |key: &'static str| {
        let (client, url) = (client.clone(), format!("{base}/api/items"));
        async move {
            let res = client.get(url).header("x-api-key", key).send().await;
            res.unwrap().status().as_u16()
        }
    };
    let mut spent = vec![];
    for _ in 0..11 {
        spent.push(api("key-a").await);
    }
    assert_eq!(spent[10], 429, "{spent:?}");
    assert!(spent[..10].iter().all(|s| *s == 200), "{spent:?}");
    assert_eq!(api("key-b").await, 200);
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn axum_redis_shares_limits_through_redis() {
    let redis = support::RedisServer::start();
    let (_server, base) = start("axum_redis", &[("REDIS_URL", redis.url())]);
    let client = reqwest::Client::new();
    assert_eq!(
        statuses(&client, "POST", &format!("{base}/login"), 6).await,
        [200, 200, 200, 200, 200, 429]
    );
    // A second instance of the app on the same Redis sees the same login limit.
    let (_second, base2) = start("axum_redis", &[("REDIS_URL", redis.url())]);
    assert_eq!(
        statuses(&client, "POST", &format!("{base2}/login"), 1).await,
        [429]
    );
    // Behind the trusted (loopback) proxy, each forwarded client has its own limit.
    let res = client
        .get(format!("{base}/api/items"))
        .header("x-forwarded-for", "203.0.113.9")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(!redis.scan("axum-example:{ip:203.0.113.9}*").is_empty());
}

#[cfg(all(feature = "admin", feature = "redis", feature = "config"))]
#[tokio::test]
async fn admin_shows_and_resets_a_refused_tenant_behind_its_token() {
    let redis = support::RedisServer::start();
    let (_server, base) = start("admin", &[("REDIS_URL", redis.url())]);
    let client = reqwest::Client::new();
    let search = || {
        client
            .get(format!("{base}/search"))
            .header("x-tenant", "acme")
            .send()
    };
    for expected in [200, 200, 200, 429] {
        assert_eq!(search().await.unwrap().status(), expected);
    }
    let admin = format!("{base}/admin/ratelimit");
    let without = client.get(format!("{admin}/top")).send().await.unwrap();
    assert_eq!(without.status(), 401);
    let with_token =
        |req: reqwest::RequestBuilder| req.header("authorization", "Bearer let-me-in").send();
    let top: serde_json::Value = with_token(client.get(format!("{admin}/top")))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(top["keys"][0]["key"], "header.x-tenant:acme");
    // A peek goes through the plan's ResilientStore, whose 50 ms timeout a loaded machine
    // can exceed: the admin API then answers 503 and an operator asks again.
    let mut state = serde_json::Value::Null;
    for _ in 0..5 {
        let res =
            with_token(client.get(format!("{admin}/keys/header.x-tenant/acme?route=/search")))
                .await
                .unwrap();
        let status = res.status();
        state = res.json().await.unwrap();
        if status != 503 {
            assert_eq!(status, 200, "{state}");
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(state["allowed"], false, "{state}");
    let reset = with_token(client.delete(format!("{admin}/keys/header.x-tenant/acme")))
        .await
        .unwrap();
    assert_eq!(reset.status(), 200);
    assert_eq!(search().await.unwrap().status(), 200);

    // Guessing the token is limited: 5 failures a minute per client address (one was spent
    // above), counted race-free, so 300 parallel guesses get at most 4 more answers.
    let mut guesses = vec![];
    for i in 0..300 {
        let req = client
            .get(format!("{admin}/top"))
            .header("authorization", format!("Bearer guess-{i}"));
        guesses.push(tokio::spawn(
            async move { req.send().await.unwrap().status() },
        ));
    }
    let mut unauthorized = 0;
    for g in guesses {
        match g.await.unwrap().as_u16() {
            401 => unauthorized += 1,
            429 => {}
            other => panic!("a wrong token got {other}"),
        }
    }
    assert_eq!(
        unauthorized, 4,
        "failed admin authentications are not limited"
    );
    // The right token is refused too while the address is locked out.
    let locked = with_token(client.get(format!("{admin}/top")))
        .await
        .unwrap();
    assert_eq!(locked.status(), 429);
}

#[tokio::test]
async fn login_refuses_the_sixth_wrong_password() {
    let (_server, base) = start("login", &[]);
    let client = reqwest::Client::new();
    let attempt = |path: &str, password: &str| {
        client
            .post(format!("{base}{path}"))
            .json(&serde_json::json!({ "username": "alice", "password": password }))
            .send()
    };
    let mut seen = vec![];
    for _ in 0..6 {
        seen.push(attempt("/login", "guess").await.unwrap().status().as_u16());
    }
    assert_eq!(seen, [401, 401, 401, 401, 401, 429]);
    // The layer-guarded route shares the guard, and the right password is not even checked.
    let res = attempt("/api/login", "correct horse battery staple")
        .await
        .unwrap();
    assert_eq!(res.status(), 429);
    assert!(res.headers().get("ratelimit-remaining").is_none());
}

#[test]
fn tonic_grpc_shows_resource_exhausted_and_exits() {
    let mut child = Command::new(example("tonic_grpc"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("tonic_grpc did not exit by itself");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success());
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut stdout).unwrap();
    assert!(stdout.contains("Check #3: OK"), "{stdout}");
    assert!(stdout.contains("Check #4: ResourceExhausted"), "{stdout}");
    assert!(stdout.contains("RetryInfo.retry_delay Some("), "{stdout}");
    assert!(stdout.contains("server stopped"), "{stdout}");
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn leased_two_instances_never_pass_the_limit_together() {
    let redis = support::RedisServer::start();
    let (_a, base_a) = start("leased", &[("REDIS_URL", redis.url())]);
    let (_b, base_b) = start("leased", &[("REDIS_URL", redis.url())]);
    let client = reqwest::Client::new();
    // The example's limit is 1 000 a minute (sliding window counter): across a minute's end
    // the two windows rightly admit more than 1 000 together.
    support::clear_of_a_window_end(Duration::from_secs(60), Duration::from_secs(20)).await;
    let mut ok = 0;
    for i in 0..1_200 {
        let base = if i % 2 == 0 { &base_a } else { &base_b };
        let res = client.get(format!("{base}/")).send().await.unwrap();
        assert_eq!(res.headers()["ratelimit-limit"], "1000");
        if res.status() == 200 {
            ok += 1;
        } else {
            assert_eq!(res.status(), 429);
        }
    }
    // One limit for both instances: never more, and at most two blocks (a tenth each) short.
    assert!(ok <= 1_000, "{ok} admitted");
    assert!(ok >= 800, "{ok} admitted");
}

/// An example that cannot start says why in words: its error and causes with `Display`, not
/// the debug structure of a `Box<dyn Error>`.
#[cfg(feature = "redis")]
#[test]
fn an_example_that_cannot_start_says_why_in_words() {
    let nowhere = format!(
        "redis://127.0.0.1:{}",
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    );
    let out = Command::new(example("axum_redis"))
        .env("REDIS_URL", &nowhere)
        .env("ADDR", "127.0.0.1:0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let first = stderr.lines().next().unwrap_or_default();
    assert!(first.starts_with("Error: "), "{stderr}");
    assert!(
        !stderr.contains("Connection(") && !stderr.contains("Cause {") && !stderr.contains("{ "),
        "a debug structure was printed: {stderr}"
    );
}

/// The Sentinel example decides on the master the sentinels name, and stops after
/// `SECONDS`.
#[cfg(feature = "sentinel")]
#[test]
fn sentinel_decides_on_the_master_the_sentinels_name() {
    let set = support::sentinel::SentinelSet::start();
    let out = Command::new(example("sentinel"))
        .env("SENTINELS", set.urls().join(","))
        .env("SECONDS", "2")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let master = format!("master 127.0.0.1:{} ", set.master.port());
    assert!(stdout.contains(&master), "{stdout}");
    assert!(stdout.contains("failovers followed 0"), "{stdout}");
}

/// The regions example starts its own servers, shares one limit across three regions with
/// the home 80 ms away, and never admits more than the limit in a window, through a cut.
#[cfg(feature = "regions")]
#[test]
fn regions_share_one_limit_and_never_pass_it() {
    let out = Command::new(example("regions"))
        .env("SECONDS", "6")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let totals: Vec<u64> = stdout
        .lines()
        .filter(|l| l.starts_with("window "))
        .filter_map(|l| {
            l.split("total")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert!(!totals.is_empty(), "{stdout}");
    assert!(totals.iter().all(|&t| t <= 1_000), "{stdout}");
    assert!(totals.iter().any(|&t| t >= 500), "{stdout}");
    assert!(stdout.contains("the home is cut off"), "{stdout}");
}
