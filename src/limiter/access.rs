//! Allow and deny lists: keys and client networks decided before any policy.

use std::collections::HashSet;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::error::ConfigError;
use crate::key::{Key, NetworkSet};

/// Which list: a deny list refuses a key that only overlaps one of its networks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Side {
    /// Keys and networks that pass uncharged.
    #[default]
    Allow,
    /// Keys and networks refused at once.
    Deny,
}

/// Keys and client networks.
///
/// A network is matched against the client's own address wherever the request's extractor
/// reads one ([`KeyExtractor::client_addr`](crate::key::KeyExtractor::client_addr)),
/// whatever key the request gets, and otherwise against an IP key. An IPv6 key names its
/// prefix (`ip:2001:db8::/56`), not the address: an allow-listed network must contain that
/// whole prefix, and a deny-listed one refuses every prefix it overlaps (a host denied
/// inside a /56 refuses the /56, which shares one limit anyway).
#[derive(Debug, Default)]
pub(crate) struct AccessList {
    keys: HashSet<Key>,
    /// The listed networks, and the listed IP keys as networks (so that a listed address
    /// is matched against the client's address as well as against its key): a binary
    /// search per question, however long the list.
    nets: NetworkSet,
    side: Side,
    /// Nothing listed: the common case, answered without a call on every request.
    empty: bool,
}

impl AccessList {
    /// A list of `keys` and the networks `cidrs`, which are reported as `field[i]` when one
    /// does not parse.
    pub(crate) fn new(
        keys: Vec<Key>,
        field: &str,
        cidrs: &[String],
        side: Side,
    ) -> Result<Self, ConfigError> {
        let keys: HashSet<Key> = keys.into_iter().collect();
        let mut nets = parse_cidrs(field, cidrs)?;
        nets.extend(keys.iter().filter_map(key_net));
        let nets = NetworkSet::new(&nets);
        Ok(Self {
            empty: keys.is_empty() && nets.is_empty(),
            keys,
            nets,
            side,
        })
    }

    /// Whether `key` is listed, or is an IP key inside a listed network (for a deny list:
    /// overlapping one).
    #[inline]
    pub(crate) fn contains(&self, key: &Key) -> bool {
        !self.empty && self.lookup(key)
    }

    /// Whether `key` itself is listed, networks aside: for a request whose client address
    /// was screened against them already ([`contains_addr`](Self::contains_addr)).
    #[inline]
    pub(crate) fn lists_key(&self, key: &Key) -> bool {
        !self.empty && self.keys.contains(key)
    }

    /// Whether any network (or IP key) is listed: only then is a client address worth
    /// reading.
    #[inline]
    pub(crate) fn has_networks(&self) -> bool {
        !self.nets.is_empty()
    }

    /// Whether the client address `ip` is inside a listed network or is a listed IP key:
    /// as written, or as the IPv4 address it carries (IPv4-mapped, NAT64).
    pub(crate) fn contains_addr(&self, ip: IpAddr) -> bool {
        let canonical = crate::key::canonical_ip(ip);
        self.nets.contains_addr(canonical) || self.nets.contains_addr(ip)
    }

    fn lookup(&self, key: &Key) -> bool {
        if self.keys.contains(key) {
            return true;
        }
        if self.nets.is_empty() {
            return false;
        }
        let Some(net) = key_net(key) else {
            return false;
        };
        match self.side {
            Side::Allow => self.nets.contains_net(net),
            Side::Deny => self.nets.overlaps(net),
        }
    }
}

/// The network an IP key names: its address, or its IPv6 prefix; `None` for any other key.
pub(crate) fn key_net(key: &Key) -> Option<IpNet> {
    if key.source() != "ip" {
        return None;
    }
    let material = &key.as_str()["ip:".len()..];
    match material.parse::<IpAddr>() {
        Ok(ip) => Some(IpNet::from(crate::key::canonical_ip(ip))),
        Err(_) => material.parse::<IpNet>().ok(),
    }
}

fn parse_cidrs(field: &str, cidrs: &[String]) -> Result<Vec<IpNet>, ConfigError> {
    cidrs
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let c = c.trim();
            c.parse::<IpNet>()
                .map(crate::key::canonical_net)
                .or_else(|_| {
                    c.parse::<IpAddr>()
                        .map(|ip| IpNet::from(crate::key::canonical_ip(ip)))
                })
                .map_err(|_| {
                    ConfigError::new(
                        format!("{field}[{i}]"),
                        format_args!("{c:?}"),
                        "not an IP network (expected e.g. 10.0.0.0/8 or 2001:db8::/32)",
                    )
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_match_ip_keys_and_grouped_prefixes() {
        let list =
            AccessList::new(vec![], "allow_cidrs", &["10.0.0.0/8".into()], Side::Allow).unwrap();
        assert!(list.contains(&Key::new("ip", "10.1.2.3")));
        assert!(!list.contains(&Key::new("ip", "11.1.2.3")));
        assert!(!list.contains(&Key::new("user", "10.1.2.3")));
        let list =
            AccessList::new(vec![], "deny_cidrs", &["2001:db8::/32".into()], Side::Deny).unwrap();
        assert!(list.contains(&Key::new("ip", "2001:db8:1:2::/64")));
    }

    #[test]
    fn a_deny_list_refuses_every_ipv6_prefix_it_overlaps_and_an_allow_list_only_whole_ones() {
        let narrow = [
            "2001:db8:0:1::bad".to_owned(),
            "2001:db8:0:2::/64".to_owned(),
        ];
        let deny = AccessList::new(vec![], "deny_cidrs", &narrow, Side::Deny).unwrap();
        let allow = AccessList::new(vec![], "allow_cidrs", &narrow, Side::Allow).unwrap();
        let prefix = Key::new("ip", "2001:db8::/56");
        assert!(deny.contains(&prefix));
        assert!(
            !allow.contains(&prefix),
            "the /56 is wider than what was allowed"
        );
        assert!(!deny.contains(&Key::new("ip", "2001:db8:0:100::/56")));
        // The address itself, where the extractor reads one.
        assert!(deny.contains_addr("2001:db8:0:1::bad".parse().unwrap()));
        assert!(!deny.contains_addr("2001:db8:0:1::bae".parse().unwrap()));
        assert!(allow.contains_addr("2001:db8:0:2::9".parse().unwrap()));
        // A listed IP key is a network too, and an IPv4-mapped address is its IPv4 one.
        let keyed = AccessList::new(
            vec![
                Key::new("ip", "2001:db8:0:1::bad"),
                Key::new("ip", "192.0.2.1"),
            ],
            "deny_cidrs",
            &[],
            Side::Deny,
        )
        .unwrap();
        assert!(keyed.contains(&prefix));
        assert!(keyed.contains_addr("::ffff:192.0.2.1".parse().unwrap()));
        assert!(keyed.has_networks());
    }

    #[test]
    fn bad_networks_name_the_field() {
        let err =
            AccessList::new(vec![], "allow_cidrs", &["nope".into()], Side::Allow).unwrap_err();
        assert_eq!(err.field(), "allow_cidrs[0]");
        let err = AccessList::new(
            vec![],
            "deny_cidrs",
            &["1.2.3.0/24".into(), "10.0.0.0/33".into()],
            Side::Deny,
        )
        .unwrap_err();
        assert_eq!(err.field(), "deny_cidrs[1]");
    }
}
