//! Plans put in force while the service runs: [`Limiter::reload_plan`] from code, and
//! [`PlanWatcher`] (feature `watch`) from a plan file.

use crate::config::audit::{audit, Severity};
use crate::config::Plan;
use crate::error::ConfigError;
use crate::limiter::Limiter;
use crate::store::Store;

impl<S: Store + Clone> Limiter<S> {
    /// Builds `plan` on this limiter's store and puts it in force with
    /// [`reload`](Self::reload). It is refused — the plan in force stays, the error is
    /// logged (target `tollgate::reload`) and counted
    /// (`tollgate_plan_reloads_total{result="refused"}`) — when it does not build, when the
    /// [audit](crate::audit()) finds an error in it that the plan in force did not have,
    /// or when it changes a setting that is read once, at start:
    ///
    /// * `[store]`, `replicas` and `failure_mode`: where and how the limits are kept;
    /// * `[login]`, and the limits of the policies it names: the login guard copied them;
    /// * `header_style`, `quota_headers` and `retry_after`: what the layer's responses carry
    ///   (the layer was built with them).
    ///
    /// A reload changes the limits — policies, routes, the default, tiers, keys, the access
    /// lists — and refuses, naming the field, rather than leave a declared setting unread.
    /// (The plan in force is the one the limiter was built from with
    /// [`Limiter::from_config`] or [`Plan::build`], or the last one reloaded; a limiter built
    /// in code has none to compare with, and only the build and the audit check.)
    ///
    /// ```
    /// use tollgate::config::Plan;
    ///
    /// let v1 = Plan::from_toml(
    ///     "[[policies]]\nname = \"api\"\nlimit = 100\nwindow = \"1m\"\n[default]\npolicies = [\"api\"]",
    /// )?;
    /// let limiter = tollgate::Limiter::from_config(&v1)?;
    /// let v2 = Plan::from_toml(
    ///     "[[policies]]\nname = \"api\"\nlimit = 500\nwindow = \"1m\"\n[default]\npolicies = [\"api\"]",
    /// )?;
    /// limiter.reload_plan(&v2)?;
    /// assert_eq!(limiter.policies()[0].limit(), 500);
    ///
    /// // A plan that does not build (its default names no policy) is refused; the one in
    /// // force stays.
    /// let broken = Plan::from_toml("[[policies]]\nname = \"api\"\nlimit = 5\nwindow = \"1m\"\n[default]\npolicies = [\"nope\"]")?;
    /// assert!(limiter.reload_plan(&broken).is_err());
    /// assert_eq!(limiter.policies()[0].limit(), 500);
    ///
    /// // So is one that changes what the responses carry: the layer read that at start.
    /// let mut quiet = v2.clone();
    /// quiet.quota_headers = Some(tollgate::QuotaHeaders::Never);
    /// assert_eq!(limiter.reload_plan(&quiet).unwrap_err().field(), "quota_headers");
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// The [`ConfigError`] that refused the plan: a setting read at start that the plan
    /// changes, a build error, or the audit's first error finding the plan in force did not
    /// have.
    pub fn reload_plan(&self, plan: &Plan) -> Result<(), ConfigError> {
        let in_force = self.source().and_then(|s| s.downcast::<Plan>().ok());
        let next = match in_force.as_deref().and_then(|old| read_at_start(old, plan)) {
            Some(refused) => Err(refused),
            None => plan
                .builder_with_store(self.store().clone())
                .and_then(|b| b.build())
                .and_then(|next| new_audit_error(in_force.as_deref(), plan).map_or(Ok(next), Err)),
        };
        if let Ok(next) = &next {
            next.set_source(Some(std::sync::Arc::new(plan.clone())));
        }
        self.reload_or_keep(next)
    }
}

