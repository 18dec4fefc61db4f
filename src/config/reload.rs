//! Plans put in force while the service runs: [`Limiter::reload_plan`] from code, and
//! [`PlanWatcher`] (feature `watch`) from a plan file.

use crate::config::audit::{audit, Severity};
use crate::config::Plan;
use crate::error::ConfigError;
use crate::limiter::Limiter;
use crate::store::Store;

impl<S: Store + Clone> Limiter<S> {
    /// Builds `plan` on this limiter's store and puts it in force with
    /// [`reload`](Self::reload), after the same checks as at start: a plan that fails to
    /// build, or that the [audit](crate::audit()) finds an error in, is refused — the plan in
    /// force stays, the error is logged (target `tollgate::reload`) and counted
    /// (`tollgate_plan_reloads_total{result="refused"}`). The plan's `[store]` and `[login]`
    /// sections are read at start only: a reload changes the limits, not where they are kept.
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
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// The [`ConfigError`] that refused the plan: a build error, or the audit's first error
    /// finding.
    pub fn reload_plan(&self, plan: &Plan) -> Result<(), ConfigError> {
        let next = plan
            .builder_with_store(self.store().clone())
            .and_then(|b| b.build())
            .and_then(|next| {
                let report = audit(plan);
                match report
                    .findings
                    .iter()
                    .find(|f| f.severity == Severity::Error)
                {
                    Some(f) => Err(ConfigError::new(
                        f.field.clone().unwrap_or_else(|| "plan".to_owned()),
                        f.value.clone().unwrap_or_default(),
                        format!("the audit refused the plan ({}): {}", f.rule, f.message),
                    )),
                    None => Ok(next),
                }
            });
        self.reload_or_keep(next)
    }
}

#[cfg(feature = "watch")]
pub use watcher::PlanWatcher;

#[cfg(feature = "watch")]
mod watcher {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{mpsc, Arc, Mutex};
    use std::time::Duration;

    use notify::{RecursiveMode, Watcher};

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
    /// The directory holding the file is watched (not the file alone), so a file replaced by
    /// a rename — how editors and configuration tools usually write — is seen too.
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
        _watcher: notify::RecommendedWatcher,
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
            let file = path
                .file_name()
                .map(|f| f.to_os_string())
                .ok_or_else(|| ConfigError::new("path", &shown, "names no file"))?;
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                _ => PathBuf::from("."),
            };
            let (tx, rx) = mpsc::channel::<()>();
            let mut watcher =
                notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                    if let Ok(event) = event {
                        let ours = event
                            .paths
                            .iter()
                            .any(|p| p.file_name() == Some(file.as_os_str()));
                        if ours && !event.kind.is_access() {
                            let _ = tx.send(());
                        }
                    }
                })
                .map_err(|e| ConfigError::new("path", &shown, format!("cannot be watched: {e}")))?;
            watcher
                .watch(&dir, RecursiveMode::NonRecursive)
                .map_err(|e| ConfigError::new("path", &shown, format!("cannot be watched: {e}")))?;
            let counts = Arc::new(Counts::default());
            let shared = Arc::clone(&counts);
            std::thread::Builder::new()
                .name("tollgate-plan-watcher".into())
                .spawn(move || {
                    // Ends when the watcher (and with it the sender) is dropped.
                    while rx.recv().is_ok() {
                        std::thread::sleep(SETTLE);
                        while rx.try_recv().is_ok() {}
                        let result =
                            Plan::from_file(&path).and_then(|plan| limiter.reload_plan(&plan));
                        match result {
                            Ok(()) => {
                                shared.reloaded.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(error) => {
                                shared.refused.fetch_add(1, Ordering::Relaxed);
                                tracing::error!(
                                    target: "tollgate::reload",
                                    file = %path.display(),
                                    %error,
                                    "the plan file was refused; the plan in force stays"
                                );
                                *shared.last_error.lock().unwrap_or_else(|e| e.into_inner()) =
                                    Some(error);
                            }
                        }
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
            self.counts.reloaded.load(Ordering::Relaxed)
        }

        /// Plan files refused so far.
        pub fn refused(&self) -> u64 {
            self.counts.refused.load(Ordering::Relaxed)
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
