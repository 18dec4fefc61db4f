//! The whole rate-limit plan as a TOML file.
//!
//! A [`Plan`] describes the store, the key, policies, routes, tiers, the failure mode, the
//! header style and the login guard. [`Plan::from_toml`] parses it (every error names the
//! offending field and value, and a syntax error its line and column), [`Plan::build`] builds
//! what it describes — the limiter and the login guard, on one store, through the same
//! builders as the code API — and [`crate::audit()`] builds it the same way before grading it,
//! so a plan that passes the audit is a plan that builds. A setting that nothing would read
//! (a policy no route uses, a Redis URL on a memory store) is an error, not a silent no-op.
//!
//! ```toml
//! replicas = 3
//! failure_mode = "fail_closed"
//! header_style = "classic"
//!
//! [store]
//! kind = "redis"
//! url = "redis://127.0.0.1:6379"
//!
//! [key]
//! kind = "peer_ip"
//!
//! [[policies]]
//! name = "login"
//! limit = 5
//! window = "1m"
//! sensitive = true
//!
//! [[policies]]
//! name = "reads"
//! limit = 1000
//! window = "1m"
//!
//! [[routes]]
//! pattern = "POST /login"
//! kind = "auth"
//! policies = ["login"]
//!
//! [[routes]]
//! pattern = "/health"
//! exempt = true
//!
//! [default]
//! policies = ["reads"]
//! ```
//!
//! `[login]` adds a [`LoginGuard`](crate::login::LoginGuard) on the routes it names; see
//! [`LoginConfig`] and `examples/plan.toml`.
//!
//! # Examples
//!
//! ```
//! use tollgate::config::Plan;
//!
//! let plan = Plan::from_toml(r#"
//!     [[policies]]
//!     name = "api"
//!     limit = 100
//!     window = "1m"
//!     [default]
//!     policies = ["api"]
//! "#)?;
//! let limiter = tollgate::Limiter::from_config(&plan)?;
//! assert_eq!(limiter.policies()[0].name(), "api");
//!
//! let err = Plan::from_toml("[[policies]]\nname = \"api\"\nlimit = -1\nwindow = \"1m\"").unwrap_err();
//! assert_eq!(err.field(), "policies[0].limit");
//! # Ok::<(), tollgate::ConfigError>(())
//! ```
//!
//! Every reason a plan does not build, without connecting anywhere:
//!
//! ```
//! use tollgate::config::Plan;
//!
//! let plan = Plan::from_toml(r#"
//!     [[policies]]
//!     name = "api"
//!     limit = 100
//!     window = "1m"
//!     [[routes]]
//!     pattern = "/x/{"
//!     policies = ["api"]
//!     [default]
//!     policies = ["api"]
//! "#)?;
//! assert_eq!(plan.build().unwrap_err().field(), "routes[0].pattern");
//! assert!(!tollgate::audit(&plan).pass);
//! # Ok::<(), tollgate::ConfigError>(())
//! ```

pub mod audit;
mod build;
pub mod edge;
mod json;
mod reload;
mod schema;

pub use build::{BuiltPlan, OnAuditFailure};
#[cfg(feature = "watch")]
pub use reload::PlanWatcher;
pub use schema::{
    CountSetting, DefaultRouteConfig, FailureModeName, KeyConfig, KeyKind, LoginConfig, Plan,
    PolicyConfig, RouteConfig, RouteKind, StoreConfig, StoreKind, TierConfig,
};
