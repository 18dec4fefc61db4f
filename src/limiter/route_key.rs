//! A route's own key: which extractor keys a policy set's requests, and the mistakes in
//! naming one that building refuses.

use std::sync::Arc;

use std::net::IpAddr;

use super::access::key_net;
use super::decide::{screen_lists, Listed};
use super::{Lists, MissingKey, PolicySet};
use crate::error::ConfigError;
use crate::key::{Key, KeyExtractor, RequestView};
use crate::route::Route;

/// The extractor of a route's set: the tier's own key, else the route's, else `None` (the
/// limiter's).
pub(super) fn for_set(route: &Route, tier: Option<&str>) -> Option<Arc<dyn KeyExtractor>> {
    tier.and_then(|tier| route.tier_keys.iter().find(|(t, _)| t == tier))
        .map(|(_, key)| key)
        .or(route.key.as_ref())
        .cloned()
}

/// Refuses a key nothing would read: on an exempt route, or for a tier the route does not
/// have (or named twice). `field` names a setting of the route in errors, `here` the route in
/// messages.
pub(super) fn check(
    field: impl Fn(&str) -> String,
    here: &str,
    route: &Route,
) -> Result<(), ConfigError> {
    if route.exempt && route.key.is_some() {
        return Err(ConfigError::new(
            field("key"),
            format_args!("{:?}", route.key),
            format!("{here} is exempt, so no key is read for its requests: drop the key or the exemption"),
        ));
    }
    for (i, (tier, key)) in route.tier_keys.iter().enumerate() {
        let at = field(&format!("tier_keys.{tier}"));
        if !route.tiers.iter().any(|(t, _)| t == tier) {
            return Err(ConfigError::new(
                at,
                format_args!("{key:?}"),
                format!("{here} has no tier {tier:?}, so this key would key nothing: add the tier's policies with Route::tier, or drop the key"),
            ));
        }
        if route.tier_keys[..i].iter().any(|(t, _)| t == tier) {
            return Err(ConfigError::new(
                at,
                format_args!("{key:?}"),
                "the same tier is given a key twice",
            ));
        }
    }
    Ok(())
}

impl Lists {
    /// The key for a request of `set` (`None`: of an exempt route): the set's own
    /// extractor's, or the limiter's, or the shared anonymous key, or `None` when the request
    /// must be refused for want of a key.
    #[inline]
    pub(crate) fn key_for(
        &self,
        set: Option<&PolicySet>,
        request: &RequestView<'_>,
    ) -> Option<Key> {
        let extractor = set
            .and_then(|s| s.key.as_deref())
            .unwrap_or(&*self.extractor);
        match extractor.extract(request) {
            Some(key) => Some(key),
            None => match self.missing_key {
                MissingKey::Reject => None,
                MissingKey::Shared => Some(Key::new("anonymous", "")),
            },
        }
    }

    /// The client address of a request of `set`, when client networks are listed and an
    /// extractor reads one: the set's own key's extractor, else the limiter's (a route keyed
    /// by API key still comes from an address).
    #[inline]
    pub(crate) fn client_addr(&self, set: &PolicySet, request: &RequestView<'_>) -> Option<IpAddr> {
        if !self.deny.has_networks() && !self.allow.has_networks() {
            return None;
        }
        set.key
            .as_deref()
            .and_then(|own| own.client_addr(request))
            .or_else(|| self.extractor.client_addr(request))
    }

    /// Warns, once when the limiter is built, when client networks are listed but the
    /// limiter's extractor never reads a client address ([`KeyExtractor::client_addr`]: a
    /// [`from_fn`](crate::key::from_fn) extractor, a wrapper of your own that does not
    /// forward it): the networks then apply to `ip` keys alone, and a client keyed by a
    /// user or an API key is not screened by its address.
    pub(crate) fn warn_if_networks_unread(&self) {
        if !self.deny.has_networks() && !self.allow.has_networks() {
            return;
        }
        let mut probe = http::Request::new(());
        probe
            .extensions_mut()
            .insert(std::net::SocketAddr::from(([192, 0, 2, 1], 40_000)));
        if self
            .extractor
            .client_addr(&RequestView::new(&probe))
            .is_none()
        {
            tracing::warn!(
                target: "tollgate::config",
                "client networks are listed, but the key extractor reads no client address \
                 (KeyExtractor::client_addr): they apply to `ip` keys alone; implement \
                 client_addr on the extractor to screen every request by its address"
            );
        }
    }

    /// Where a request keyed `key` from the client address `addr` stands on the lists.
    ///
    /// A key of another kind than `ip` (an API key, a user) is screened by the address
    /// against the networks, so that a client in a denied network cannot step out of it
    /// with a key of its choosing. An `ip` key that names the address (its prefix holds
    /// it) is screened by the address too, exactly, not by the /56 it names. An `ip` key of
    /// another address (read from a header by an extractor of your own, while the address
    /// is the load balancer's) is the client: it is screened as a key, and the address is
    /// not used.
    pub(crate) fn screen(&self, key: &Key, addr: Option<IpAddr>) -> Listed {
        let by_addr = match (addr, key_net(key)) {
            (Some(ip), Some(net)) if net.contains(&crate::key::canonical_ip(ip)) => Some(ip),
            (Some(ip), None) => Some(ip),
            _ => None,
        };
        let Some(ip) = by_addr else {
            return screen_lists(self, key);
        };
        if self.deny.lists_key(key) || self.deny.contains_addr(ip) {
            Listed::Denied
        } else if self.allow.lists_key(key) || self.allow.contains_addr(ip) {
            Listed::Allowed
        } else {
            Listed::No
        }
    }

    /// How `set`'s requests are keyed, as the extractor's `Debug` shows it (which shows no
    /// key material and no secret), and whether that is the set's own key.
    pub(crate) fn describe_key(&self, set: &PolicySet) -> (String, bool) {
        match &set.key {
            Some(own) => (format!("{own:?}"), true),
            None => (format!("{:?}", self.extractor), false),
        }
    }
}
