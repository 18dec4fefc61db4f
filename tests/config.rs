//! The TOML plan: parsing errors, build errors, the audit rules, and plans (limiter and login
//! guard) serving a real axum app.

mod support;

use axum::routing::{get, post};
use axum::Router;
use tollgate::audit::Severity;
use tollgate::config::Plan;
use tollgate::{audit, Limiter, RateLimitLayer};

const BASE: &str = r#"
[[policies]]
name = "api"
limit = 100
window = "1m"
[default]
policies = ["api"]
"#;

#[test]
fn broken_files_name_the_field_and_value() {
    let cases: &[(&str, &str, &str)] = &[
        ("[[policies]]\nname = \"a\"\nlimit = 0\nwindow = \"1m\"", "policies[0].limit", "0"),
        ("[[policies]]\nname = \"a\"\nlimit = -1\nwindow = \"1m\"", "policies[0].limit", ""),
        ("[[policies]]\nname = \"a\"\nlimit = 5\nwindow = \"soon\"", "policies[0].window", "\"soon\""),
        ("[[policies]]\nname = \"a\"\nlimit = 5\nwindow = \"0s\"", "policies[0].window", ""),
        ("[[policies]]\nname = \"a\"\nlimit = 5\nwindow = \"1m\"\nalgorithm = \"magic\"", "policies[0].algorithm", ""),
        ("[[policies]]\nname = \"a\"\nlimit = 5\nwindow = \"1m\"\nburst = 9", "policies[0].burst", "9"),
        ("[[policies]]\nname = \"a\"\nlimit = 5\nwindow = \"1m\"\ncost = 6", "policies[0].cost", "6"),
        ("[[policies]]\nname = \"a b\"\nlimit = 5\nwindow = \"1m\"", "policies[0].name", "\"a b\""),
        ("[[policies]]\nname = \"a\"\nlimit = 5\nwindow = \"1m\"\n[[policies]]\nname = \"a\"\nlimit = 5\nwindow = \"1m\"", "policies[1].name", "\"a\""),
        ("[[policies]]\nname = \"a\"\nlimit = 5\nwindow = \"1m\"\nmax_delay = \"1s\"", "policies[0].max_delay", ""),
        ("[[policies]]\nname = \"a\"\nlimit = 5\nwindow = \"1m\"\nlimt = 5", "policies[0].limt", ""),
        ("header_style = \"fancy\"", "header_style", ""),
        ("replicas = \"three\"", "replicas", ""),
        ("[store]\nkind = \"postgres\"", "store.kind", ""),
        ("[[routes]]\npattern = \"/a\"\npolicies = 3", "routes[0].policies", ""),
        ("[policies", "(file)", "line 1, column 10"),
        ("replicas = 1\nreplicas = 2", "(file)", "line 2, column 1"),
        (
            "[[policies]]\nname = \"a\"\nlimit = 5\nwindow = \"18446744073709551615s\"",
            "policies[0].window",
            "\"18446744073709551615s\"",
        ),
        ("[store]\nkey_template = \"rl:{<key>}\"", "store.key_template", ""),
        ("telemetry = false", "telemetry", ""),
    ];
    for (text, field, value) in cases {
        let err = Plan::from_toml(text).expect_err(text);
        assert_eq!(err.field(), *field, "{text}\n→ {err}");
        if !value.is_empty() {
            assert_eq!(err.value(), *value, "{text}\n→ {err}");
        }
        assert!(!err.reason().is_empty());
    }
}

#[test]
fn build_errors_name_the_field() {
    let cases: &[(&str, &str)] = &[
        (
            "[[routes]]\npattern = \"/a\"\npolicies = [\"nope\"]",
            "routes[0].policies[0]",
        ),
        (
            "[[routes]]\npattern = \"/b\"\ntiers = { pro = [\"nope\"] }",
            "routes[0].tiers.pro[0]",
        ),
        (
            "[[routes]]\npattern = \"login\"\npolicies = [\"api\"]",
            "routes[0].pattern",
        ),
        (
            "[[routes]]\npattern = \"/a\"\npolicies = [\"api\"]\ncost = 1000",
            "routes[0].cost",
        ),
        ("[key]\nkind = \"header\"", "key.header"),
        ("[key]\nipv6_prefix = 0", "key.ipv6_prefix"),
        (
            "[key]\nkind = \"api_key\"\n[key.fallback]\nkind = \"client_ip\"\nipv6_prefix = 200",
            "key.fallback.ipv6_prefix",
        ),
        (
            "[key]\nkind = \"peer_ip\"\ntrusted_proxies = [\"10.0.0.0/8\"]",
            "key.trusted_proxies",
        ),
        ("[tier]\nheader = \"bad header\"", "tier.header"),
        (
            "[key]\nkind = \"client_ip\"\ntrusted_proxies = [\"10.0.0.0/8\", \"nope\"]",
            "key.trusted_proxies[1]",
        ),
        (
            "[key]\nkind = \"client_ip\"\nheader = \"not a header\"",
            "key.header",
        ),
        ("[key]\nkind = \"user\"", "key.kind"),
        (
            "[key]\nkind = \"api_key\"\n[key.fallback]\nkind = \"client_ip\"\ntrusted_proxies = [\"x\"]",
            "key.fallback.trusted_proxies[0]",
        ),
        (
            "[key]\nkind = \"api_key\"\nsecret_env = \"TOLLGATE_TEST_UNSET_VARIABLE\"",
            "key.secret_env",
        ),
    ];
    #[cfg(feature = "redis")]
    let cases = &[
        cases,
        &[
            (
                "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:1\"",
                "failure_mode",
            ),
            ("[store]\nkind = \"redis\"", "store.url"),
        ][..],
    ]
    .concat();
    #[cfg(not(feature = "redis"))]
    let cases = &[
        cases,
        &[(
            "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:1\"",
            "store.kind",
        )][..],
    ]
    .concat();
    let top_level: &[(&str, &str)] = &[
        (
            "deny_cidrs = [\"10.0.0.0/8\", \"10.0.0.0/99\"]",
            "deny_cidrs[1]",
        ),
        ("allow_cidrs = [\"banana\"]", "allow_cidrs[0]"),
    ];
    for (extra, field) in top_level {
        let text = format!("{extra}\n{BASE}");
        let plan = Plan::from_toml(&text).expect(&text);
        let err = Limiter::from_config(&plan).expect_err(&text);
        assert_eq!(err.field(), *field, "{text}\n→ {err}");
    }
    for (extra, field) in cases {
        let text = format!("{BASE}\n{extra}");
        let plan = Plan::from_toml(&text).expect(&text);
        let err = Limiter::from_config(&plan).expect_err(&text);
        assert_eq!(err.field(), *field, "{text}\n→ {err}");
    }
}

