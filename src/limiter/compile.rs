//! Compiling routes for [`LimiterBuilder`](super::LimiterBuilder): each route's policy sets,
//! tiers, costs and counting rule checked and turned into the tables the decision path reads,
//! and the policy names kept unique across routes, reloads and attached routes.

use std::sync::Arc;

use super::{CompiledRoute, PolicyNames, PolicySet};
use crate::error::ConfigError;
use crate::key::KeyExtractor;
use crate::policy::Policy;
use crate::route::{Cost, CountWhen, Meter, Route};

/// `field.rest`, or `rest` alone for the default route (whose field is empty).
fn join(field: &str, rest: &str) -> String {
    if field.is_empty() {
        rest.to_owned()
    } else {
        format!("{field}.{rest}")
    }
}

/// Compiles `route`; `at` is its field (empty for the default route), its name in messages,
/// and its label in metrics.
pub(super) fn compile_route(
    at: (&str, &str, Arc<str>),
    route: &Route,
    has_tier_fn: bool,
    sets: &mut Vec<PolicySet>,
    names: &mut PolicyNames,
) -> Result<CompiledRoute, ConfigError> {
    let (field, here, label) = at;
    super::route_key::check(|rest| join(field, rest), here, route)?;
    if route.exempt {
        exempt_settings(field, here, route)?;
        return Ok(CompiledRoute {
            exempt: true,
            default_set: None,
            tiers: vec![],
        });
    }
    if route.policies.is_empty() && route.tiers.is_empty() {
        return Err(ConfigError::new(
            join(field, "policies"),
            "[]",
            format!(
                "{here} has no policies, so its requests would not be limited; give it a \
                 policy, or make it exempt (Route::exempt())"
            ),
        ));
    }
    if !route.tiers.is_empty() {
        let tiers: Vec<&str> = route.tiers.iter().map(|(t, _)| t.as_str()).collect();
        if !has_tier_fn {
            return Err(ConfigError::new(
                join(field, "tiers"),
                format_args!("{tiers:?}"),
                format!(
                    "{here} has tiers but nothing picks a request's tier; set \
                     LimiterBuilder::tier_fn (in a plan: [tier] header = \"…\")"
                ),
            ));
        }
        if route.policies.is_empty() {
            return Err(ConfigError::new(
                join(field, "policies"),
                "[]",
                format!(
                    "{here} has only tiered policies, so requests of no tier (or an unknown \
                     one) would not be limited; give it untiered policies too"
                ),
            ));
        }
    }
    let all = std::iter::once(&route.policies[..]).chain(route.tiers.iter().map(|t| &t.1[..]));
    crate::count::check_route(
        route.count.as_ref(),
        (field, here),
        all,
        !route.meters.is_empty(),
    )?;
    let cost_field = join(field, "cost");
    let default_set = compile_set(
        (&join(field, "policies"), &label),
        &cost_field,
        &route.policies,
        (&route.cost, &route.meters, route.count.as_ref()),
        super::route_key::for_set(route, None),
        sets,
        names,
    )?;
    let mut tiers = vec![];
    for (i, (tier, policies)) in route.tiers.iter().enumerate() {
        if route.tiers[..i].iter().any(|(t, _)| t == tier) {
            return Err(ConfigError::new(
                join(field, &format!("tiers[{i}]")),
                format_args!("{tier:?}"),
                "the same tier appears twice",
            ));
        }
        let tier_field = join(field, &format!("tiers.{tier}"));
        if policies.is_empty() {
            return Err(ConfigError::new(
                tier_field,
                "[]",
                "a tier without policies would not limit its requests",
            ));
        }
        let set = compile_set(
            (&tier_field, &label),
            &cost_field,
            policies,
            (&route.cost, &route.meters, route.count.as_ref()),
            super::route_key::for_set(route, Some(tier)),
            sets,
            names,
        )?;
        tiers.push((tier.clone(), set));
    }
    Ok(CompiledRoute {
        exempt: false,
        default_set: Some(default_set),
        tiers,
    })
}