/// The first setting read only at start that `next` changes from `in_force`, as the error
/// that refuses the reload. Settings are compared as the build reads them (an unset value
/// and its default written out are the same). A section's values are not repeated in the
/// message: `[store]` holds URLs that may carry credentials.
fn read_at_start(in_force: &Plan, next: &Plan) -> Option<ConfigError> {
    fn changed<T: PartialEq + std::fmt::Debug>(
        field: &str,
        old: &T,
        new: &T,
    ) -> Option<ConfigError> {
        (old != new).then(|| {
            ConfigError::new(
                field,
                format_args!("{new:?}"),
                format!(
                    "is read once, at start (the plan in force has {old:?}); a reload changes the limits only: restart to change it"
                ),
            )
        })
    }
    fn section_changed<T: PartialEq>(field: &str, old: &T, new: &T) -> Option<ConfigError> {
        (old != new).then(|| {
            ConfigError::new(
                field,
                "(changed)",
                "is read once, at start, and differs from the plan in force; a reload changes the limits only: restart to change it",
            )
        })
    }
    // The login guard copies the limits of the policies [login] names when it is built.
    let login_policy = |plan: &Plan, name: &Option<String>| {
        name.as_ref()
            .and_then(|n| plan.policies.iter().find(|p| &p.name == n))
            .cloned()
    };
    let login_policies = |plan: &Plan| {
        plan.login
            .as_ref()
            .map(|l| [&l.ip_username, &l.ip, &l.username].map(|n| login_policy(plan, n)))
    };
    section_changed("store", &in_force.store, &next.store)
        .or_else(|| {
            changed(
                "replicas",
                &in_force.replicas.unwrap_or(1),
                &next.replicas.unwrap_or(1),
            )
        })
        .or_else(|| changed("failure_mode", &in_force.failure_mode, &next.failure_mode))
        .or_else(|| section_changed("login", &in_force.login, &next.login))
        .or_else(|| {
            section_changed(
                "login policies",
                &login_policies(in_force),
                &login_policies(next),
            )
        })
        .or_else(|| {
            // Without an `ip_key` of its own, the login guard keys its addresses by [key].
            let guard_key = |plan: &Plan| {
                plan.login
                    .as_ref()
                    .map(|l| l.ip_key.clone().unwrap_or_else(|| plan.key.clone()))
            };
            (guard_key(in_force) != guard_key(next)).then(|| {
                ConfigError::new(
                    if next.login.as_ref().is_some_and(|l| l.ip_key.is_some()) {
                        "login.ip_key"
                    } else {
                        "key"
                    },
                    "(changed)",
                    "the login guard keys client addresses by it, read once, at start (a \
                     reload would leave the guard on the old key); restart to change it (with an \
                     ip_key of its own in [login], [key] can change by reload)",
                )
            })
        })
        .or_else(|| changed("header_style", &in_force.header_style, &next.header_style))
        .or_else(|| {
            changed(
                "quota_headers",
                &in_force.quota_headers.unwrap_or_default(),
                &next.quota_headers.unwrap_or_default(),
            )
        })
        .or_else(|| {
            changed(
                "retry_after",
                &in_force.retry_after.unwrap_or(true),
                &next.retry_after.unwrap_or(true),
            )
        })
}

/// The audit's first error finding in `plan` (a rule at a place) the plan in force did not have:
/// a reload must not make the plan worse, and a plan that started with a finding can still
/// be reloaded (to fix something else).
fn new_audit_error(in_force: Option<&Plan>, plan: &Plan) -> Option<ConfigError> {
    let errors = |p: &Plan| {
        audit(p)
            .findings
            .into_iter()
            .filter(|f| f.severity == Severity::Error)
            .collect::<Vec<_>>()
    };
    // A finding is the same when its rule and its place are.
    let before: Vec<(String, Option<String>)> = in_force
        .map(|p| {
            errors(p)
                .into_iter()
                .map(|f| (f.rule.to_string(), f.field))
                .collect()
        })
        .unwrap_or_default();
    errors(plan)
        .into_iter()
        .find(|f| !before.contains(&(f.rule.to_string(), f.field.clone())))
        .map(|f| {
            ConfigError::new(
                f.field.clone().unwrap_or_else(|| "plan".to_owned()),
                f.value.clone().unwrap_or_default(),
                format!("the audit refused the plan ({}): {}", f.rule, f.message),
            )
        })
}

#[cfg(feature = "watch")]
pub use watcher::PlanWatcher;

#[cfg(feature = "watch")]
mod watcher {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{mpsc, Arc, Mutex, Weak};
    use std::time::Duration;