#[cfg(feature = "redis")]
fn rules(text: &str) -> Vec<&'static str> {
    let plan = Plan::from_toml(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    audit(&plan).findings.iter().map(|f| f.rule).collect()
}

#[cfg(feature = "redis")] // the plan names a Redis store
#[test]
fn the_example_plan_passes() {
    let plan = Plan::from_file("examples/plan.toml").unwrap();
    let report = audit(&plan);
    assert!(report.pass, "{}", report.to_text());
    assert_eq!(report.score, 100);
    assert!(report.findings.is_empty());
    // Deterministic: the same plan, the same report.
    assert_eq!(report, audit(&plan));
}

#[cfg(feature = "redis")] // the plan names a Redis store
#[test]
fn each_rule_has_a_plan_that_trips_exactly_it() {
    let good = std::fs::read_to_string("examples/plan.toml").unwrap();
    let with = |edits: &[(&str, &str)]| {
        let mut text = good.clone();
        for (from, to) in edits {
            assert!(text.contains(from), "{from}");
            text = text.replacen(from, to, 1);
        }
        text
    };
    let cases: Vec<(&str, String)> = vec![
        (
            "TG001",
            with(&[(
                "name = \"burst\"\nlimit = 20\nwindow = \"1s\"",
                "name = \"burst\"\nlimit = 20\nwindow = \"1s\"\nalgorithm = \"fixed_window\"",
            )]),
        ),
        (
            "TG002",
            // The memory store cannot fail: its plan has no failure mode to set.
            with(&[
                (
                    "kind = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\nprefix = \"tollgate\"",
                    "kind = \"memory\"",
                ),
                ("failure_mode = \"local_fallback\"\n", ""),
            ]),
        ),
        ("TG003", with(&[("failure_mode = \"local_fallback\"\n", "")])),
        ("TG005", with(&[("retry_after = true", "retry_after = false")])),
        (
            "TG006",
            with(&[
                ("kind = \"auth\"\npolicies = [\"login\"]", "kind = \"auth\"\nexempt = true"),
                // The route's policy would limit nothing: the plan would not build.
                (
                    "[[policies]]\nname = \"login\"\nlimit = 5\nwindow = \"1m\"\nsensitive = true\npenalty = \"15m\"\n",
                    "",
                ),
            ]),
        ),
        (
            "TG007",
            with(&[("routes = [\"POST /login\"]", "routes = [\"POST /signin\"]")]),
        ),
        (
            "TG008",
            with(&[(
                "pattern = \"/api/{*rest}\"\nkind = \"read\"",
                "pattern = \"/api/{*rest}\"\nkind = \"read\"\nauthenticated = true",
            )]),
        ),
        (
            "TG009",
            with(&[(
                "policies = [\"burst\", \"daily\"]",
                "policies = [\"burst\", \"daily\", \"login\"]",
            )]),
        ),
        (
            "TG011",
            with(&[(
                "trusted_proxies = [\"10.0.0.0/8\"]",
                "trusted_proxies = [\"10.0.0.0/8\", \"0.0.0.0/0\"]",
            )]),
        ),
        (
            "TG012",
            with(&[("unauthenticated = true", "routes = [\"POST /login\"]")]),
        ),
        // 60 a minute per IP is stricter than "daily" (about 69 a minute), not the others.
        ("TG013", with(&[("limit = 1200", "limit = 60")])),
        (
            "TG014",
            with(&[(
                "kind = \"client_ip\"\ntrusted_proxies = [\"10.0.0.0/8\"]",
                "kind = \"peer_ip\"",
            )]),
        ),
        (
            "TG015",
            with(&[(
                "kind = \"auth\"\npolicies = [\"login\"]",
                "kind = \"auth\"\npolicies = [\"login\"]\ncount = \"successes\"",
            )]),
        ),
        #[cfg(feature = "regions")]
        (
            "TG016",
            with(&[(
                "prefix = \"tollgate\"",
                "prefix = \"tollgate\"\nregion = \"eu\"\nhome = \"redis://127.0.0.1:6390\"",
            )]),
        ),
    ];
    for (rule, text) in cases {
        assert_eq!(rules(&text), vec![rule], "{rule}:\n{text}");
        let report = audit(&Plan::from_toml(&text).unwrap());
        let f = &report.findings[0];
        assert_eq!(report.pass, f.severity != Severity::Error);
        assert!(report.score < 100);
        assert_eq!(report.recommendations.len(), 1);
        assert!(report.recommendations[0].starts_with(rule));
    }
    // Every rule the audit lists has a case above, except TG000 (tested below).
    let listed: Vec<&str> = tollgate::audit::rules().iter().map(|r| r.id).collect();
    assert_eq!(
        listed,
        [
            "TG000", "TG001", "TG002", "TG003", "TG005", "TG006", "TG007", "TG008", "TG009",
            "TG011", "TG012", "TG013", "TG014", "TG015", "TG016"
        ]
    );
}

