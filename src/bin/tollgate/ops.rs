//! The operator commands: `inspect` and `reset` against the shared store (Redis, Redis
//! Cluster or Redis through Sentinel) with a plan file, `top` through a running application's admin API.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use tollgate::config::{Plan, StoreKind};
use tollgate::key::{Key, RequestView};
use tollgate::store::DynStore;
use tollgate::{KeyState, Limiter, RefusedKey};

use super::{FAIL, INVALID, PASS};

/// Where the shared store is: the plan's `[store]` unless given here.
#[derive(Debug, Args)]
pub(crate) struct StoreArgs {
    /// The plan file (TOML): its policies, routes and `store.prefix`.
    pub(super) plan: PathBuf,
    /// The key: its source and material, `source:material` (`ip:203.0.113.5`, `user:42`,
    /// `apikey:<hash>`), as the application's extractor builds it and as keys are shown:
    /// `%XX` for a byte, `|` between a tuple's parts (`ip+ua:10.0.0.1|curl/8.0`), `#<hex>` for
    /// a digested material.
    pub(super) key: String,
    /// A Redis server (`redis://host:port`), instead of the plan's `store.url` (TLS,
    /// `rediss://`, is not built in; a regional plan's home stays the plan's).
    #[arg(long, conflicts_with = "cluster")]
    redis: Option<String>,
    /// Redis Cluster seed nodes, comma-separated, instead of the plan's `store.urls`.
    #[arg(long, value_delimiter = ',')]
    cluster: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    pub(super) json: bool,
}

/// `tollgate inspect`'s own arguments.
#[derive(Debug, Args)]
pub(crate) struct InspectArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// The path of a request on the route to look at (default `/`: the default route unless
    /// a route matches it).
    #[arg(long, default_value = "/")]
    route: String,
    /// The request's method.
    #[arg(long, default_value = "GET")]
    method: String,
}

/// `tollgate unlock`'s arguments.
#[derive(Debug, Args)]
pub(crate) struct UnlockArgs {
    /// The plan file (TOML), with its `[login]` section.
    plan: PathBuf,
    /// The username to unlock (read as the login guard reads it: `Alice` is `alice`).
    #[arg(long, required_unless_present = "ip", conflicts_with = "ip")]
    user: Option<String>,
    /// The client to unblock, by its IP key as the IP source builds it (`ip:192.0.2.7`).
    #[arg(long)]
    ip: Option<String>,
    /// A Redis server (`redis://host:port`), instead of the plan's `store.url`.
    #[arg(long, conflicts_with = "cluster")]
    redis: Option<String>,
    /// Redis Cluster seed nodes, comma-separated, instead of the plan's `store.urls`.
    #[arg(long, value_delimiter = ',')]
    cluster: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// `tollgate top`'s arguments.
#[derive(Debug, Args)]
pub(crate) struct TopArgs {
    /// The admin API's base URL, where the application nests it
    /// (`http://127.0.0.1:3000/admin/ratelimit`).
    url: String,
    /// How many keys, 1 to 1000 (what the admin API answers).
    #[arg(short, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=1000))]
    n: u64,
    /// A header for the application's auth, `Name: value` (repeatable).
    #[arg(short = 'H', long = "header")]
    headers: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// A failure: the message and the exit status.
pub(super) type Failure = (String, u8);

pub(super) fn invalid(message: impl Into<String>) -> Failure {
    (message.into(), INVALID)
}

pub(super) fn finish(result: Result<(), Failure>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::from(PASS),
        Err((message, code)) => {
            eprintln!("{message}");
            ExitCode::from(code)
        }
    }
}

pub(super) fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| (format!("cannot start the runtime: {e}"), FAIL))
}

