//! The store a plan names, wrapped in its failure mode when it is shared.

use crate::config::schema::{Plan, StoreKind};
use crate::error::ConfigError;
use crate::store::{DynStore, MemoryStore};

impl Plan {
    /// Store settings that the store kind would not read.
    pub(super) fn store_settings(&self) -> Result<(), ConfigError> {
        if self.replicas == Some(0) {
            return Err(ConfigError::new(
                "replicas",
                0,
                "must be at least 1: the number of instances that enforce this plan",
            ));
        }
        let s = &self.store;
        let url = ("url", s.url.is_some(), format!("{:?}", s.url));
        let urls = ("urls", !s.urls.is_empty(), format!("{:?}", s.urls));
        let max_keys = (
            "max_keys",
            s.max_keys.is_some(),
            format!("{:?}", s.max_keys),
        );
        let sentinels = (
            "sentinels",
            !s.sentinels.is_empty(),
            format!("{:?}", s.sentinels),
        );
        let master = ("master", s.master.is_some(), format!("{:?}", s.master));
        let prefix = ("prefix", s.prefix.is_some(), format!("{:?}", s.prefix));
        let (kind, ignored) = match s.kind {
            StoreKind::Memory => ("memory", [url, urls, prefix, sentinels, master]),
            StoreKind::Redis => (
                "redis",
                [
                    urls,
                    max_keys,
                    sentinels,
                    master,
                    ("", false, String::new()),
                ],
            ),
            StoreKind::RedisCluster => (
                "redis_cluster",
                [url, max_keys, sentinels, master, ("", false, String::new())],
            ),
            StoreKind::Sentinel => (
                "sentinel",
                [
                    url,
                    urls,
                    max_keys,
                    ("", false, String::new()),
                    ("", false, String::new()),
                ],
            ),
        };
        if s.kind == StoreKind::Memory && s.lease_time.is_some() {
            return Err(ConfigError::new(
                "store.lease_time",
                format_args!("{:?}", s.lease_time.as_deref().unwrap_or_default()),
                "only shared stores lease: delete it or change store.kind",
            ));
        }
        if s.lease_time.is_none() {
            if let Some(p) = s.lease_max_block_percent {
                return Err(ConfigError::new(
                    "store.lease_max_block_percent",
                    p,
                    "is read only with store.lease_time: set it or delete this line",
                ));
            }
            if let Some(n) = s.lease_max_keys {
                return Err(ConfigError::new(
                    "store.lease_max_keys",
                    n,
                    "is read only with store.lease_time: set it or delete this line",
                ));
            }
        }
        self.region_settings()?;
        match ignored.into_iter().find(|(_, set, _)| *set) {
            Some((field, _, value)) => Err(ConfigError::new(
                format!("store.{field}"),
                value.trim_start_matches("Some(").trim_end_matches(')'),
                format!(
                    "a {kind} store does not read this setting: delete it or change store.kind"
                ),
            )),
            None => match (s.kind, self.failure_mode) {
                (StoreKind::Memory, Some(mode)) => Err(ConfigError::new(
                    "failure_mode",
                    format_args!("{mode:?}"),
                    "the memory store cannot fail: only a shared store (redis, redis_cluster, sentinel) reads it; delete it or change store.kind",
                )),
                _ => Ok(()),
            },
        }
    }

    /// The store the plan names. Building a Redis store does not connect: its first decision
    /// does.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `store.*` when the store is not available in this build, its
    /// settings are incomplete, or it is given a setting it does not read.
    ///
    /// ```
    /// let plan = tollgate::config::Plan::from_toml("[store]\nkind = \"memory\"\nurl = \"redis://x\"")?;
    /// assert_eq!(plan.store().unwrap_err().field(), "store.url");
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn store(&self) -> Result<DynStore, ConfigError> {
        self.shared_store(true)
    }

    /// The store the plan names as operator tools reach it: the same Redis (Cluster, through
    /// Sentinel), lease ledger and regional ledger as [`store`](Self::store), but no failure
    /// mode, so a store error is an error rather than a decision, and no deny cache. What
    /// `tollgate inspect`, `reset`, `override` and `unlock` act on: a reset or an override
    /// lands where the application's instances read it.
    ///
    /// ```
    /// let plan = tollgate::config::Plan::from_toml(
    ///     "failure_mode = \"fail_open\"\n[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:6390\"",
    /// )?;
    /// let store = plan.operator_store()?; // connects on its first call
    /// # let _ = store;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`store`](Self::store).
    pub fn operator_store(&self) -> Result<DynStore, ConfigError> {
        self.shared_store(false)
    }