/// Refuses on an exempt route what only a limited one reads: policies, a cost, a counting
/// rule, a meter (on an exempt route it would be a setting nothing reads).
fn exempt_settings(field: &str, here: &str, route: &Route) -> Result<(), ConfigError> {
    if !route.policies.is_empty() || !route.tiers.is_empty() {
        return Err(ConfigError::new(
            join(field, "exempt"),
            "true",
            format!("{here} is exempt and also has policies; it can be one or the other"),
        ));
    }
    let unread = match &route.cost {
        Cost::Fixed(c) => Some(("cost", c.to_string())),
        Cost::Computed(_) => Some(("cost", "(a function)".to_owned())),
        Cost::PolicyDefault => None,
    }
    .or_else(|| {
        route
            .count
            .as_ref()
            .map(|_| ("count", "(a counting rule)".to_owned()))
    })
    .or_else(|| {
        route
            .meters
            .first()
            .map(|(name, _)| ("meters", format!("{name:?}")))
    });
    if let Some((setting, value)) = unread {
        return Err(ConfigError::new(
            join(field, setting),
            value,
            format!("{here} is exempt: nothing is charged or counted there, so nothing reads this; delete it or give the route policies"),
        ));
    }
    Ok(())
}

/// Compiles one policy set; `at` is its field and its route's label.
fn compile_set(
    at: (&str, &Arc<str>),
    cost_field: &str,
    policies: &[Policy],
    (cost, meters, count): (&Cost, &[(String, Meter)], Option<&CountWhen>),
    key: Option<Arc<dyn KeyExtractor>>,
    sets: &mut Vec<PolicySet>,
    names: &mut PolicyNames,
) -> Result<usize, ConfigError> {
    let (field, route) = at;
    for (name, _) in meters {
        if let Some(p) = policies.iter().find(|p| p.name() == name) {
            if p.is_in_flight() || p.is_shadow() {
                return Err(ConfigError::new(
                    format!("{field}.metered"),
                    format_args!("{name:?}"),
                    "a metered policy must be an enforced rate policy (not in_flight, not shadow)",
                ));
            }
        }
    }
    for (i, p) in policies.iter().enumerate() {
        let at = format!("{field}[{i}]");
        if policies[..i].iter().any(|q| q.name() == p.name()) {
            return Err(ConfigError::new(
                format!("{at}.name"),
                format_args!("{:?}", p.name()),
                "two policies of one route share a name; their state would collide",
            ));
        }
        names.register(&at, p)?;
    }
    let enforced: Arc<[Policy]> = policies
        .iter()
        .filter(|p| !p.is_shadow())
        .cloned()
        .collect();
    let shadow: Box<[Policy]> = policies.iter().filter(|p| p.is_shadow()).cloned().collect();
    let metered = |p: &Policy| meters.iter().any(|(name, _)| name == p.name());
    let reads_cost = |p: &&Policy| !p.is_in_flight() && !metered(p);
    if !matches!(cost, Cost::PolicyDefault) && !enforced.iter().any(|p| reads_cost(&p)) {
        let value = match cost {
            Cost::Fixed(c) => c.to_string(),
            _ => "a function".to_owned(),
        };
        return Err(ConfigError::new(
            cost_field,
            value,
            "no policy of this route reads a cost (an in-flight policy takes one slot a \
             request, a metered one its meter's estimate): delete the setting",
        ));
    }
    if let Cost::Fixed(c) = cost {
        for p in enforced.iter().filter(|p| !p.is_in_flight() && !metered(p)) {
            if *c == 0 || *c > p.capacity() {
                return Err(ConfigError::new(
                    cost_field,
                    c,
                    format!(
                        "must be between 1 and the capacity of policy \"{}\" ({})",
                        p.name(),
                        p.capacity()
                    ),
                ));
            }
        }
    }
    let (penalty_of, penalties): (Vec<usize>, Vec<Policy>) = enforced
        .iter()
        .enumerate()
        .filter_map(|(i, p)| p.penalty_policy().map(|pp| (i, pp)))
        .unzip();
    let id = sets.len();
    let set_meters: Box<[(usize, Meter)]> = enforced
        .iter()
        .enumerate()
        .filter_map(|(i, p)| {
            meters
                .iter()
                .find(|(name, _)| name == p.name())
                .map(|(_, m)| (i, m.clone()))
        })
        .collect();
    let in_flight: Arc<[Policy]> = enforced
        .iter()
        .filter(|p| p.is_in_flight())
        .cloned()
        .collect();
    let default_costs: smallvec::SmallVec<[u64; 2]> = enforced.iter().map(Policy::cost).collect();
    let own_costs = super::OwnCosts::of(&enforced, &default_costs);
    sets.push(PolicySet {
        route: Arc::clone(route),
        in_flight,
        meters: set_meters,
        count: count.cloned(),
        default_costs,
        own_costs,
        shadow_costs: shadow.iter().map(Policy::cost).collect(),
        metric_keys: crate::telemetry::DecisionKeys::new(enforced.len()),
        enforced,
        shadow,
        penalties: penalties.into_boxed_slice(),
        penalty_of: penalty_of.into_boxed_slice(),
        cost: cost.clone(),
        key,
    });
    Ok(id)
}