/// `source:material` as a key, written as keys are shown (`%XX` escapes, `|` between the
/// parts of a tuple, `#…` for a digest).
pub(super) fn parse_key(text: &str) -> Result<Key, Failure> {
    if !text.contains(':') {
        return Err(invalid(format!(
            "KEY = {text:?}: write the key as source:material, e.g. ip:203.0.113.5 or user:42"
        )));
    }
    text.parse().map_err(|e: tollgate::ConfigError| {
        invalid(format!("KEY = {:?}: {}", e.value(), e.reason()))
    })
}

/// The plan's limiter on the shared store itself (no failure mode: a store error is an
/// error here).
pub(super) fn limiter(args: &StoreArgs) -> Result<(Plan, Limiter<DynStore>), Failure> {
    let path: &Path = &args.plan;
    let (plan, store) = shared_store(path, args.redis.as_deref(), &args.cluster)?;
    let built = |e: tollgate::ConfigError| invalid(format!("{}: {e}", path.display()));
    let limiter = plan
        .builder_with_store(store)
        .and_then(|b| b.build())
        .map_err(built)?;
    Ok((plan, limiter))
}

/// The plan at `path` and the shared store its application uses: its `[store]`, unless
/// `redis` or `cluster` names another.
fn shared_store(
    path: &Path,
    redis: Option<&str>,
    cluster: &[String],
) -> Result<(Plan, DynStore), Failure> {
    let mut plan =
        Plan::from_file(path).map_err(|e| invalid(format!("{}: {e}", path.display())))?;
    // The flag replaces where the store is, so the settings of the plan's own kind that say
    // where (and the memory store's key cap) go with it; its prefix, leasing and region stay.
    let elsewhere = |store: &mut tollgate::config::StoreConfig| {
        store.url = None;
        store.urls.clear();
        store.sentinels.clear();
        store.master = None;
        store.max_keys = None;
    };
    if let Some(url) = redis {
        elsewhere(&mut plan.store);
        plan.store.kind = StoreKind::Redis;
        plan.store.url = Some(url.to_owned());
    } else if !cluster.is_empty() {
        if plan.store.region.is_some() {
            return Err(invalid(format!(
                "--cluster: {} is a regional plan, whose store is its region's Redis: give \
                 that with --redis",
                path.display()
            )));
        }
        elsewhere(&mut plan.store);
        plan.store.kind = StoreKind::RedisCluster;
        plan.store.urls = cluster.to_vec();
    } else if plan.store.kind == StoreKind::Memory {
        return Err(invalid(format!(
            "{}: store.kind = \"memory\": the state lives in each process; give --redis or \
             --cluster, or ask the application's admin API",
            path.display()
        )));
    }
    // The store as the application's instances reach it (its lease ledger, its region's
    // home ledger), without a failure mode: a store error is an error here, so neither the
    // plan's nor its login section's failure mode applies.
    if let Some(login) = &mut plan.login {
        login.failure_mode = None;
    }
    let store = plan.operator_store().map_err(|e| {
        let flag = match e.field() {
            "store.url" if redis.is_some() => "--redis",
            "store.urls" if !cluster.is_empty() => "--cluster",
            _ => return invalid(format!("{}: {e}", path.display())),
        };
        invalid(format!("{flag}: {}", e.reason()))
    })?;
    Ok((plan, store))
}

pub(super) fn store_failed(e: impl std::fmt::Display) -> Failure {
    (format!("the store failed: {e}"), FAIL)
}

pub(crate) fn inspect(args: &InspectArgs) -> ExitCode {
    finish(run_inspect(args))
}

fn run_inspect(args: &InspectArgs) -> Result<(), Failure> {
    let key = parse_key(&args.store.key)?;
    let method: http::Method = args
        .method
        .parse()
        .map_err(|_| invalid(format!("--method = {:?}: not an HTTP method", args.method)))?;
    if !args.route.starts_with('/') {
        return Err(invalid(format!(
            "--route = {:?}: a request path starts with /",
            args.route
        )));
    }
    let request = http::Request::builder()
        .method(method)
        .uri(args.route.as_str())
        .body(())
        .map_err(|e| invalid(format!("--route = {:?}: {e}", args.route)))?;
    let (_, limiter) = limiter(&args.store)?;
    let state = runtime()?
        .block_on(limiter.inspect(&RequestView::new(&request), &key))
        .map_err(store_failed)?;
    if args.store.json {
        print_json(&state)
    } else {
        print!("{}", state_text(&state));
        Ok(())
    }
}

