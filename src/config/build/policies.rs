//! Policies, routes and tiers: the limiter builder a plan describes, and the settings it
//! would leave unread.

use std::collections::{BTreeMap, BTreeSet};

use super::key::header_name;
use crate::config::schema::{parse_duration, Plan};
use crate::error::ConfigError;
use crate::limiter::{Limiter, LimiterBuilder};
use crate::policy::{Policy, Rate};
use crate::route::Route;
use crate::store::Store;

impl Plan {
    pub(super) fn rate(&self, i: usize) -> Result<Rate, ConfigError> {
        let p = &self.policies[i];
        let window = parse_duration("window", &p.window)
            .map_err(|e| e.within(format_args!("policies[{i}]")))?;
        let rate = Rate::new(p.limit, window);
        Ok(match p.burst {
            Some(b) => rate.with_burst(b),
            None => rate,
        })
    }

    pub(super) fn policy(&self, i: usize) -> Result<Policy, ConfigError> {
        let p = &self.policies[i];
        let at = format!("policies[{i}]");
        let builder = |rate: Rate| {
            let mut b = Policy::builder(p.name.clone(), rate)
                .algorithm(p.algorithm)
                .sensitive(p.sensitive)
                .shadow(p.shadow);
            if let Some(c) = p.cost {
                b = b.cost(c);
            }
            if let Some(d) = &p.penalty {
                b = b.penalty(parse_duration("penalty", d)?);
            }
            if let Some(d) = &p.max_delay {
                b = b.shape(parse_duration("max_delay", d)?);
            }
            Ok::<_, ConfigError>(b)
        };
        let rate = self.rate(i)?;
        builder(rate)
            .and_then(crate::PolicyBuilder::build)
            .map_err(|e| {
                // A window so long that not even a limit of 1 builds is the window's fault.
                let window_alone = e.field() == "limit"
                    && builder(Rate::new(1, rate.window()))
                        .and_then(|b| b.cost(1).build())
                        .is_err_and(|e| e.field() == "limit");
                if window_alone {
                    ConfigError::new(
                        format!("{at}.window"),
                        format_args!("{:?}", p.window),
                        "too long: limit × window must not exceed 2^50 ms, and this window alone does",
                    )
                } else {
                    e.within(&at)
                }
            })
    }