    /// The plan's store, in its failure mode when `failure_mode` says so.
    fn shared_store(&self, failure_mode: bool) -> Result<DynStore, ConfigError> {
        // Only a shared store has a failure mode.
        #[cfg(not(feature = "redis"))]
        let _ = failure_mode;
        self.store_settings()?;
        match self.store.kind {
            StoreKind::Memory => {
                let mut b = MemoryStore::builder();
                if let Some(m) = self.store.max_keys {
                    b = b.max_keys(m);
                }
                Ok(DynStore::new(b.build().map_err(|e| e.within("store"))?))
            }
            #[cfg(feature = "redis")]
            StoreKind::Redis => {
                let url = self.store.url.clone().ok_or_else(|| {
                    ConfigError::new("store.url", "(missing)", "a redis store needs a url")
                })?;
                let mut b = crate::store::RedisStore::builder();
                if let Some(p) = &self.store.prefix {
                    b = b.prefix(p.clone());
                }
                let store = b.build_with_url(&url).map_err(|e| e.within("store"))?;
                if self.store.region.is_some() {
                    return self.regional(store, failure_mode);
                }
                self.leased_and_resilient(store, failure_mode)
            }
            #[cfg(feature = "cluster")]
            StoreKind::RedisCluster => {
                if self.store.urls.is_empty() {
                    return Err(ConfigError::new(
                        "store.urls",
                        "[]",
                        "a redis_cluster store needs seed urls",
                    ));
                }
                let mut b = crate::store::RedisClusterStore::builder();
                if let Some(p) = &self.store.prefix {
                    b = b.prefix(p.clone());
                }
                let store = b
                    .build_cluster_with_urls(self.store.urls.iter().map(String::as_str))
                    .map_err(|e| e.within("store"))?;
                self.leased_and_resilient(store, failure_mode)
            }
            #[cfg(feature = "sentinel")]
            StoreKind::Sentinel => {
                let master = self.store.master.as_deref().ok_or_else(|| {
                    ConfigError::new(
                        "store.master",
                        "(missing)",
                        "a sentinel store needs the name the sentinels monitor the master by",
                    )
                })?;
                let mut b = crate::store::RedisSentinelStore::builder();
                if let Some(p) = &self.store.prefix {
                    b = b.prefix(p.clone());
                }
                let store = b
                    .build_with_sentinel(&self.store.sentinels, master)
                    .map_err(|e| e.within("store"))?;
                self.leased_and_resilient(store, failure_mode)
            }
            #[allow(unreachable_patterns)]
            other => Err(ConfigError::new(
                "store.kind",
                format_args!("{other:?}"),
                "this store needs a cargo feature this build lacks (redis, cluster, sentinel)",
            )),
        }
    }

    /// Region settings: only on a redis store, `region` and `home` together, the others
    /// only with them.
    fn region_settings(&self) -> Result<(), ConfigError> {
        let s = &self.store;
        let shown = |v: &Option<String>| format!("{:?}", v.as_deref().unwrap_or_default());
        let set = [
            ("store.region", s.region.is_some(), shown(&s.region)),
            ("store.home", s.home.is_some(), shown(&s.home)),
            (
                "store.home_lease",
                s.home_lease.is_some(),
                shown(&s.home_lease),
            ),
            (
                "store.deposit_max_percent",
                s.deposit_max_percent.is_some(),
                s.deposit_max_percent.unwrap_or_default().to_string(),
            ),
        ];
        let first_set = |from: usize| set[from..].iter().find(|(_, on, _)| *on);
        if s.kind != StoreKind::Redis {
            return match first_set(0) {
                Some((field, _, value)) => Err(ConfigError::new(
                    *field,
                    value,
                    "only a redis store (the region's Redis in `url`) has regions: delete it or change store.kind",
                )),
                None => Ok(()),
            };
        }
        match (&s.region, &s.home) {
            (Some(_), None) => Err(ConfigError::new(
                "store.home",
                "(missing)",
                "a region needs the home ledger's Redis URL",
            )),
            (None, Some(home)) => Err(ConfigError::new(
                "store.region",
                "(missing)",
                format!("home = {home:?} needs this instance's region"),
            )),
            (None, None) => match first_set(2) {
                Some((field, _, value)) => Err(ConfigError::new(
                    *field,
                    value,
                    "is read only with store.region and store.home: set them or delete this line",
                )),
                None => Ok(()),
            },
            (Some(_), Some(_)) => Ok(()),
        }
    }

