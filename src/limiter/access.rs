//! Allow and deny lists: keys and client networks decided before any policy.

use std::collections::HashSet;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::error::ConfigError;
use crate::key::Key;

/// Keys and, for IP keys, client networks.
#[derive(Debug, Default)]
pub(crate) struct AccessList {
    keys: HashSet<Key>,
    nets: Vec<IpNet>,
    /// Nothing listed: the common case, answered without a call on every request.
    empty: bool,
}

impl AccessList {
    /// A list of `keys` and the networks `cidrs`, which are reported as `field[i]` when one
    /// does not parse.
    pub(crate) fn new(keys: Vec<Key>, field: &str, cidrs: &[String]) -> Result<Self, ConfigError> {
        let keys: HashSet<Key> = keys.into_iter().collect();
        let nets = parse_cidrs(field, cidrs)?;
        Ok(Self {
            empty: keys.is_empty() && nets.is_empty(),
            keys,
            nets,
        })
    }

    /// Whether `key` is listed, or is an IP key inside a listed network.
    #[inline]
    pub(crate) fn contains(&self, key: &Key) -> bool {
        !self.empty && self.lookup(key)
    }

    fn lookup(&self, key: &Key) -> bool {
        if self.keys.contains(key) {
            return true;
        }
        if self.nets.is_empty() || key.source() != "ip" {
            return false;
        }
        let material = &key.as_str()["ip:".len()..];
        let net = match material.parse::<IpAddr>() {
            Ok(ip) => IpNet::from(ip),
            Err(_) => match material.parse::<IpNet>() {
                Ok(net) => net,
                Err(_) => return false,
            },
        };
        self.nets.iter().any(|n| n.contains(&net))
    }
}

fn parse_cidrs(field: &str, cidrs: &[String]) -> Result<Vec<IpNet>, ConfigError> {
    cidrs
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let c = c.trim();
            c.parse::<IpNet>()
                .or_else(|_| c.parse::<IpAddr>().map(IpNet::from))
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
        let list = AccessList::new(vec![], "allow_cidrs", &["10.0.0.0/8".into()]).unwrap();
        assert!(list.contains(&Key::new("ip", "10.1.2.3")));
        assert!(!list.contains(&Key::new("ip", "11.1.2.3")));
        assert!(!list.contains(&Key::new("user", "10.1.2.3")));
        let list = AccessList::new(vec![], "deny_cidrs", &["2001:db8::/32".into()]).unwrap();
        assert!(list.contains(&Key::new("ip", "2001:db8:1:2::/64")));
    }

    #[test]
    fn bad_networks_name_the_field() {
        let err = AccessList::new(vec![], "allow_cidrs", &["nope".into()]).unwrap_err();
        assert_eq!(err.field(), "allow_cidrs[0]");
        let err = AccessList::new(
            vec![],
            "deny_cidrs",
            &["1.2.3.0/24".into(), "10.0.0.0/33".into()],
        )
        .unwrap_err();
        assert_eq!(err.field(), "deny_cidrs[1]");
    }
}