    use notify::{RecommendedWatcher, RecursiveMode, Watcher};

    use crate::config::Plan;
    use crate::error::ConfigError;
    use crate::limiter::Limiter;
    use crate::store::Store;

    /// How long after a change to the file the watcher waits for more before reading it:
    /// an editor or a deployment tool often writes a file in several steps.
    const SETTLE: Duration = Duration::from_millis(100);

    /// Reloads a limiter's plan whenever its file changes (feature `watch`), through
    /// [`Limiter::reload_plan`]: a plan file that does not parse, build or pass the audit is
    /// refused and the plan in force stays. Watching stops when this is dropped.
    ///
    /// The directory holding the file is watched (not the file alone), and after any change
    /// there the file is read again and reloaded if what it says changed. So a file replaced
    /// by a rename — how editors and configuration tools usually write — is seen, and so is
    /// a Kubernetes ConfigMap volume, whose update swaps a `..data` symlink beside the file
    /// without touching the file's own name. When the path is a symlink, the directory of
    /// the file it points to is watched too (followed again after each change), so edits to
    /// the target are seen wherever it lives. A directory on the path that is itself a
    /// symlink swapped for another (`current -> v2`) is not followed: watch a path through
    /// the swapped link's own directory, or the file behind it.
    ///
    /// Replace the file whole (write a new one beside it, then rename it over): the file is
    /// read 100 ms after the last change seen, and a writer that pauses longer half way
    /// through can leave a shorter plan that still parses and builds (a route, a deny
    /// entry cut off) in force until the next change.
    ///
    /// ```no_run
    /// use tollgate::config::{Plan, PlanWatcher};
    ///
    /// let plan = Plan::from_file("ratelimits.toml")?;
    /// let limiter = tollgate::Limiter::from_config(&plan)?;
    /// let _watcher = PlanWatcher::spawn("ratelimits.toml", limiter.clone())?;
    /// // … serve with `RateLimitLayer::new(limiter)`; edits to the file apply from now on.
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub struct PlanWatcher {
        _watcher: Arc<Mutex<RecommendedWatcher>>,
        counts: Arc<Counts>,
    }

    #[derive(Default)]
    struct Counts {
        reloaded: AtomicU64,
        refused: AtomicU64,
        last_error: Mutex<Option<ConfigError>>,
    }