    /// This region's share of the plan's limits, kept at the home ledger: a
    /// [`LeasedStore`](crate::store::leased::LeasedStore) over a
    /// [`RegionalLedger`](crate::store::regions::RegionalLedger), in the failure mode, whose
    /// timeout is the home lease (a call that needs the home waits for its round trip).
    #[cfg(feature = "redis")]
    fn regional(
        &self,
        local: crate::store::RedisStore,
        failure_mode: bool,
    ) -> Result<DynStore, ConfigError> {
        #[cfg(not(feature = "regions"))]
        {
            let _ = (local, failure_mode);
            Err(ConfigError::new(
                "store.region",
                format_args!("{:?}", self.store.region.as_deref().unwrap_or_default()),
                "regions need the cargo feature `regions`",
            ))
        }
        #[cfg(feature = "regions")]
        {
            use crate::store::regions::{RegionalLedger, DEFAULT_HOME_LEASE};
            let lease = match &self.store.home_lease {
                Some(t) => crate::config::schema::parse_duration("store.home_lease", t)?,
                None => DEFAULT_HOME_LEASE,
            };
            let home_url = self.store.home.as_deref().unwrap_or_default();
            let mut hb = crate::store::RedisStore::builder().timeout(lease);
            if let Some(p) = &self.store.prefix {
                hb = hb.prefix(p.clone());
            }
            let home = hb.build_with_url(home_url).map_err(|e| match e.field() {
                // The home store's timeout is the home lease.
                "timeout" => ConfigError::new(
                    "store.home_lease",
                    self.store.home_lease.as_deref().unwrap_or_default(),
                    e.reason(),
                ),
                _ => ConfigError::new("store.home", format_args!("{home_url:?}"), e.reason()),
            })?;
            let region = self.store.region.clone().unwrap_or_default();
            let mut rb = RegionalLedger::builder(region, local, home).home_lease(lease);
            if let Some(p) = self.store.deposit_max_percent {
                if !(1..=100).contains(&p) {
                    return Err(ConfigError::new(
                        "store.deposit_max_percent",
                        p,
                        "must be 1 to 100",
                    ));
                }
                rb = rb.max_deposit_fraction(f64::from(p) / 100.0);
            }
            let ledger = rb.build().map_err(|e| {
                let field = match e.field() {
                    "name" => "store.region",
                    "home_lease" => "store.home_lease",
                    other => other,
                };
                ConfigError::new(field, e.value(), e.reason())
            })?;
            let leased = match self.leased(ledger.clone())? {
                Some(leased) => leased,
                None => crate::store::leased::LeasedStore::new(ledger),
            };
            if !failure_mode {
                return Ok(DynStore::new(leased));
            }
            let store = crate::store::ResilientStore::builder(leased, self.failure_mode()?)
                .timeout(lease)
                .deny_cache(10_000)
                .build()
                .map_err(|e| e.within("store"))?;
            Ok(DynStore::new(store))
        }
    }

    /// `store` through the plan's lease ledger (if it leases), in its failure mode when
    /// `failure_mode` says so.
    #[cfg(feature = "redis")]
    fn leased_and_resilient<S: crate::store::leased::LeaseBackend + Clone>(
        &self,
        store: S,
        failure_mode: bool,
    ) -> Result<DynStore, ConfigError> {
        let store = match self.leased(store.clone())? {
            Some(leased) => DynStore::new(leased),
            None => DynStore::new(store),
        };
        if failure_mode {
            Ok(DynStore::new(self.resilient(store)?))
        } else {
            Ok(store)
        }
    }

    /// Wraps a shared store in a [`LeasedStore`](crate::store::leased::LeasedStore) when
    /// the plan sets `store.lease_time`.
    #[cfg(feature = "redis")]
    pub(super) fn leased<S: crate::store::leased::LeaseBackend>(
        &self,
        store: S,
    ) -> Result<Option<crate::store::leased::LeasedStore<S>>, ConfigError> {
        let Some(time) = &self.store.lease_time else {
            return Ok(None);
        };
        let time = crate::config::schema::parse_duration("store.lease_time", time)?;
        let mut b = crate::store::leased::LeasedStore::builder(store).lease_time(time);
        if let Some(p) = self.store.lease_max_block_percent {
            if !(1..=50).contains(&p) {
                return Err(ConfigError::new(
                    "store.lease_max_block_percent",
                    p,
                    "must be 1 to 50",
                ));
            }
            b = b.max_block_fraction(f64::from(p) / 100.0);
        }
        if let Some(n) = self.store.lease_max_keys {
            if n == 0 {
                return Err(ConfigError::new(
                    "store.lease_max_keys",
                    n,
                    "must be at least 1",
                ));
            }
            b = b.max_keys(n);
        }
        b.build().map(Some).map_err(|e| e.within("store"))
    }

    /// Wraps a shared store in the plan's failure mode; the mode must be chosen.
    #[cfg(feature = "redis")]
    pub(super) fn resilient<S: crate::store::Store>(
        &self,
        store: S,
    ) -> Result<crate::store::ResilientStore<S>, ConfigError> {
        crate::store::ResilientStore::builder(store, self.failure_mode()?)
            .deny_cache(10_000)
            .build()
            .map_err(|e| e.within("store"))
    }

    /// The plan's failure mode; a shared store must choose one.
    #[cfg(feature = "redis")]
    fn failure_mode(&self) -> Result<crate::store::FailureMode, ConfigError> {
        use crate::config::schema::FailureModeName;
        use crate::store::FailureMode;
        match self.failure_mode {
            Some(FailureModeName::FailOpen) => Ok(FailureMode::FailOpen),
            Some(FailureModeName::FailClosed) => Ok(FailureMode::FailClosed),
            Some(FailureModeName::LocalFallback) => Ok(FailureMode::LocalFallback {
                replicas: self.replicas.unwrap_or(1),
            }),
            None => Err(ConfigError::new(
                "failure_mode",
                "(missing)",
                "a shared store needs a failure mode: fail_open, fail_closed or local_fallback",
            )),
        }
    }
}
