//! The audit's own checks: its docs list every rule; which proxy ranges trust everyone.

use super::*;

#[test]
fn the_module_docs_list_every_rule() {
    let docs = include_str!("../audit.rs");
    for r in RULES {
        let row = format!(
            "//! | `{}` {} | {} | {} |",
            r.id,
            r.name,
            format!("{:?}", r.severity).to_lowercase(),
            r.trips
        );
        assert!(docs.contains(&row), "missing or stale row: {row}");
    }
}

#[test]
fn wide_public_ranges_trust_everyone_and_private_ones_do_not() {
    let judge = |s: &str| trusts_everyone(s.parse().unwrap());
    for wide in [
        "0.0.0.0/0",
        "::/0",
        "1.0.0.0/7",
        "128.0.0.0/1",
        "2000::/3",
        "2001::/15",
        "::ffff:0:0/96",
        "::ffff:0.0.0.0/100",
        "fc00::/0",
    ] {
        assert!(judge(wide), "{wide}");
    }
    for fine in [
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "104.16.0.0/13",
        "198.51.100.8/29",
        "fc00::/7",
        "fd00::/8",
        "fe80::/10",
        "::1/128",
        "2400:cb00::/32",
        "2001:db8::/16",
        "::ffff:10.0.0.0/104",
        "203.0.113.7/32",
    ] {
        assert!(!judge(fine), "{fine}");
    }
}