impl PolicyNames {
    /// Keeps the names of the policies an attached route (`for_route`) still enforces after a
    /// reload replaced the names with the new plan's: a later route or plan is checked
    /// against them too. A name the new plan defines differently keeps the plan's definition
    /// and is returned, for the reload to report.
    pub(super) fn keep_attached(&mut self, sets: &[Arc<PolicySet>]) -> Vec<String> {
        let mut clashes = vec![];
        for p in sets
            .iter()
            .flat_map(|s| s.enforced.iter().chain(s.shadow.iter()))
        {
            if self.register("a route attached with for_route", p).is_err()
                && !clashes.iter().any(|n: &String| n == p.name())
            {
                clashes.push(p.name().to_owned());
            }
        }
        clashes
    }

    /// Records `policy`, declared at `at`; refuses a second, different definition under its
    /// name unless the name shares usage on purpose.
    fn register(&mut self, at: &str, policy: &Policy) -> Result<(), ConfigError> {
        let name = policy.name();
        let Some((first, first_at)) = self.declared.get(name) else {
            self.declared
                .insert(name.to_owned(), (policy.clone(), at.to_owned()));
            return Ok(());
        };
        if first == policy {
            return Ok(());
        }
        let shared = self.shared_usage.iter().any(|n| n == name);
        if shared
            && first.algorithm() == policy.algorithm()
            && first.window_millis() == policy.window_millis()
        {
            return Ok(());
        }
        let first_at = if first_at.is_empty() {
            "the default route"
        } else {
            first_at
        };
        let reason = if shared {
            format!(
                "policies named {name:?} share usage, so they must agree on the algorithm and \
                 window: {first_at} has {:?} over {} ms, this one {:?} over {} ms",
                first.algorithm(),
                first.window_millis(),
                policy.algorithm(),
                policy.window_millis()
            )
        } else {
            format!(
                "another policy named {name:?} is declared at {first_at} with a different \
                 definition ({} vs {}); a name is one policy with one counter per key: rename \
                 one, or share one counter on purpose with LimiterBuilder::share_usage",
                describe(first),
                describe(policy)
            )
        };
        Err(ConfigError::new(
            format!("{at}.name"),
            format_args!("{name:?}"),
            reason,
        ))
    }
}

fn describe(p: &Policy) -> String {
    let mut out = format!("{} {:?}", p.rate(), p.algorithm());
    if p.is_sensitive() {
        out.push_str(", sensitive");
    }
    if p.is_shadow() {
        out.push_str(", shadow");
    }
    if p.cost() != 1 {
        out.push_str(&format!(", cost {}", p.cost()));
    }
    if let Some(d) = p.max_delay() {
        out.push_str(&format!(", shaped up to {} ms", d.as_millis()));
    }
    if p.penalty_policy().is_some() {
        out.push_str(", with a penalty");
    }
    if let Some(mode) = p.failure_mode() {
        out.push_str(&format!(", {mode:?} when the store fails"));
    }
    out
}
