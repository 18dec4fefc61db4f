//! A set of IP networks asked about on every request: merged into disjoint networks sorted by
//! address (`ipnet`'s `aggregate`) when built, so that a question costs a binary search
//! whatever the list's length — a threat feed of thousands of networks costs no more per
//! request than a handful.

use std::net::IpAddr;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// Disjoint networks of each family, sorted by their first address.
#[derive(Debug, Clone, Default)]
pub(crate) struct NetworkSet {
    v4: Vec<Ipv4Net>,
    v6: Vec<Ipv6Net>,
}

impl NetworkSet {
    /// The union of `nets`.
    pub(crate) fn new<'a>(nets: impl IntoIterator<Item = &'a IpNet>) -> Self {
        let (mut v4, mut v6) = (vec![], vec![]);
        for net in nets {
            match net {
                IpNet::V4(n) => v4.push(*n),
                IpNet::V6(n) => v6.push(*n),
            }
        }
        Self {
            v4: Ipv4Net::aggregate(&v4),
            v6: Ipv6Net::aggregate(&v6),
        }
    }

    /// Whether no network is in the set.
    pub(crate) fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty()
    }

    /// Whether `ip` is in the set.
    pub(crate) fn contains_addr(&self, ip: IpAddr) -> bool {
        self.contains_net(IpNet::from(ip))
    }

    /// Whether every address of `net` is in the set.
    pub(crate) fn contains_net(&self, net: IpNet) -> bool {
        match net {
            IpNet::V4(n) => at_or_before(&self.v4, n.network()).is_some_and(|s| s.contains(&n)),
            IpNet::V6(n) => at_or_before(&self.v6, n.network()).is_some_and(|s| s.contains(&n)),
        }
    }

    /// Whether `net` shares an address with the set.
    pub(crate) fn overlaps(&self, net: IpNet) -> bool {
        match net {
            IpNet::V4(n) => overlaps(&self.v4, &n, n.network()),
            IpNet::V6(n) => overlaps(&self.v6, &n, n.network()),
        }
    }
}

/// The network of `sorted` that starts last at or before `first`.
fn at_or_before<N: Network>(sorted: &[N], first: N::Addr) -> Option<&N> {
    let after = sorted.partition_point(|n| n.first() <= first);
    after.checked_sub(1).map(|i| &sorted[i])
}

/// Two networks share an address only when one holds the other: `net` overlaps `sorted` when
/// the network starting last at or before it holds its first address (or, starting at the
/// same address, lies inside it), or the first starting after its first address starts
/// inside it.
fn overlaps<N: Network>(sorted: &[N], net: &N, first: N::Addr) -> bool {
    let after = sorted.partition_point(|n| n.first() <= first);
    let before = after.checked_sub(1).map(|i| &sorted[i]);
    before.is_some_and(|b| b.holds_addr(first) || net.holds_addr(b.first()))
        || sorted
            .get(after)
            .is_some_and(|next| net.holds_addr(next.first()))
}

/// What the two families share here.
trait Network {
    type Addr: Ord + Copy;
    fn first(&self) -> Self::Addr;
    fn holds_addr(&self, addr: Self::Addr) -> bool;
}

impl Network for Ipv4Net {
    type Addr = std::net::Ipv4Addr;
    fn first(&self) -> Self::Addr {
        self.network()
    }
    fn holds_addr(&self, addr: Self::Addr) -> bool {
        self.contains(&addr)
    }
}

impl Network for Ipv6Net {
    type Addr = std::net::Ipv6Addr;
    fn first(&self) -> Self::Addr {
        self.network()
    }
    fn holds_addr(&self, addr: Self::Addr) -> bool {
        self.contains(&addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set(nets: &[&str]) -> NetworkSet {
        let nets: Vec<IpNet> = nets.iter().map(|n| n.parse().unwrap()).collect();
        NetworkSet::new(&nets)
    }

    #[test]
    fn addresses_networks_and_overlaps() {
        let s = set(&[
            "10.0.0.0/8",
            "192.168.1.0/24",
            "192.168.0.0/24",
            "2001:db8::/32",
        ]);
        assert!(s.contains_addr("10.1.2.3".parse().unwrap()));
        assert!(!s.contains_addr("11.0.0.0".parse().unwrap()));
        assert!(!s.contains_addr("9.255.255.255".parse().unwrap()));
        // Two adjacent /24s merged: the /23 they make is held whole.
        assert!(s.contains_net("192.168.0.0/23".parse().unwrap()));
        assert!(!s.contains_net("192.168.0.0/22".parse().unwrap()));
        assert!(s.overlaps("192.168.0.0/16".parse().unwrap()));
        assert!(s.overlaps("2001:db8:1::/48".parse().unwrap()));
        assert!(s.overlaps("2001::/16".parse().unwrap()));
        assert!(!s.overlaps("2001:db9::/32".parse().unwrap()));
        assert!(!set(&[]).overlaps("0.0.0.0/0".parse().unwrap()));
        assert!(set(&["0.0.0.0/0"]).contains_addr("203.0.113.9".parse().unwrap()));
    }

    fn net4() -> impl Strategy<Value = IpNet> {
        (any::<u32>(), 0u8..=32)
            .prop_map(|(a, p)| IpNet::V4(Ipv4Net::new(a.into(), p).unwrap().trunc()))
    }

    proptest! {
        /// The set answers as a scan of the networks it was made from.
        #[test]
        fn answers_as_a_linear_scan(
            nets in proptest::collection::vec(net4(), 0..40),
            probes in proptest::collection::vec(net4(), 1..40),
        ) {
            let s = NetworkSet::new(&nets);
            for probe in probes {
                let addr = probe.network();
                prop_assert_eq!(s.contains_addr(addr), nets.iter().any(|n| n.contains(&addr)));
                prop_assert_eq!(
                    s.overlaps(probe),
                    nets.iter().any(|n| n.contains(&probe) || probe.contains(n))
                );
                // Held by one listed network: held by the set (which may also hold what
                // only several together cover).
                if nets.iter().any(|n| n.contains(&probe)) {
                    prop_assert!(s.contains_net(probe));
                }
            }
        }
    }
}
