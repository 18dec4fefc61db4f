//! Production-grade rate limiting for [tower] services: axum, tonic, anything that speaks
//! `tower::Service<http::Request<B>>`.
//!
//! * Five algorithms ([`Algorithm`]): sliding window counter (the default), sliding window
//!   log, token bucket, fixed window and GCRA (with optional shaping).
//! * An in-process [`MemoryStore`](store::MemoryStore) that needs no setup: sharded, bounded,
//!   swept.
//! * [`RateLimitLayer`]: keys requests with a [`KeyExtractor`](key::KeyExtractor), decides,
//!   and answers denials with a complete 429 (`Retry-After`, `RateLimit-*`, JSON body).
//! * [`Limiter`]: the same decisions without HTTP (`check`, `peek`, `reset`).
//! * [`login::LoginGuard`]: (client IP, username), client IP and username limits at once
//!   against brute force and password spraying, as a direct API or a layer.
//! * gRPC: a denied gRPC call is a `RESOURCE_EXHAUSTED` status with retry information, not an
//!   HTTP 429 (see [`grpc`]).
//!
//! A denied request consumes nothing, in every algorithm and in every policy of a request.
//!
//! # Features
//!
//! | feature | adds |
//! |---|---|
//! | `axum` (default) | Reads axum's `ConnectInfo<SocketAddr>` for peer addresses; `IntoResponse` for [`Refusal`] and `LoginDecision` |
//! | `admin` | The admin API (`admin`): an axum router showing and resetting keys, the top refused keys and the effective plan, to mount behind the application's own auth; implies `axum` |
//! | `config` (default) | TOML plans ([`config::Plan`]), the [`audit()`], and building limiters from a plan |
//! | `metrics` | Counters and a store-latency histogram through the `metrics` facade (see [`observability`]) |
//! | `watch` | Reloads a limiter's plan when its file changes (`config::PlanWatcher`); implies `config` |
//! | `opentelemetry` | The decision as attributes of the request's OpenTelemetry span, through `tracing-opentelemetry`, whether or not the span declares the fields (see [`observability`]) |
//! | `redis` | The Redis store (`store::RedisStore`): one Lua script per decision, on a pool or a multiplexed connection |
//! | `cluster` | The Redis Cluster store (`store::RedisClusterStore`); implies `redis` |
//! | `sentinel` | The Redis store through Sentinel (`store::RedisSentinelStore`): finds the master by its name and follows a failover; implies `redis` |
//! | `regions` | Limits shared across regions (`store::regions::RegionalLedger`): each region's Redis lends from deposits its instances take blocks from, taken from a home ledger; implies `redis` |
//! | `cli` | The `tollgate` command: `audit` and `edge` on a plan file, `inspect`, `reset`, `unlock` and `override` against the store, `top` through the admin API; implies `config`, `cluster`, `sentinel` and `regions` |
//! | `tonic` | Reads the peer address tonic servers record (`TcpConnectInfo`); `Refusal::to_status` and `LoginDecision::to_status` |
//!
//! The features and their descriptions come from `Cargo.toml` (a test keeps this table and
//! the README's equal to it). The guide, in the repository's `docs/` folder, covers each
//! capability at length.
//!
//! Also: per-route policies ([`route`]), trusted-proxy client addresses and other keys
//! ([`key`]), TOML plans with a deterministic audit (feature `config`), and failure handling
//! for shared stores ([`store::ResilientStore`]). What operators see — the decision on the
//! request's span, a [`RateLimitInfo`] for handlers, metrics and log events — is in
//! [`observability`].
//!
//! # Public dependencies
//!
//! These crates' types appear in tollgate's public API, so a major version of one of them is
//! a major version of tollgate; the list is kept short on purpose, and every other dependency
//! stays private:
//!
//! * [`http`] 1 (requests, responses, header names, status codes), [`http_body`] 1 (the
//!   response bodies) and [`bytes`] 1 (refusal bodies, the frames a streamed meter counts);
//! * `tower-layer` 0.3 and `tower-service` 0.3 (the layers and services);
//! * [`serde`] 1 (plans, [`Algorithm`] and [`HeaderStyle`] deserialize and serialize);
//! * [`ipnet`] 2 ([`key::TrustedProxies::with`] and [`key::TrustedProxies::nets`]);
//! * with feature `axum` or `admin`, `axum` 0.8 (`IntoResponse` for [`Refusal`], the admin
//!   router); with `tonic`, `tonic` 0.14 (statuses); with `redis` or `cluster`,
//!   `deadpool-redis` 0.23 (the pools the Redis stores take).
//!
//! # Examples
//!
//! Five requests per ten seconds per client IP on an axum app:
//!
//! ```no_run
//! use std::{net::SocketAddr, time::Duration};
//! use axum::{routing::get, Router};
//! use tollgate::{Limiter, Policy, Rate, RateLimitLayer};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Limiter::builder()
//!     .policy(Policy::new("per-ip", Rate::new(5, Duration::from_secs(10)))?)
//!     .build()?; // memory store, keyed by peer IP
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::new(limiter));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(()) }
//! ```
//!
//! Any tower stack, keyed globally, with the structured IETF headers:
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use std::convert::Infallible;
//! use http::{Request, Response, StatusCode};
//! use tower::{ServiceBuilder, ServiceExt};
//! use tollgate::{key::Global, HeaderStyle, Limiter, Policy, Rate, RateLimitLayer};
//!
//! let limiter = Limiter::builder()
//!     .policy(Policy::new("burst", Rate::per_second(1))?)
//!     .extractor(Global::new())
//!     .build()?;
//! let svc = ServiceBuilder::new()
//!     .layer(RateLimitLayer::new(limiter).header_style(HeaderStyle::Structured))
//!     .service_fn(|_req: Request<String>| async {
//!         Ok::<_, Infallible>(Response::new(String::from("ok")))
//!     });
//!
//! let res = svc.clone().oneshot(Request::new(String::new())).await?;
//! assert_eq!(res.status(), StatusCode::OK);
//! assert_eq!(res.headers()["ratelimit-policy"], "\"burst\";q=1;w=1");
//! let res = svc.oneshot(Request::new(String::new())).await?;
//! assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert!(res.headers().contains_key("retry-after"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! # Architecture
//!
//! One decision per request, on one path. The middleware ([`middleware`]) only adapts HTTP:
//! it asks the [`Limiter`] about the request and then either calls the inner service (adding
//! quota headers) or answers with the [`Refusal`]. The limiter resolves the route and tier,
//! extracts the key, applies allow and deny lists, computes the cost, runs penalties and
//! shadow policies, and asks the [`store`] about every policy at once; the direct API
//! ([`Limiter::check`], [`Limiter::decide`]), the login guard and gRPC calls go through the
//! same code. Algorithms ([`algorithm`]) are pure functions over a small state; the memory
//! store runs them in Rust and the Redis stores run the same math as Lua scripts.
//!
//! A failure mode belongs to a [`ResilientStore`](store::ResilientStore) wrapped around a
//! shared store, not to the limiter. Dependencies are meant to run one way, leaves first:
//! key, policy, algorithm, decision, store, limiter, middleware and login, config, the command;
//! CI fails on any cycle between top-level modules, and on any circle between the files of
//! `config/` (`.ci/module_cycles.py`).
//!
//! The tree lists every file under `src/`; `tests/house.rs` fails when a file is missing from it
//! or listed without existing.
//!
//! ```text
//! src/
//! ├── lib.rs                 the public API, re-exports and these docs
//! ├── error.rs               ConfigError, CheckError, StoreError
//! ├── clock.rs               time sources: SystemClock, ManualClock for tests
//! ├── key/                   who shares a limit
//! │   ├── mod.rs             Key: one injective, hash-tag-safe encoding
//! │   ├── extractor.rs       the KeyExtractor trait, RequestView, PeerIp, Global, from_fn
//! │   ├── client_ip.rs       ClientIp behind TrustedProxies, ForwardedHeader
//! │   ├── forwarded.rs       Forwarded / X-Forwarded-For parsers and the walk (public for fuzzing)
//! │   ├── api_key.rs         ApiKey: a hashed API key or bearer token
//! │   ├── user.rs            User: the principal an auth layer left in the extensions
//! │   ├── ip_user_agent.rs   IpUserAgent: address plus User-Agent
//! │   ├── networks.rs        NetworkSet: allow and deny networks, one binary search a question
//! │   └── chain.rs           Chain (first key wins) and Composite (several keys as one)
//! ├── policy/                what a limit is
//! │   ├── mod.rs             Policy, Algorithm, FailureMode
//! │   ├── rate.rs            Rate: how much per how long
//! │   ├── limits.rs          Limits: the numbers an algorithm reads
//! │   └── builder.rs         PolicyBuilder: every setting checked at build time
//! ├── overrides.rs           Override: another limit for one key under one policy
//! ├── algorithm/             the math, pure: one file per algorithm, no store
//! │   ├── mod.rs             LimitAlgorithm, AnyState, the registry, PolicyDecision
//! │   ├── sliding_window_counter.rs   the default: two windows, the previous weighted
//! │   ├── sliding_window_log.rs       every admitted request's time: exact
//! │   ├── token_bucket.rs    a bucket refilled continuously
//! │   ├── fixed_window.rs    one counter per aligned window
//! │   ├── gcra.rs            a leaky bucket as a meter, with optional shaping
//! │   ├── in_flight.rs       requests in progress rather than arrivals
//! │   └── tests.rs           property tests: any u64, every algorithm and operation
//! ├── decision.rs            Decision and DecidedBy: every policy's answer for one request
//! ├── route.rs               Route, Meter, CostEstimate, ActualCost: what applies where
//! ├── count.rs               CountWhen: which responses count against a route
//! ├── store/                 where counters live
//! │   ├── mod.rs             the Store trait (check, apply), StoreExt, DynStore
//! │   ├── op.rs              Op, Costs, Applied: every operation as a value
//! │   ├── override_store.rs  OverrideStore: per-key overrides as a store keeps them
//! │   ├── memory/            the in-process store
//! │   │   ├── mod.rs         MemoryStore: sharded, bounded, swept
//! │   │   ├── builder.rs     MemoryStoreBuilder, and the sweeper thread
//! │   │   ├── store_impl.rs  the Store and OverrideStore implementations, MemoryCheck
//! │   │   ├── shard.rs       entries by key, eviction at the key cap, sweeping
//! │   │   ├── states.rs      the policy states of one entry: one inline, several allocated
//! │   │   └── overrides.rs   per-key overrides kept in the process
//! │   ├── resilient/         ResilientStore: timeout, failure modes, local fallback
//! │   │   ├── mod.rs         the store: timeouts, failure modes, fallback
//! │   │   ├── store_impl.rs  the Store implementation: every operation through the breaker
//! │   │   ├── builder.rs     ResilientStoreBuilder: every setting checked at build time
//! │   │   ├── breaker.rs     the circuit breaker
//! │   │   ├── overrides.rs   the local fallback's copy of each key's overrides
//! │   │   └── deny_cache.rs  denials answered again without a round trip
//! │   ├── leased/            LeasedStore: blocks of quota leased from a shared store
//! │   │   ├── mod.rs         docs: the invariant, its bounds, overrides, failures; leasable
//! │   │   ├── store.rs       LeasedStore: the wrapped store, its keys, stats, shutdown
//! │   │   ├── builder.rs     LeasedStoreBuilder: lease time, block size, key cap
//! │   │   ├── stats.rs       LeaseStats: what the store counts of its leases
//! │   │   ├── entries.rs     per key: observed rate, block, refusal; answers without a call
//! │   │   ├── grant.rs       a request decided from a new block or by one ledger call
//! │   │   ├── give_back.rs   unused units and untaken requests given back to the ledger
//! │   │   ├── charges.rs     units charged at the ledger outside blocks, to name their give-backs
//! │   │   ├── finishing.rs   a grant runs to its end when its caller gives up
//! │   │   ├── store_impl.rs  the Store implementation: leased and exact policies, all or nothing
//! │   │   ├── table.rs       the keys tracked, and the filter that keeps one-off keys out
//! │   │   ├── ledger.rs      the lease ledger: kinds, modes, LeaseBackend
//! │   │   └── ledger/
//! │   │       ├── call.rs    a ledger call: each policy's part, the block given back
//! │   │       ├── reply.rs   a ledger's reply, and reading it from Redis
//! │   │       ├── state.rs   a ledger state's view: what fits, when a cost would
//! │   │       ├── run.rs     one call over the states (the twin of lua/lease.lua)
//! │   │       ├── memory.rs  MemoryLedger: the ledger in the process
//! │   │       ├── tests.rs   the Lua and Rust ledgers agree: the server and the calls
//! │   │       └── tests/
//! │   │           ├── differential.rs   random calls, alone and batched
//! │   │           └── debts.rs          forced charges at every size
//! │   ├── regions/           RegionalLedger: one limit across regions, lent home → region → instance
//! │   │   ├── mod.rs         docs: the three levels, the invariant, its price, latency, failures
//! │   │   ├── deposit.rs     a deposit, and the region script's calls and replies
//! │   │   ├── home.rs        takes, renewals from the home, give-backs, exact decisions at home
//! │   │   ├── returns.rs     deposits that ended, were emptied or replaced, given back home
//! │   │   ├── stats.rs       RegionStats: the flows between a region and the home
//! │   │   └── store_impl.rs  the LeaseBackend and Store implementations
//! │   └── redis/             RedisStore, RedisClusterStore and RedisSentinelStore
//! │       ├── mod.rs         docs and re-exports
//! │       ├── single.rs      RedisStore: one server, a pool or one connection
//! │       ├── cluster.rs     the Redis Cluster store
//! │       ├── sentinel.rs    RedisSentinelStore: the master Sentinel names, across failovers
//! │       ├── sentinel/link.rs   the master resolved, dropped on failure, resolved again
//! │       ├── builder.rs     RedisStoreBuilder: the settings both stores share
//! │       ├── connector.rs   how the engine reaches Redis; errors as StoreErrors
//! │       ├── deposits.rs    a region's deposits in its Redis: lua/region.lua's calls
//! │       ├── engine.rs      what both stores share, generic over the connection
//! │       ├── engine/tests.rs   its unit tests: batches assembled, replies read
//! │       ├── ops.rs         the operations, and the in-flight charge's slot
//! │       ├── overrides.rs   per-key overrides
//! │       ├── store_impl.rs  the one Store implementation of both
//! │       ├── request.rs     one decision as sent: keys, parameters, amounts, mode
//! │       ├── script.rs      the Lua decision script, hashed once
//! │       ├── lua_constants.rs   the constants Lua shares with Rust, written into the scripts
//! │       ├── lua_constants/tests.rs   lua/constants.lua is current; no Lua file writes them
//! │       ├── ttl.rs         how long the scripts' keys live
//! │       ├── script_call.rs one EVALSHA, built straight into the command's buffer
//! │       ├── wire.rs        one script call's arguments and reply
//! │       ├── keys.rs        <prefix>:{<key>}:<policy>:<part>, every key built once
//! │       ├── ledger_call.rs a ledger call as sent: lua/lease.lua, one call or a batch
//! │       ├── lease.rs       the lease ledger of both stores
//! │       └── batch.rs       concurrent decisions coalesced into one call
//! ├── limiter/               Limiter: the one decision path
//! │   ├── mod.rs             Limiter: peek, reset, decide
//! │   ├── check.rs           check, and check_now: the same without a future
//! │   ├── builder.rs         LimiterBuilder: the settings, checked and built
//! │   ├── compile.rs         routes and policies compiled into the tables decisions read
//! │   ├── decide.rs          route, key, lists, cost, penalties, shadow, store
//! │   ├── finish.rs          the store's answer: metrics, telemetry, refusal, holds
//! │   ├── route_table.rs     matching as axum's router does
//! │   ├── route_key.rs       a route's own key: which extractor keys its requests
//! │   ├── attached.rs        for_route's metrics label: the pattern axum matched
//! │   ├── access.rs          allow and deny lists
//! │   ├── penalty.rs         blocks after a denial
//! │   ├── shadow.rs          policies counted but never refusing
//! │   ├── hold.rs            what an admitted request holds: slots, settlements
//! │   ├── permit.rs          Permit and Reservation: acquire and reserve
//! │   ├── refund.rs          units given back for a request that did not count
//! │   ├── reload.rs          a new plan in force without losing counters
//! │   ├── resets.rs          which keys were reset when: give-backs a reset overtook
//! │   ├── overrides.rs       set_override, overrides, remove_override
//! │   ├── inspect.rs         a key's state, for operators
//! │   └── heavy_hitters.rs   the keys refused most often (Space-Saving)
//! ├── refusal/               Refusal and RefusalKind: every answer instead of the service's
//! │   ├── mod.rs             the kinds, the refusal, its status, codes and message
//! │   ├── render.rs          HTTP and gRPC responses, tonic::Status, IntoResponse
//! │   └── log.rs             counted, on the span, logged at the kind's level
//! ├── response.rs            quota headers (classic, compact, structured) and HeaderStyle
//! ├── grpc.rs                RESOURCE_EXHAUSTED with RetryInfo for gRPC calls
//! ├── middleware/            the tower layer: adapts HTTP to the limiter, nothing more
//! │   ├── mod.rs             docs and re-exports
//! │   ├── layer.rs           RateLimitLayer
//! │   ├── service.rs         RateLimitService
//! │   ├── future.rs          ResponseFuture: polls the store and the inner service
//! │   ├── shared.rs          what a layer's services share: refusals, quota headers
//! │   ├── body.rs            RateLimitBody, and request bodies read under a cap
//! │   ├── rendering.rs       how the layer renders responses and calls the refusal hook
//! │   ├── held.rs            what an admitted request holds, settled from its response
//! │   ├── grpc_web.rs        a gRPC-Web response's trailers, read from its body
//! │   ├── info.rs            RateLimitInfo for handlers
//! │   └── estimate.rs        EstimateFromJsonLayer: a metered cost from the JSON body
//! ├── login/                 the login guard
//! │   ├── mod.rs             docs, LoginMode
//! │   ├── guard.rs           LoginGuard and LoginAttempt
//! │   ├── builder.rs         LoginGuardBuilder
//! │   ├── decision.rs        LoginDecision and its generic refusal
//! │   ├── layer.rs           LoginLayer and LoginService
//! │   ├── outcome.rs         LoginOutcome: what a login response says of the attempt
//! │   ├── body_fields.rs     the username in a JSON or form body
//! │   ├── username.rs        username normalisation
//! │   └── username/
//! │       └── tables.rs      Unicode data for it, generated from ICU4X by a test
//! ├── guide/                 guides, documentation only
//! │   ├── mod.rs             the list
//! │   ├── glossary.rs        the words: slot, hold, reservation, settlement, lease, block
//! │   └── login.rs           counting modes, lockouts, usernames, stores
//! ├── observability.rs       what operators see: spans, metrics, logs (docs, latency buckets)
//! ├── telemetry.rs           the metrics and span fields behind observability (private)
//! ├── admin/                the admin API: an axum Router for operators (feature admin)
//! │   ├── mod.rs             Admin, the key, override, top and plan endpoints
//! │   └── login.rs           Admin::login: unlocking logins, the login top
//! ├── config/                plans (feature config)
//! │   ├── mod.rs             docs and re-exports
//! │   ├── schema/            Plan and its sections: plain data, parsed from TOML
//! │   │   ├── mod.rs         Plan, its sections and the duration parser
//! │   │   └── edge.rs        the [edge] section: EdgeConfig, EdgeRuleConfig, EdgeTarget
//! │   ├── json.rs            the same schema as JSON; plan files of either format
//! │   ├── build/             what a plan builds, through the code API's builders
//! │   │   ├── mod.rs         BuiltPlan, Plan::build, from_config
//! │   │   ├── key.rs         [key], its fallbacks and [login.ip_key]
//! │   │   ├── policies.rs    policies, routes, tiers, settings nothing reads
//! │   │   ├── store.rs       [store] and its failure mode
//! │   │   └── login.rs       [login]
//! │   ├── audit.rs           the audit: rules TG000 to TG016 over a built plan
//! │   ├── audit/tests.rs     its docs list every rule; which proxy ranges trust everyone
//! │   ├── reload.rs          reload_plan and PlanWatcher (feature watch)
//! │   └── edge/              [edge]: coarse limits exported to the edge
//! │       ├── mod.rs         ExportOptions, export_edge, EdgeExport
//! │       ├── resolve.rs     rules resolved against the plan's routes and key
//! │       ├── audit.rs       TG012 to TG014
//! │       ├── nginx.rs       limit_req zones and the real_ip settings
//! │       ├── cloudflare.rs  an http_ratelimit rule
//! │       ├── aws_waf.rs     RateBasedStatement rules
//! │       └── envoy.rs       the local rate limit filter per route
//! └── bin/                   the tollgate command (feature cli)
//!     ├── tollgate.rs        audit, edge export, the operator commands
//!     ├── tollgate/ops.rs    inspect, reset and top
//!     └── tollgate/overrides.rs   override set, list and remove
//! ```
//!
//! [tower]: https://docs.rs/tower