    /// Builds and validates every policy, by name: the policies the plan's routes, default
    /// and login guard refer to.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] on `policies[i].<field>`, or on `policies[i].name` when two policies
    /// share a name.
    ///
    /// ```
    /// let plan = tollgate::config::Plan::from_toml("[[policies]]\nname = \"api\"\nlimit = 5\nwindow = \"1s\"")?;
    /// assert_eq!(plan.build_policies()?["api"].limit(), 5);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn build_policies(&self) -> Result<BTreeMap<String, Policy>, ConfigError> {
        let mut out = BTreeMap::new();
        for (i, p) in self.policies.iter().enumerate() {
            let policy = self.policy(i)?;
            if out.insert(p.name.clone(), policy).is_some() {
                return Err(ConfigError::new(
                    format!("policies[{i}].name"),
                    format_args!("{:?}", p.name),
                    "two policies share this name",
                ));
            }
        }
        Ok(out)
    }

    pub(super) fn lookup(
        policies: &BTreeMap<String, Policy>,
        field: &str,
        names: &[String],
    ) -> Result<Vec<Policy>, ConfigError> {
        names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                policies.get(n).cloned().ok_or_else(|| {
                    ConfigError::new(
                        format!("{field}[{i}]"),
                        format_args!("{n:?}"),
                        "no policy has this name",
                    )
                })
            })
            .collect()
    }

    pub(super) fn route(
        policies: &BTreeMap<String, Policy>,
        field: &str,
        names: &[String],
        tiers: &BTreeMap<String, Vec<String>>,
    ) -> Result<Route, ConfigError> {
        let mut route =
            Route::new().policies(Self::lookup(policies, &format!("{field}.policies"), names)?);
        for (tier, names) in tiers {
            route = route.tier(
                tier.clone(),
                Self::lookup(policies, &format!("{field}.tiers.{tier}"), names)?,
            );
        }
        Ok(route)
    }

    /// Settings of the plan that would build nothing: a policy no route, default or
    /// `[login]` uses, and policies or a cost on an exempt route.
    pub(super) fn unused(&self) -> Vec<ConfigError> {
        let mut errors = vec![];
        fn names<'a>(
            policies: &'a [String],
            tiers: &'a BTreeMap<String, Vec<String>>,
        ) -> impl Iterator<Item = &'a str> {
            policies
                .iter()
                .chain(tiers.values().flatten())
                .map(String::as_str)
        }
        let mut used: BTreeSet<&str> = names(&self.default.policies, &self.default.tiers).collect();
        for (i, r) in self.routes.iter().enumerate() {
            if !r.exempt {
                used.extend(names(&r.policies, &r.tiers));
                continue;
            }
            let ignored = [
                (
                    "policies",
                    !r.policies.is_empty(),
                    format!("{:?}", r.policies),
                ),
                ("tiers", !r.tiers.is_empty(), format!("{:?}", r.tiers)),
                (
                    "cost",
                    r.cost.is_some(),
                    format!("{:?}", r.cost.unwrap_or(0)),
                ),
                ("count", r.count.is_some(), format!("{:?}", r.count)),
                ("key", r.key.is_some(), format!("{:?}", r.key)),
                (
                    "tier_keys",
                    !r.tier_keys.is_empty(),
                    format!("{:?}", r.tier_keys),
                ),
            ];
            for (field, set, value) in ignored {
                if set {
                    errors.push(ConfigError::new(
                        format!("routes[{i}].{field}"),
                        value,
                        "an exempt route applies no policy: drop this setting or `exempt = true`",
                    ));
                }
            }
        }
        if let Some(login) = &self.login {
            used.extend(
                [&login.ip_username, &login.ip, &login.username]
                    .into_iter()
                    .flatten()
                    .map(String::as_str),
            );
        }
        for (i, p) in self.policies.iter().enumerate() {
            if !used.contains(p.name.as_str()) {
                errors.push(ConfigError::new(
                    format!("policies[{i}]"),
                    format_args!("{:?}", p.name),
                    "no route, [default] or [login] uses this policy, so it limits nothing: attach it or delete it",
                ));
            }
        }
        errors
    }

    /// A limiter builder configured from the plan, on `store`: the policies, routes, tiers,
    /// key and lists. The store is yours, so what the plan says of a store is not read here:
    /// `[store]`, `failure_mode` and `replicas` (wrap `store` in a
    /// [`ResilientStore`](crate::store::ResilientStore) for a failure mode), and neither are
    /// `[login]` ([`login_guard_with_store`](Self::login_guard_with_store)) nor the response
    /// settings ([`build`](Self::build) gives a limiter that brings them to its layers).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field.
    ///
    /// ```
    /// use tollgate::{config::Plan, store::MemoryStore};
    ///
    /// let plan = Plan::from_toml(
    ///     "[[policies]]\nname = \"api\"\nlimit = 5\nwindow = \"1s\"\n[default]\npolicies = [\"api\"]",
    /// )?;
    /// let limiter = plan.builder_with_store(MemoryStore::new())?.build()?;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn builder_with_store<S: Store>(&self, store: S) -> Result<LimiterBuilder<S>, ConfigError> {
        let builder = self.limiter_builder(store)?;
        match self.unused().into_iter().next() {
            Some(e) => Err(e),
            None => Ok(builder),
        }
    }

    pub(super) fn limiter_builder<S: Store>(
        &self,
        store: S,
    ) -> Result<LimiterBuilder<S>, ConfigError> {
        let policies = self.build_policies()?;
        let default = if self.default.exempt {
            if !self.default.policies.is_empty()
                || !self.default.tiers.is_empty()
                || self.default.count.is_some()
            {
                return Err(ConfigError::new(
                    "default.exempt",
                    "true",
                    "the default route is exempt and also has policies; it can be one or the other",
                ));
            }
            Route::exempt()
        } else {
            let route = Self::route(
                &policies,
                "default",
                &self.default.policies,
                &self.default.tiers,
            )?;
            match &self.default.count {
                Some(count) => route.count_when(count.count_when("default.count")?),
                None => route,
            }
        };
        let mut b = Limiter::builder()
            .store(store)
            .default_route(default)
            .missing_key(self.missing_key);
        b = b.extractor(self.extractor()?);
        for (i, r) in self.routes.iter().enumerate() {
            let at = format!("routes[{i}]");
            let route = if r.exempt {
                Route::exempt()
            } else {
                let mut route = Self::route(&policies, &at, &r.policies, &r.tiers)?;
                if let Some(c) = r.cost {
                    route = route.cost(c);
                }
                if let Some(count) = &r.count {
                    route = route.count_when(count.count_when(&format!("{at}.count"))?);
                }
                if let Some(key) = &r.key {
                    route = route.key(key.build(&format!("{at}.key"))?);
                }
                for (tier, key) in &r.tier_keys {
                    route = route.tier_key(tier, key.build(&format!("{at}.tier_keys.{tier}"))?);
                }
                route
            };
            b = b.route(r.pattern.clone(), route);
        }
        for cidr in &self.allow_cidrs {
            b = b.allow_cidr(cidr.clone());
        }
        for cidr in &self.deny_cidrs {
            b = b.deny_cidr(cidr.clone());
        }
        if let Some(header) = &self.tier.header {
            let tiered = !self.default.tiers.is_empty()
                || self
                    .routes
                    .iter()
                    .any(|r| !r.tiers.is_empty() || !r.tier_keys.is_empty());
            if !tiered {
                return Err(ConfigError::new(
                    "tier.header",
                    format_args!("{header:?}"),
                    "no route and not the default has tiers to pick: add tiers, or delete [tier]",
                ));
            }
            let name = header_name("tier.header", header)?;
            b = b.tier_fn(move |req| req.headers().get(&name).and_then(|v| v.to_str().ok()));
        }
        Ok(b)
    }
}