    impl std::fmt::Debug for PlanWatcher {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("PlanWatcher")
                .field("reloaded", &self.reloaded())
                .field("refused", &self.refused())
                .finish()
        }
    }

    /// What the watcher thread keeps between changes.
    struct Follow<S> {
        path: PathBuf,
        /// The directory of the file the path points to, when it is a symlink out of its own
        /// directory, as last watched.
        target_dir: Option<PathBuf>,
        /// The path's own directory, canonical (the target's is not watched twice).
        own_dir: Option<PathBuf>,
        /// What the file said when last read (its text, applied or refused, or why it could
        /// not be read): a change elsewhere in the directory that leaves it as it was reloads
        /// nothing.
        last: Option<Result<String, String>>,
        limiter: Limiter<S>,
        counts: Arc<Counts>,
    }

    impl<S: Store + Clone> Follow<S> {
        /// Watches the directory the path's target is in, if it moved (a symlink swapped).
        fn follow_target(&mut self, watcher: &Mutex<RecommendedWatcher>) {
            let target = std::fs::canonicalize(&self.path)
                .ok()
                .and_then(|t| t.parent().map(Path::to_path_buf))
                .filter(|t| Some(t) != self.own_dir.as_ref());
            if target == self.target_dir {
                return;
            }
            let mut watcher = watcher.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(old) = self.target_dir.take() {
                // Gone already when a swap deleted it; nothing to undo then.
                let _ = watcher.unwatch(&old);
            }
            if let Some(dir) = target {
                if watcher.watch(&dir, RecursiveMode::NonRecursive).is_ok() {
                    self.target_dir = Some(dir);
                }
            }
        }

        /// Reads the file and puts its plan in force if its text changed.
        fn reload(&mut self) {
            let read = std::fs::read_to_string(&self.path).map_err(|e| e.to_string());
            if self.last.as_ref() == Some(&read) {
                return;
            }
            // A file that cannot be read or parsed is refused before `reload_plan`, which
            // counts the plans it refuses: counted here, as one refusal.
            let result = match &read {
                Ok(text) => match Plan::from_file_text(&self.path, text) {
                    Ok(plan) => self.limiter.reload_plan(&plan),
                    Err(error) => {
                        crate::telemetry::plan_reload(false);
                        Err(error)
                    }
                },
                Err(e) => {
                    crate::telemetry::plan_reload(false);
                    Err(ConfigError::new(
                        "(file)",
                        self.path.display(),
                        format!("cannot be read: {e}"),
                    ))
                }
            };
            self.last = Some(read);
            let counts = &self.counts;
            match result {
                Ok(()) => {
                    counts.reloaded.fetch_add(1, Ordering::Release);
                }
                Err(error) => {
                    tracing::error!(
                        target: "tollgate::reload",
                        file = %self.path.display(),
                        %error,
                        "the plan file was refused; the plan in force stays"
                    );
                    // The error is in place before the count says so: a caller who sees
                    // `refused()` go up and then asks `last_error()` finds it.
                    *counts.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
                    counts.refused.fetch_add(1, Ordering::Release);
                }
            }
        }
    }

    impl PlanWatcher {
        /// Watches `path` and reloads `limiter` from it on every change.
        ///
        /// # Errors
        ///
        /// A [`ConfigError`] on `path` when it has no parent directory that can be watched.
        pub fn spawn<S: Store + Clone>(
            path: impl AsRef<Path>,
            limiter: Limiter<S>,
        ) -> Result<Self, ConfigError> {
            let path = path.as_ref().to_path_buf();
            let shown = path.display().to_string();
            let cannot = |e: &dyn std::fmt::Display| {
                ConfigError::new("path", &shown, format!("cannot be watched: {e}"))
            };
            if path.file_name().is_none() {
                return Err(ConfigError::new("path", &shown, "names no file"));
            }
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                _ => PathBuf::from("."),
            };
            let (tx, rx) = mpsc::channel::<()>();
            let mut watcher =
                notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                    if event.is_ok_and(|event| !event.kind.is_access()) {
                        let _ = tx.send(());
                    }
                })
                .map_err(|e| cannot(&e))?;
            watcher
                .watch(&dir, RecursiveMode::NonRecursive)
                .map_err(|e| cannot(&e))?;
            let watcher = Arc::new(Mutex::new(watcher));
            let counts = Arc::new(Counts::default());
            let mut follow = Follow {
                // Not the text at spawn: the file may have changed since the limiter was
                // built from it, and the first change seen must reload whatever it says.
                last: None,
                own_dir: std::fs::canonicalize(&dir).ok(),
                path,
                target_dir: None,
                limiter,
                counts: Arc::clone(&counts),
            };
            follow.follow_target(&watcher);
            let weak: Weak<Mutex<RecommendedWatcher>> = Arc::downgrade(&watcher);
            std::thread::Builder::new()
                .name("tollgate-plan-watcher".into())
                .spawn(move || {
                    // Ends when the watcher (and with it the sender) is dropped.
                    while rx.recv().is_ok() {
                        std::thread::sleep(SETTLE);
                        while rx.try_recv().is_ok() {}
                        let Some(watcher) = weak.upgrade() else { break };
                        follow.follow_target(&watcher);
                        drop(watcher);
                        follow.reload();
                    }
                })
                .map_err(|e| ConfigError::new("path", &shown, format!("no watcher thread: {e}")))?;
            Ok(Self {
                _watcher: watcher,
                counts,
            })
        }

        /// Plans put in force so far.
        pub fn reloaded(&self) -> u64 {
            self.counts.reloaded.load(Ordering::Acquire)
        }

        /// Plan files refused so far.
        pub fn refused(&self) -> u64 {
            self.counts.refused.load(Ordering::Acquire)
        }

        /// Why the last plan file was refused, if one was.
        pub fn last_error(&self) -> Option<ConfigError> {
            self.counts
                .last_error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
        }
    }
}