#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "admin")]
pub mod admin;
pub mod algorithm;
pub mod clock;
#[cfg(feature = "config")]
pub mod config;
mod count;
mod decision;
pub mod error;
pub mod grpc;
pub mod guide;
pub mod key;
mod limiter;
pub mod login;
pub mod middleware;
pub mod observability;
pub mod overrides;
pub mod policy;
pub mod refusal;
pub mod response;
pub mod route;
pub mod store;
mod telemetry;

/// The README's code blocks, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
mod readme_doctests {}

/// The guide's code blocks (`docs/`), compiled and run as doctests: one module per chapter, so
/// that a failure names it.
#[cfg(doctest)]
mod guide_doctests {
    #[doc = include_str!("../docs/policies.md")]
    mod policies {}
    #[doc = include_str!("../docs/keys.md")]
    mod keys {}
    #[doc = include_str!("../docs/edge.md")]
    mod edge {}
    #[doc = include_str!("../docs/stores.md")]
    mod stores {}
    #[doc = include_str!("../docs/login.md")]
    mod login {}
    #[doc = include_str!("../docs/grpc.md")]
    mod grpc {}
    #[doc = include_str!("../docs/responses.md")]
    mod responses {}
    #[doc = include_str!("../docs/observability.md")]
    mod observability {}
    #[doc = include_str!("../docs/operations.md")]
    mod operations {}
    #[doc = include_str!("../docs/counting.md")]
    mod counting {}
    #[doc = include_str!("../docs/direct-api.md")]
    mod direct_api {}
    #[doc = include_str!("../docs/architecture.md")]
    mod architecture {}
}

#[cfg(feature = "config")]
pub use config::audit;
#[cfg(feature = "config")]
pub use config::audit::{audit, AuditReport};
pub use decision::{DecidedBy, Decision};
pub use error::{CheckError, ConfigError, StoreError};
pub use limiter::{
    EffectivePlan, KeyState, Limiter, LimiterBuilder, MissingKey, Permit, PolicyState, PolicyView,
    RefusedKey, Reservation, RouteView, ShadowCounts, DEFAULT_TOP_REFUSED_SLOTS,
    DEFAULT_TOP_REFUSED_WINDOW,
};
pub use middleware::{
    EstimateFromJson, EstimateFromJsonLayer, RateLimitBody, RateLimitInfo, RateLimitLayer,
    RateLimitService, ResponseFuture,
};
pub use overrides::Override;
pub use policy::{Algorithm, Policy, PolicyBuilder, Rate};
pub use refusal::{Refusal, RefusalKind};
pub use response::{HeaderStyle, QuotaHeaders};
