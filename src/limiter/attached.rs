//! The label of a route attached through axum's router ([`Limiter::for_route`]): the path
//! pattern axum matched (`/reports/{id}`), which is not known when the route is attached.
//!
//! axum puts the pattern it matched in the request's extensions before a `route_layer` sees
//! the request. Each pattern gets its own copy of the route's policy sets, labelled with it
//! (so metrics, the trace event and `inspect` name the pattern), made on its first request
//! and kept: the patterns are the application's routes, not its requests' paths. Past
//! [`MAX_PATTERNS`], or without axum's pattern (tonic, the direct API without one), a request
//! keeps the label `for_route`.
//!
//! [`Limiter::for_route`]: super::Limiter::for_route

// Without axum no request carries a pattern: every set keeps the plan's label.
#![cfg_attr(not(feature = "axum"), allow(dead_code, unused_imports))]

use std::ops::Deref;
use std::sync::{Arc, PoisonError, RwLock};

use super::PolicySet;
use crate::key::RequestView;

/// How many patterns one attached limiter labels: the routes one layer is attached to.
pub(super) const MAX_PATTERNS: usize = 64;

/// A request's policy set: the plan's own, or a labelled copy of it.
pub(crate) enum SetRef<'a> {
    Plan(&'a Arc<PolicySet>),
    Labelled(Arc<PolicySet>),
}

impl Deref for SetRef<'_> {
    type Target = Arc<PolicySet>;

    #[inline]
    fn deref(&self) -> &Arc<PolicySet> {
        match self {
            SetRef::Plan(set) => set,
            SetRef::Labelled(set) => set,
        }
    }
}

/// A pattern and its copies of the attached limiter's policy sets.
type Labelled = (Arc<str>, Box<[Arc<PolicySet>]>);

/// The labelled copies of an attached limiter's policy sets, by pattern.
#[derive(Default)]
pub(super) struct Labels {
    by_pattern: RwLock<Vec<Labelled>>,
}

impl Labels {
    /// Set `id` of `sets`, labelled with the pattern axum matched for `request` when it has
    /// one.
    #[cfg_attr(not(feature = "axum"), allow(unused_variables))]
    pub(super) fn set<'a>(
        &self,
        sets: &'a [Arc<PolicySet>],
        id: usize,
        request: &RequestView<'_>,
    ) -> SetRef<'a> {
        #[cfg(feature = "axum")]
        if let Some(matched) = request.extensions().get::<axum::extract::MatchedPath>() {
            if let Some(set) = self.labelled(sets, id, matched.as_str()) {
                return SetRef::Labelled(set);
            }
        }
        SetRef::Plan(&sets[id])
    }

    #[cfg(feature = "axum")]
    fn labelled(
        &self,
        sets: &[Arc<PolicySet>],
        id: usize,
        pattern: &str,
    ) -> Option<Arc<PolicySet>> {
        let find = |known: &[Labelled]| {
            known
                .iter()
                .find(|(p, _)| &**p == pattern)
                .and_then(|(_, copies)| copies.get(id).cloned())
        };
        if let Some(set) = find(
            &self
                .by_pattern
                .read()
                .unwrap_or_else(PoisonError::into_inner),
        ) {
            return Some(set);
        }
        let mut known = self
            .by_pattern
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        // Another request may have labelled it meanwhile.
        if let Some(set) = find(&known) {
            return Some(set);
        }
        if known.len() >= MAX_PATTERNS {
            return None;
        }
        let label: Arc<str> = Arc::from(pattern);
        let copies: Box<[Arc<PolicySet>]> = sets
            .iter()
            .map(|s| Arc::new(s.labelled(Arc::clone(&label))))
            .collect();
        let set = copies.get(id).cloned();
        known.push((label, copies));
        set
    }
}

impl PolicySet {
    /// This set under another label, with its own metric keys (built for that label).
    #[cfg(feature = "axum")]
    fn labelled(&self, route: Arc<str>) -> Self {
        Self {
            route,
            enforced: Arc::clone(&self.enforced),
            in_flight: Arc::clone(&self.in_flight),
            meters: self.meters.clone(),
            count: self.count.clone(),
            shadow: self.shadow.clone(),
            penalties: self.penalties.clone(),
            penalty_of: self.penalty_of.clone(),
            cost: self.cost.clone(),
            default_costs: self.default_costs.clone(),
            own_costs: self.own_costs,
            shadow_costs: self.shadow_costs.clone(),
            metric_keys: crate::telemetry::DecisionKeys::new(self.enforced.len()),
            key: self.key.clone(),
        }
    }
}