/// Each plan here scored PASS 100 while `from_config` refused it (or would build it wrong):
/// now the audit builds the plan and fails it, naming the field and the value, and the
/// builders refuse it with the same error.
#[test]
fn the_audit_fails_every_plan_that_does_not_build() {
    let cases: Vec<(String, &str, &str)> = vec![
        (format!("{BASE}[[routes]]\npattern = \"/a\"\npolicies = [\"nope\"]"), "routes[0].policies[0]", "\"nope\""),
        (
            "[[policies]]\nname = \"api\"\nlimit = 1\nwindow = \"1s\"\n[default]\npolicies = [\"apo\"]".to_owned(),
            "default.policies[0]",
            "\"apo\"",
        ),
        (
            format!("{BASE}[key]\nkind = \"client_ip\"\ntrusted_proxies = [\"10.0.0.0/33\"]"),
            "key.trusted_proxies[0]",
            "\"10.0.0.0/33\"",
        ),
        (format!("allow_cidrs = [\"nope\"]\n{BASE}"), "allow_cidrs[0]", "\"nope\""),
        (format!("{BASE}[[routes]]\npattern = \"/x/{{\"\npolicies = [\"api\"]"), "routes[0].pattern", "\"/x/{\""),
        (format!("{BASE}[[routes]]\npattern = \"/x/{{*a}}/b\"\npolicies = [\"api\"]"), "routes[0].pattern", "\"/x/{*a}/b\""),
        (
            format!("{BASE}[[routes]]\npattern = \"GET /a\"\npolicies = [\"api\"]\n[[routes]]\npattern = \"GET /a\"\npolicies = [\"api\"]"),
            "routes[1].pattern",
            "\"GET /a\"",
        ),
        (
            format!("{BASE}[[policies]]\nname = \"spare\"\nlimit = 1\nwindow = \"1s\""),
            "policies[1]",
            "\"spare\"",
        ),
        (
            format!("{BASE}[[routes]]\npattern = \"/health\"\nexempt = true\npolicies = [\"api\"]"),
            "routes[0].policies",
            "[\"api\"]",
        ),
        (format!("{BASE}[store]\nkind = \"memory\"\nurl = \"redis://x\""), "store.url", "\"redis://x\""),
    ];
    #[cfg(feature = "redis")]
    let cases = {
        let mut cases = cases;
        let redis = "failure_mode = \"fail_closed\"\n[store]\nkind = \"redis\"";
        cases.push((
            format!("{redis}\nurl = \"http://x\"\n{BASE}"),
            "store.url",
            "\"http://x\"",
        ));
        cases.push((
            format!("{redis}\nurl = \"redis://127.0.0.1:6379\"\nprefix = \"a{{b\"\n{BASE}"),
            "store.prefix",
            "\"a{b\"",
        ));
        cases
    };
    for (text, field, value) in &cases {
        let plan = Plan::from_toml(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let err = Limiter::from_config(&plan).expect_err(text);
        assert_eq!(
            (err.field(), err.value()),
            (*field, *value),
            "{text}\n→ {err}"
        );
        let report = audit(&plan);
        assert!(!report.pass, "{text}\n{}", report.to_text());
        let f = report
            .findings
            .iter()
            .find(|f| f.field.as_deref() == Some(*field))
            .unwrap_or_else(|| panic!("{text}\n{}", report.to_text()));
        assert_eq!(
            (f.rule, f.name, f.severity),
            ("TG000", "plan-does-not-build", Severity::Error)
        );
        assert_eq!(f.value.as_deref(), Some(*value));
    }
}

/// The audit and the builders agree on every plan: the audit passes only plans that build.
#[cfg(feature = "redis")] // the plan names a Redis store
#[test]
fn the_audit_passes_only_plans_that_build() {
    let example = std::fs::read_to_string("examples/plan.toml").unwrap();
    for text in [example.as_str(), BASE] {
        let plan = Plan::from_toml(text).unwrap();
        assert!(plan.build_errors().is_empty());
        assert!(plan.build().is_ok());
        assert!(audit(&plan).pass);
    }
}

/// axum 0.8 refuses `:id` and `*rest`; so must the limiter's route table, and so the audit.
#[test]
fn axum_07_patterns_fail_the_audit() {
    for pattern in ["/api/:id", "/api/*rest"] {
        let text = format!("{BASE}[[routes]]\npattern = \"{pattern}\"\npolicies = [\"api\"]");
        let plan = Plan::from_toml(&text).unwrap();
        assert_eq!(plan.build().unwrap_err().field(), "routes[0].pattern");
        let report = audit(&plan);
        assert!(!report.pass, "{pattern}");
        assert_eq!(
            report.findings[0].field.as_deref(),
            Some("routes[0].pattern")
        );
    }
}

#[test]
fn trust_everything_proxies_are_errors_wherever_they_are() {
    let login = "[login]\nroutes = [\"POST /login\"]\nusername_header = \"x-user\"\nip_username = \"api\"\nip = \"api\"\nusername = \"api\"";
    let cases: &[(String, &str)] = &[
        (format!("[key]\nkind = \"client_ip\"\ntrusted_proxies = [\"0.0.0.0/0\"]\n{BASE}"), "key.trusted_proxies[0]"),
        (format!("[key]\nkind = \"client_ip\"\ntrusted_proxies = [\"10.0.0.0/8\", \"::/0\"]\n{BASE}"), "key.trusted_proxies[1]"),
        (format!("[key]\nkind = \"ip_user_agent\"\ntrusted_proxies = [\"2000::/3\"]\n{BASE}"), "key.trusted_proxies[0]"),
        (
            format!("[key]\nkind = \"api_key\"\n[key.fallback]\nkind = \"client_ip\"\ntrusted_proxies = [\"64.0.0.0/2\"]\n{BASE}"),
            "key.fallback.trusted_proxies[0]",
        ),
        (
            format!("{BASE}{login}\n[login.ip_key]\nkind = \"client_ip\"\ntrusted_proxies = [\"::ffff:0:0/96\"]"),
            "login.ip_key.trusted_proxies[0]",
        ),
        // NAT64's well-known prefix holds every IPv4 address: trusting it trusts every IPv4
        // client (addresses are compared in canonical form).
        (format!("[key]\nkind = \"client_ip\"\ntrusted_proxies = [\"64:ff9b::/96\"]\n{BASE}"), "key.trusted_proxies[0]"),
        (format!("[key]\nkind = \"client_ip\"\ntrusted_proxies = [\"10.0.0.0/8\", \"64:ff9b::/100\"]\n{BASE}"), "key.trusted_proxies[1]"),
        // Wider ranges holding NAT64's prefix or the IPv4-mapped range hold every IPv4 client.
        (format!("[key]\nkind = \"client_ip\"\ntrusted_proxies = [\"64:ff9b::/64\"]\n{BASE}"), "key.trusted_proxies[0]"),
        (format!("[key]\nkind = \"client_ip\"\ntrusted_proxies = [\"::ffff:0:0/95\"]\n{BASE}"), "key.trusted_proxies[0]"),
    ];
    for (text, field) in cases {
        let report = audit(&Plan::from_toml(text).unwrap());
        let f = report
            .findings
            .iter()
            .find(|f| f.rule == "TG011")
            .unwrap_or_else(|| panic!("{text}\n{}", report.to_text()));
        assert_eq!(f.field.as_deref(), Some(*field), "{text}");
        assert_eq!(f.severity, Severity::Error);
        assert!(!report.pass);
    }
    // Private, loopback and link-local ranges, and CDN-sized public ranges, are fine.
    let fine = format!(
        "[key]\nkind = \"client_ip\"\ntrusted_proxies = [\"10.0.0.0/8\", \"172.16.0.0/12\", \"192.168.0.0/16\", \"127.0.0.1\", \"169.254.0.0/16\", \"104.16.0.0/13\", \"198.51.100.8/29\", \"fc00::/7\", \"fe80::/10\", \"2400:cb00::/32\", \"64:ff9b::a00:0/104\"]\n{BASE}"
    );
    let report = audit(&Plan::from_toml(&fine).unwrap());
    assert!(
        report.pass && report.findings.is_empty(),
        "{}",
        report.to_text()
    );
}

#[test]
fn login_sections_that_do_not_build_name_the_field() {
    let policies = "[[policies]]\nname = \"u\"\nlimit = 5\nwindow = \"15m\"\n[[policies]]\nname = \"i\"\nlimit = 50\nwindow = \"15m\"\n";
    let login = "[login]\nroutes = [\"POST /login\"]\nusername_field = \"username\"\nip_username = \"u\"\nip = \"i\"\nusername = \"u\"\n";
    let plan_with =
        |edit: &dyn Fn(String) -> String| format!("{BASE}{}", edit(format!("{policies}{login}")));
    let cases: Vec<(String, &str)> = vec![
        (
            plan_with(&|t| t.replace("routes = [\"POST /login\"]\n", "")),
            "login.routes",
        ),
        (
            plan_with(&|t| t.replace("\"POST /login\"", "\"POST /login\", \"/x/{\"")),
            "login.routes[1]",
        ),
        (
            plan_with(&|t| t.replace("username_field = \"username\"\n", "")),
            "login.username_header",
        ),
        (
            plan_with(&|t| t + "username_header = \"x-user\"\n"),
            "login.username_header",
        ),
        (
            plan_with(&|t| {
                t.replace(
                    "username_field = \"username\"",
                    "username_header = \"bad header\"",
                )
            }),
            "login.username_header",
        ),
        (
            plan_with(&|t| {
                t.replace(
                    "username_field = \"username\"",
                    "username_header = \"x-user\"\nmax_body_bytes = 10",
                )
            }),
            "login.max_body_bytes",
        ),
        (
            plan_with(&|t| t.replace("ip = \"i\"", "ip = \"nope\"")),
            "login.ip",
        ),
        (plan_with(&|t| t.replace("ip = \"i\"\n", "")), "login.ip"),
        (
            plan_with(&|t| {
                t.replacen(
                    "window = \"15m\"\n",
                    "window = \"15m\"\nalgorithm = \"sliding_window_log\"\n",
                    1,
                )
            }),
            "login.ip",
        ),
        (
            plan_with(&|t| {
                t.replacen(
                    "window = \"15m\"\n",
                    "window = \"15m\"\npenalty = \"1m\"\n",
                    1,
                )
            }),
            "policies[1].penalty",
        ),
        (plan_with(&|t| t + "name = \"a b\"\n"), "login.name"),
        (
            plan_with(&|t| t + "username_secret_env = \"TOLLGATE_TEST_UNSET_VARIABLE\"\n"),
            "login.username_secret_env",
        ),
        (
            format!("[key]\nkind = \"api_key\"\n{}", plan_with(&|t| t)),
            "login.ip_key",
        ),
        (
            plan_with(&|t| t + "[login.ip_key]\nkind = \"global\"\n"),
            "login.ip_key.kind",
        ),
    ];
    for (text, field) in &cases {
        let plan = Plan::from_toml(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let err = plan.build().expect_err(text);
        assert_eq!(err.field(), *field, "{text}\n→ {err}");
        // The limiter alone refuses the plan too, and the audit fails it.
        assert!(Limiter::from_config(&plan).is_err());
        let report = audit(&plan);
        assert!(
            report
                .findings
                .iter()
                .any(|f| f.rule == "TG000" && f.field.as_deref() == Some(*field)),
            "{text}\n{}",
            report.to_text()
        );
    }
}

#[cfg(feature = "redis")] // the plan names a Redis store
#[test]
fn the_login_rule_needs_a_section_that_builds_and_covers_the_route() {
    let text = std::fs::read_to_string("examples/plan.toml").unwrap();
    assert!(!rules(&text).contains(&"TG007"));
    // No [login]: its three policies limit nothing, and the auth route is unguarded.
    let without = &text[..text.find("\n[login]").unwrap()];
    let found = rules(without);
    assert!(
        found.contains(&"TG000") && found.contains(&"TG007"),
        "{found:?}"
    );
    // A [login] that does not build satisfies nothing.
    let broken = text.replace("username_field = \"username\"\n", "");
    assert_eq!(rules(&broken), ["TG000", "TG007"]);
    // The guard's own failure mode, which the plan's Redis store reads, is no reason to
    // think the guard does not build.
    let with_mode = text.replace("\n[login]\n", "\n[login]\nfailure_mode = \"fail_closed\"\n");
    assert_ne!(with_mode, text);
    assert!(Plan::from_toml(&with_mode)
        .unwrap()
        .build_errors()
        .is_empty());
    assert!(
        !rules(&with_mode).contains(&"TG007"),
        "{:?}",
        rules(&with_mode)
    );
}
#[tokio::test]
async fn a_plan_round_trips_into_a_working_layer() {
    let plan = Plan::from_toml(
        r#"
header_style = "all"
quota_headers = true

[[policies]]
name = "login"
limit = 2
window = "1m"
sensitive = true

[[policies]]
name = "reads"
limit = 3
window = "1m"

[[routes]]
pattern = "POST /login"
kind = "auth"
policies = ["login"]

[[routes]]
pattern = "/health"
exempt = true

[default]
policies = ["reads"]
"#,
    )
    .unwrap();
    // Serialising and parsing again gives the same plan.
    let again = Plan::from_toml(&toml::to_string(&plan).unwrap()).unwrap();
    assert_eq!(again, plan);

    let app = Router::new()
        .route("/login", post(|| async { "login" }))
        .route("/health", get(|| async { "ok" }))
        .route("/", get(|| async { "home" }))
        .layer(RateLimitLayer::from_config(&plan).unwrap());
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let mut statuses = vec![];
    for _ in 0..3 {
        statuses.push(
            client
                .post(format!("http://{addr}/login"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16(),
        );
    }
    assert_eq!(statuses, [200, 200, 429]);
    for _ in 0..5 {
        let res = client
            .get(format!("http://{addr}/health"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
    }
    let res = client.get(format!("http://{addr}/")).send().await.unwrap();
    assert_eq!(res.headers()["ratelimit-policy"], "\"reads\";q=3;w=60");
}

#[tokio::test]
async fn a_key_chain_from_toml() {
    let plan = Plan::from_toml(
        r#"
[key]
kind = "api_key"
[key.fallback]
kind = "client_ip"
trusted_proxies = ["127.0.0.1/32"]

[[policies]]
name = "api"
limit = 2
window = "1m"
[default]
policies = ["api"]
"#,
    )
    .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::from_config(&plan).unwrap());
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let send = |key: Option<&'static str>, xff: &'static str| {
        let mut req = client
            .get(format!("http://{addr}/"))
            .header("x-forwarded-for", xff);
        if let Some(k) = key {
            req = req.header("x-api-key", k);
        }
        async move { req.send().await.unwrap().status().as_u16() }
    };
    // Each API key has its own budget; without one, the forwarded client address is the key.
    assert_eq!(
        [
            send(Some("k1"), "1.1.1.1").await,
            send(Some("k1"), "2.2.2.2").await
        ],
        [200, 200]
    );
    assert_eq!(send(Some("k1"), "3.3.3.3").await, 429);
    assert_eq!(send(Some("k2"), "1.1.1.1").await, 200);
    assert_eq!(
        [send(None, "1.1.1.1").await, send(None, "1.1.1.1").await],
        [200, 200]
    );
    assert_eq!(send(None, "1.1.1.1").await, 429);
    assert_eq!(send(None, "2.2.2.2").await, 200);
}

/// Serves an app built from `plan` with both layers: the limiter outside, the login guard
/// inside. `POST /login` accepts the password `right` (header `x-password` or JSON field
/// `password`) and counts how often the handler ran.
async fn serve_plan(
    plan: &Plan,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let built = plan.build().unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let login = post(move |headers: http::HeaderMap, body: String| {
        counter.fetch_add(1, Ordering::SeqCst);
        async move {
            let json: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let right = headers.get("x-password").is_some_and(|p| p == "right")
                || json["password"] == "right";
            if right {
                http::StatusCode::OK
            } else {
                http::StatusCode::UNAUTHORIZED
            }
        }
    });
    let app = Router::new()
        .route("/login", login)
        .route("/", get(|| async { "home" }))
        .layer(built.login_layer().expect("the plan has [login]"))
        .layer(built.layer());
    (support::serve(app).await, runs)
}

#[tokio::test]
async fn a_plan_builds_a_login_guard_on_its_routes() {
    use std::sync::atomic::Ordering;
    let plan = Plan::from_toml(
        r#"
quota_headers = true
[[policies]]
name = "login-route"
limit = 100
window = "1m"
[[policies]]
name = "ip-user"
limit = 2
window = "15m"
algorithm = "sliding_window_log"
[[policies]]
name = "ip"
limit = 3
window = "15m"
algorithm = "sliding_window_log"
[[policies]]
name = "user"
limit = 20
window = "1h"
algorithm = "sliding_window_log"
[[policies]]
name = "reads"
limit = 100
window = "1m"

[[routes]]
pattern = "POST /login"
kind = "auth"
policies = ["login-route"]

[default]
policies = ["reads"]

[login]
routes = ["POST /login"]
username_header = "x-user"
ip_username = "ip-user"
ip = "ip"
username = "user"
"#,
    )
    .unwrap();
    assert!(audit(&plan).pass, "{}", audit(&plan).to_text());
    let (addr, runs) = serve_plan(&plan).await;
    let client = reqwest::Client::new();
    let attempt = |user: &'static str, password: &'static str| {
        let req = client
            .post(format!("http://{addr}/login"))
            .header("x-user", user)
            .header("x-password", password);
        async move { req.send().await.unwrap().status().as_u16() }
    };
    // Two wrong passwords for alice, then the (IP, username) limit refuses her, before the
    // handler runs; a right password never counts.
    assert_eq!(attempt("alice", "right").await, 200);
    assert_eq!(attempt("alice", "wrong").await, 401);
    assert_eq!(attempt("Alice ", "wrong").await, 401);
    assert_eq!(attempt("alice", "right").await, 429);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    // The IP limit (3 failures, whatever the user) stops the spray on its third username.
    assert_eq!(attempt("bob", "wrong").await, 401);
    assert_eq!(attempt("carol", "right").await, 429);
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    // Other routes are not login routes: the guard lets them through, the limiter limits them.
    let res = client.get(format!("http://{addr}/")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["x-ratelimit-limit"], "100");
}

/// `examples/plan.toml` as written (on its own key prefix): both layers on one real Redis.
#[cfg(feature = "redis")]
#[tokio::test]
async fn the_example_plan_guards_logins_through_redis() {
    let prefix = format!(
        "tg-plan-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    // The plan's Redis, started for this test: nothing touches a Redis the test did not start.
    let server = support::RedisServer::start();
    let text = std::fs::read_to_string("examples/plan.toml")
        .unwrap()
        .replace("prefix = \"tollgate\"", &format!("prefix = \"{prefix}\""))
        .replace("redis://127.0.0.1:6379", &server.url());
    assert!(
        text.contains(&server.url()),
        "the example plan names no Redis URL"
    );
    let plan = Plan::from_toml(&text).unwrap();
    assert!(audit(&plan).pass);
    let (addr, _) = serve_plan(&plan).await;
    let client = reqwest::Client::new();
    let mut statuses = vec![];
    for password in ["wrong", "wrong", "right"] {
        let res = client
            .post(format!("http://{addr}/login"))
            .json(&serde_json::json!({ "username": "alice", "password": password }))
            .send()
            .await
            .unwrap();
        statuses.push(res.status().as_u16());
    }
    assert_eq!(statuses, [401, 401, 200]);
    // The guard counted the failures in the plan's store: its keys sit beside the limiter's.
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(keys.iter().any(|k| k.contains(":login.ip:")), "{keys:?}");
    assert!(keys.iter().any(|k| k.contains(":login:")), "{keys:?}");
    let _: () = redis::cmd("DEL")
        .arg(&keys)
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// The guide's TOML plan is a plan that builds and passes the audit.
#[cfg(feature = "redis")] // the plan names a Redis store
#[test]
fn the_readme_plan_passes() {
    let readme = std::fs::read_to_string("docs/policies.md").unwrap();
    let section = &readme[readme.find("### The same plan as TOML").unwrap()..];
    let start = section.find("```toml\n").unwrap() + "```toml\n".len();
    let text = &section[start..start + section[start..].find("```").unwrap()];
    let plan = Plan::from_toml(text).unwrap();
    let report = audit(&plan);
    assert!(report.pass && report.score == 100, "{}", report.to_text());
}

/// What a plan declares is what it enforces: paths its routes leave out, tiers nothing picks
/// and routes without policies are build errors (and audit errors), not silent gaps.
#[test]
fn plans_that_would_leave_requests_unlimited_do_not_build() {
    let route_only = r#"
[[policies]]
name = "api"
limit = 100
window = "1m"
[[routes]]
pattern = "/api/{*rest}"
policies = ["api"]
"#;
    let plan = Plan::from_toml(route_only).unwrap();
    let err = plan.build().unwrap_err();
    assert_eq!(err.field(), "default.policies");
    assert!(err.reason().contains("[default] exempt = true"), "{err}");
    assert!(!audit(&plan).pass);
    let plan = Plan::from_toml(&format!("{route_only}[default]\nexempt = true\n")).unwrap();
    assert!(plan.build().is_ok());
    assert!(audit(&plan).pass);

    let tiers_without_header = format!(
        "{BASE}[[policies]]\nname = \"pro\"\nlimit = 1000\nwindow = \"1m\"\n\
         [[routes]]\npattern = \"/x\"\npolicies = [\"api\"]\ntiers = {{ pro = [\"pro\"] }}\n"
    );
    let plan = Plan::from_toml(&tiers_without_header).unwrap();
    assert_eq!(plan.build().unwrap_err().field(), "routes[0].tiers");
    let plan = Plan::from_toml(&format!(
        "{tiers_without_header}[tier]\nheader = \"x-plan\"\n"
    ))
    .unwrap();
    assert!(plan.build().is_ok());

    let route_without_policies = format!("{BASE}[[routes]]\npattern = \"/x\"\n");
    let plan = Plan::from_toml(&route_without_policies).unwrap();
    assert_eq!(plan.build().unwrap_err().field(), "routes[0].policies");
}

/// A setting nothing would read is refused when built, naming the field, instead of being
/// accepted and ignored: in a plan and in code.
#[tokio::test]
async fn settings_nothing_would_read_are_refused_naming_the_field() {
    let api = "[[policies]]\nname = \"api\"\nlimit = 5\nwindow = \"1m\"\n";
    let refused = |text: String| {
        let plan = Plan::from_toml(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        Limiter::from_config(&plan).expect_err(&text)
    };
    // A failure mode on the memory store, which cannot fail.
    let e = refused(format!(
        "failure_mode = \"fail_open\"\n{api}[default]\npolicies = [\"api\"]\n"
    ));
    assert_eq!(e.field(), "failure_mode", "{e}");
    // A tier header where nothing has tiers to pick.
    let e = refused(format!(
        "{api}[tier]\nheader = \"x-plan\"\n[default]\npolicies = [\"api\"]\n"
    ));
    assert_eq!(e.field(), "tier.header", "{e}");
    // A lease with a part finer than a millisecond, which the ledger would drop.
    let e = refused(format!(
        "failure_mode = \"fail_open\"\n[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:1\"\n\
         lease_time = \"250ms 500us\"\n{api}[default]\npolicies = [\"api\"]\n"
    ));
    assert!(e.field().ends_with("lease_time"), "{e}");
    // A forwarding header on a client-address key that trusts no proxy: never read, and
    // behind a proxy every client would share its address.
    for kind in ["client_ip", "ip_user_agent"] {
        let e = refused(format!(
            "[key]\nkind = \"{kind}\"\nheader = \"x-real-ip\"\n{api}[default]\npolicies = [\"api\"]\n"
        ));
        assert_eq!(e.field(), "key.header", "{e}");
    }
    // A fallback after a global key, which is always there.
    let e = refused(format!(
        "[key]\nkind = \"global\"\n[key.fallback]\nkind = \"peer_ip\"\n{api}[default]\npolicies = [\"api\"]\n"
    ));
    assert_eq!(e.field(), "key.fallback", "{e}");
    // A login body cap of 0, under which every login would be refused.
    let login = "[[policies]]\nname = \"l\"\nlimit = 5\nwindow = \"15m\"\nalgorithm = \"sliding_window_log\"\n";
    let plan = Plan::from_toml(&format!(
        "{api}{login}[default]\npolicies = [\"api\"]\n[login]\nroutes = [\"POST /login\"]\n\
         username_field = \"username\"\nmax_body_bytes = 0\nip_username = \"l\"\nip = \"l\"\n\
         username = \"l\"\n"
    ))
    .unwrap();
    let e = plan.build().unwrap_err();
    assert_eq!(e.field(), "login.max_body_bytes", "{e}");
    // One so large that any client could make every login buffer gigabytes.
    let plan = Plan::from_toml(&format!(
        "{api}{login}[default]\npolicies = [\"api\"]\n[login]\nroutes = [\"POST /login\"]\n\
         username_field = \"username\"\nmax_body_bytes = 10000000000\nip_username = \"l\"\nip = \"l\"\n\
         username = \"l\"\n"
    ))
    .unwrap();
    let e = plan.build().unwrap_err();
    assert_eq!(e.field(), "login.max_body_bytes", "{e}");
    assert!(e.to_string().contains("10000000000"), "{e}");

    use std::time::Duration;
    use tollgate::store::{FailureMode, MemoryStore, RedisStore, ResilientStore};
    // A Redis timeout of zero, under which every call would time out.
    let e = RedisStore::builder()
        .timeout(Duration::ZERO)
        .build_with_url("redis://127.0.0.1:1")
        .unwrap_err();
    assert_eq!(e.field(), "timeout", "{e}");
    // A timeout for a pool passed in, which keeps its own.
    let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:1")
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let e = RedisStore::builder()
        .timeout(Duration::from_millis(200))
        .build_with_pool(pool)
        .unwrap_err();
    assert_eq!(e.field(), "timeout", "{e}");
    // A Sentinel resolve interval on a store that is not built through Sentinel.
    let e = RedisStore::builder()
        .resolve_interval(Duration::from_millis(500))
        .build_with_url("redis://127.0.0.1:1")
        .unwrap_err();
    assert_eq!(e.field(), "resolve_interval", "{e}");
    // Deny-cache settings without a deny cache.
    let e = ResilientStore::builder(MemoryStore::new(), FailureMode::FailOpen)
        .deny_cache_max_age(Duration::from_secs(5))
        .build()
        .unwrap_err();
    assert_eq!(e.field(), "deny_cache_max_age", "{e}");
    assert!(
        ResilientStore::builder(MemoryStore::new(), FailureMode::FailOpen)
            .deny_cache(100)
            .deny_cache_max_age(Duration::from_secs(5))
            .build()
            .is_ok()
    );
}

// A JSON plan's error names the value, as a TOML plan's does; a plan in the other format
// than its file name says is named as such, not as a parse error at its first line.
#[test]
fn plan_file_errors_name_the_value_and_a_misnamed_format() {
    let dir = std::env::temp_dir().join(format!("tollgate-plan-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let json = r#"{"policies": [{"name": "api", "limit": "ten", "window": "1m"}]}"#;
    let err = Plan::from_file(write("bad.json", json)).unwrap_err();
    assert_eq!(err.field(), "policies[0].limit");
    assert_eq!(err.value(), "\"ten\"", "{err}");

    let toml = "[[policies]]\nname = \"api\"\nlimit = 5\nwindow = \"1m\"\n\n[default]\npolicies = [\"api\"]\n";
    let err = Plan::from_file(write("toml.json", toml)).unwrap_err();
    assert_eq!(err.field(), "(file)");
    assert!(err.reason().contains("TOML"), "{err}");
    let json = r#"{"policies": [{"name": "api", "limit": 5, "window": "1m"}], "default": {"policies": ["api"]}}"#;
    let err = Plan::from_file(write("json.toml", json)).unwrap_err();
    assert!(err.reason().contains("JSON"), "{err}");
    // An empty file named .json is an empty file, not a TOML plan.
    let err = Plan::from_file(write("empty.json", "  \n")).unwrap_err();
    assert!(!err.reason().contains("TOML"), "{err}");
    // An unknown field is named by its key: its value may be a secret under a misspelt name.
    let misspelt = r#"{"store": {"kind": "redis", "uri": "redis://:hunter2@db:6379"}}"#;
    let err = Plan::from_file(write("misspelt.json", misspelt)).unwrap_err();
    assert!(!err.to_string().contains("hunter2"), "{err}");
    assert_eq!(err.value(), "uri", "{err}");
    let wrong_type = r#"{"store": {"kind": "redis", "url": ["redis://:hunter2@db:6379"]}}"#;
    let err = Plan::from_file(write("wrong.json", wrong_type)).unwrap_err();
    assert!(!err.to_string().contains("hunter2"), "{err}");
    // Named right, both read.
    assert!(Plan::from_file(write("plan.toml", toml)).is_ok());
    assert!(Plan::from_file(write("plan.json", json)).is_ok());
    let _ = std::fs::remove_dir_all(&dir);
}

// Plans hold Redis URLs with passwords, and their errors reach logs and consoles: no error
// repeats the password, whatever the mistake.
#[test]
fn config_errors_never_repeat_a_urls_password() {
    let plan = |store: &str| {
        format!(
            "[store]\n{store}\n[[policies]]\nname = \"api\"\nlimit = 5\nwindow = \"1m\"\n[default]\npolicies = [\"api\"]\n"
        )
    };
    let cases = [
        // A string where a list belongs.
        "kind = \"redis_cluster\"\nurls = \"redis://:hunter2@10.0.0.1:6379\"",
        // A setting of another kind of store.
        "kind = \"redis_cluster\"\nurls = [\"redis://10.0.0.1:6379\"]\nurl = \"redis://:hunter2@10.0.0.1:6379\"",
        // A URL that does not parse (an unencoded `#` in the password).
        "kind = \"redis\"\nurl = \"redis://:hun#ter2@10.0.0.1:6379\"",
    ];
    for store in cases {
        let text = plan(store);
        let err = match Plan::from_toml(&text) {
            Err(e) => e,
            Ok(plan) => tollgate::Limiter::from_config(&plan).expect_err(&text),
        };
        let shown = err.to_string();
        assert!(
            !shown.contains("hunter2") && !shown.contains("hun#ter2"),
            "{shown}"
        );
    }
    let json = r#"{"store": {"kind": "redis_cluster", "urls": "redis://:hunter2@10.0.0.1:6379"}}"#;
    let err = Plan::from_json(json).unwrap_err();
    assert!(!err.to_string().contains("hunter2"), "{err}");
}

/// A limiter built from a plan brings the plan's response settings to the layers made from
/// it with `RateLimitLayer::new`, as `PlanWatcher`'s docs show serving it: `quota_headers`,
/// `retry_after` and `header_style` once went unread on that path (and a reload refused to
/// change them as settings "read at start").
#[tokio::test]
async fn a_layer_made_from_a_plans_limiter_keeps_the_plans_response_settings() {
    let plan = Plan::from_toml(
        "quota_headers = \"never\"\nretry_after = false\nheader_style = \"structured\"\n\
         [key]\nkind = \"global\"\n\
         [[policies]]\nname = \"api\"\nlimit = 1\nwindow = \"1m\"\n\
         [default]\npolicies = [\"api\"]\n",
    )
    .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(Limiter::from_config(&plan).unwrap()));
    let addr = support::serve(app).await;
    let client = reqwest::Client::new();
    let first = client.get(format!("http://{addr}/")).send().await.unwrap();
    assert_eq!(first.status(), 200);
    assert!(first.headers().get("ratelimit-remaining").is_none());
    assert!(first.headers().get("ratelimit").is_none());
    let second = client.get(format!("http://{addr}/")).send().await.unwrap();
    assert_eq!(second.status(), 429);
    assert!(
        second.headers().get("retry-after").is_none(),
        "{:?}",
        second.headers()
    );
    assert!(
        second.headers().get("ratelimit-policy").is_some(),
        "structured"
    );
    assert!(
        second.headers().get("x-ratelimit-limit").is_none(),
        "not classic"
    );
}