pub(super) fn print_json(value: &impl serde::Serialize) -> Result<(), Failure> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| (format!("cannot render JSON: {e}"), FAIL))?;
    println!("{text}");
    Ok(())
}

/// Milliseconds as seconds with one decimal.
fn secs(ms: u64) -> String {
    format!("{}.{}s", ms / 1000, (ms % 1000) / 100)
}

fn state_text(state: &KeyState) -> String {
    let mut out = format!("key     {} (digest {})\n", state.key, state.digest);
    let Some(route) = &state.route else {
        out.push_str("route   exempt: not limited\n");
        return out;
    };
    out.push_str(&format!("route   {route}\n"));
    if let Some(list) = &state.list {
        out.push_str(&format!("list    {list}: not decided by the policies\n"));
    }
    let verdict = match (state.allowed, state.blocked) {
        (true, _) => "allowed",
        (false, true) => "REFUSED (a penalty's block runs)",
        (false, false) => "REFUSED",
    };
    out.push_str(&format!("next    {verdict}\n"));
    out.push_str(&format!(
        "{:<24} {:>10} {:>10} {:>10} {:>10}\n",
        "policy", "limit", "remaining", "reset in", "retry in"
    ));
    for p in &state.policies {
        let name = if p.shadow {
            format!("{} (shadow)", p.policy)
        } else {
            p.policy.clone()
        };
        let retry = if p.allowed {
            "-".to_owned()
        } else {
            secs(p.retry_after_ms)
        };
        // Nothing used: nothing to reset.
        let reset = if p.remaining >= p.limit {
            "-".to_owned()
        } else {
            secs(p.reset_after_ms)
        };
        out.push_str(&format!(
            "{name:<24} {:>10} {:>10} {reset:>10} {retry:>10}\n",
            p.limit, p.remaining
        ));
    }
    out
}

pub(crate) fn reset(args: &StoreArgs) -> ExitCode {
    finish(run_reset(args))
}

fn run_reset(args: &StoreArgs) -> Result<(), Failure> {
    let key = parse_key(&args.key)?;
    let (_, limiter) = limiter(args)?;
    runtime()?
        .block_on(limiter.reset(&key))
        .map_err(store_failed)?;
    let mut policies: Vec<String> = limiter
        .effective_plan()
        .routes
        .into_iter()
        .flat_map(|r| r.policies.into_iter().map(|p| p.name))
        .collect();
    policies.sort();
    policies.dedup();
    let digest = tollgate::key::digest(&key);
    if args.json {
        print_json(&serde_json::json!({ "reset": true, "digest": digest, "policies": policies }))
    } else {
        println!(
            "reset key with digest {digest} under {}",
            policies.join(", ")
        );
        Ok(())
    }
}

pub(crate) fn unlock(args: &UnlockArgs) -> ExitCode {
    finish(run_unlock(args))
}

fn run_unlock(args: &UnlockArgs) -> Result<(), Failure> {
    let path: &Path = &args.plan;
    let ip = args.ip.as_deref().map(parse_key).transpose()?;
    let (plan, store) = shared_store(path, args.redis.as_deref(), &args.cluster)?;
    let guard = plan
        .login_guard_with_store(store)
        .map_err(|e| invalid(format!("{}: {e}", path.display())))?
        .ok_or_else(|| {
            invalid(format!(
                "{}: the plan has no [login] section: nothing to unlock",
                path.display()
            ))
        })?;
    let runtime = runtime()?;
    let unlocked = match (&args.user, ip) {
        (Some(user), _) => {
            if user.trim().is_empty() {
                return Err(invalid("--user = \"\": name the username to unlock"));
            }
            runtime
                .block_on(guard.unlock_user(user))
                .map_err(store_failed)?;
            "user"
        }
        (None, Some(ip)) => {
            runtime
                .block_on(guard.unlock_ip(&ip))
                .map_err(store_failed)?;
            "ip"
        }
        (None, None) => return Err(invalid("give --user or --ip")),
    };
    if args.json {
        print_json(&serde_json::json!({ "unlocked": unlocked }))
    } else {
        println!("unlocked the {unlocked} limit of the plan's login guard");
        Ok(())
    }
}

pub(crate) fn top(args: &TopArgs) -> ExitCode {
    finish(run_top(args))
}

fn run_top(args: &TopArgs) -> Result<(), Failure> {
    let scheme = args
        .url
        .split_once("://")
        .map(|(s, _)| s.to_ascii_lowercase());
    if !matches!(scheme.as_deref(), Some("http" | "https")) {
        return Err(invalid(format!(
            "URL = {:?}: the admin API's base URL, http:// or https://",
            args.url
        )));
    }
    let url = format!("{}/top?n={}", args.url.trim_end_matches('/'), args.n);
    let mut headers = reqwest::header::HeaderMap::new();
    for h in &args.headers {
        let parsed = h.split_once(':').and_then(|(name, value)| {
            Some((
                reqwest::header::HeaderName::from_bytes(name.trim().as_bytes()).ok()?,
                reqwest::header::HeaderValue::from_str(value.trim()).ok()?,
            ))
        });
        let (name, value) =
            parsed.ok_or_else(|| invalid(format!("--header = {h:?}: write it as Name: value")))?;
        headers.append(name, value);
    }
    let body = runtime()?.block_on(async {
        let res = reqwest::Client::new()
            .get(&url)
            .headers(headers)
            .send()
            .await
            .map_err(|e| (format!("{url}: {e}"), FAIL))?;
        let status = res.status();
        let bytes = res
            .bytes()
            .await
            .map_err(|e| (format!("{url}: {e}"), FAIL))?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&bytes);
            return Err((format!("{url}: {status}: {text}"), FAIL));
        }
        Ok(bytes)
    })?;
    #[derive(serde::Deserialize, serde::Serialize)]
    struct Top {
        keys: Vec<RefusedKey>,
    }
    let top: Top = serde_json::from_slice(&body)
        .map_err(|e| (format!("{url}: not the admin API's answer: {e}"), FAIL))?;
    if args.json {
        return print_json(&top);
    }
    if top.keys.is_empty() {
        println!("no refused keys");
        return Ok(());
    }
    println!("{:>10} {:>8}  {:<20} digest", "refused", "error", "key");
    for k in &top.keys {
        println!("{:>10} {:>8}  {:<20} {}", k.count, k.error, k.key, k.digest);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_source_and_material() {
        assert_eq!(
            parse_key("ip:2001:db8::1").unwrap(),
            Key::new("ip", "2001:db8::1")
        );
        assert_eq!(
            parse_key("ip+ua:10.0.0.1|curl/8.0").unwrap(),
            Key::from_materials("ip+ua", &["10.0.0.1", "curl/8.0"])
        );
        assert_eq!(
            parse_key("header:acme%FF").unwrap(),
            Key::new("header", b"acme\xff")
        );
        assert_eq!(parse_key("user:50%").unwrap_err().1, INVALID);
        assert_eq!(parse_key("nokey").unwrap_err().1, INVALID);
        assert_eq!(parse_key(":x").unwrap(), Key::new("", "x"));
        assert_eq!(parse_key("user:%61").unwrap_err().1, INVALID);
    }

    #[test]
    fn seconds_have_one_decimal() {
        assert_eq!(secs(58_249), "58.2s");
        assert_eq!(secs(0), "0.0s");
    }
}
