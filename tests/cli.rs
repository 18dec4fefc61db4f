//! The `tollgate` binary: audits, help, version and exit codes.

use std::path::PathBuf;
use std::process::{Command, Output};

/// A small plan that builds and passes the audit.
fn base() -> String {
    std::fs::read_to_string("examples/from_config.toml").unwrap()
}

fn tollgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .output()
        .expect("the binary runs")
}

/// A plan file in a directory of this test's own.
fn plan_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tollgate-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_cli_audits_in_text_and_json() {
    let out = tollgate(&["audit", "examples/plan.toml"]);
    assert!(out.status.success(), "{}", stdout(&out));
    assert!(stdout(&out).starts_with("PASS (score 100)"));

    let bad = plan_file("bad.toml", &base().replace("replicas = 1", "replicas = 2"));
    let out = tollgate(&["audit", bad.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["pass"], false);
    assert_eq!(report["findings"][0]["rule"], "TG002");
    assert_eq!(report["findings"][0]["severity"], "error");

    let broken = plan_file("broken.toml", "[[policies]]\nname = 1");
    let out = tollgate(&["audit", broken.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("policies[0].name"));

    let out = tollgate(&["audit", "no/such/plan.toml"]);
    assert_eq!(out.status.code(), Some(2));
}

/// Plans the audit used to pass with score 100 although `from_config` refused them.
#[test]
fn plans_that_do_not_build_fail_with_the_field_and_value() {
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            "[default]",
            "[[routes]]\npattern = \"/a\"\npolicies = [\"nope\"]\n[default]",
            "routes[3].policies[0]",
            "\"nope\"",
        ),
        (
            "[default]",
            "[[routes]]\npattern = \"/x/{\"\npolicies = [\"site\"]\n[default]",
            "routes[3].pattern",
            "\"/x/{\"",
        ),
        (
            "kind = \"peer_ip\"",
            "kind = \"client_ip\"\ntrusted_proxies = [\"10.0.0.0/33\"]",
            "key.trusted_proxies[0]",
            "\"10.0.0.0/33\"",
        ),
    ];
    for (from, to, field, value) in cases {
        let text = base();
        assert!(text.contains(from), "{from}");
        let extra = text.replacen(from, to, 1);
        let path = plan_file("unbuildable.toml", &extra);
        let out = tollgate(&["audit", path.to_str().unwrap(), "--json"]);
        assert_eq!(out.status.code(), Some(1), "{extra}\n{}", stdout(&out));
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let f = &report["findings"][0];
        assert_eq!(f["rule"], "TG000", "{extra}");
        assert_eq!(f["name"], "plan-does-not-build");
        assert_eq!(f["field"], *field, "{extra}");
        assert_eq!(f["value"], *value, "{extra}");

        let out = tollgate(&["audit", path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1));
        assert!(stdout(&out).starts_with("FAIL"), "{}", stdout(&out));
        assert!(stdout(&out).contains(field), "{}", stdout(&out));
    }
}

#[test]
fn help_lists_commands_rules_and_exit_codes() {
    for flag in ["--help", "-h"] {
        let out = tollgate(&[flag]);
        assert_eq!(out.status.code(), Some(0), "{flag}");
        let text = stdout(&out);
        assert!(text.contains("audit") && text.contains("edge"), "{text}");
        for rule in tollgate::audit::rules() {
            assert!(text.contains(rule.id) && text.contains(rule.name), "{text}");
        }
        assert!(text.contains("Exit codes"), "{text}");
        assert!(text.contains("2  the arguments"), "{text}");
    }
    let out = tollgate(&["audit", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains("--json"));
    assert!(stdout(&out).contains("TG011"));

    let out = tollgate(&["--version"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        stdout(&out).trim(),
        format!("tollgate {}", env!("CARGO_PKG_VERSION"))
    );
}

/// The admin API answers 1 to 1000 keys: a count outside that is a bad argument (2), named,
/// not a failure of the call (1).
#[test]
fn a_top_count_out_of_range_is_a_bad_argument() {
    for n in ["0", "5000"] {
        let out = tollgate(&["top", "http://127.0.0.1:1", "-n", n]);
        assert_eq!(out.status.code(), Some(2), "-n {n}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("1..=1000"),
            "-n {n}"
        );
    }
}

#[test]
fn bad_arguments_exit_2_with_usage() {
    for args in [
        &[][..],
        &["audit"][..],
        &["frobnicate"][..],
        &["audit", "a.toml", "--jsn"][..],
    ] {
        let out = tollgate(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("Usage"),
            "{args:?}"
        );
    }
}

#[test]
fn the_cli_exports_the_edge_and_names_what_a_target_cannot_express() {
    for (target, golden) in [
        ("nginx", "plan.nginx.conf"),
        ("cloudflare", "plan.cloudflare.json"),
        ("aws-waf", "plan.aws-waf.json"),
        ("envoy", "plan.envoy.yaml"),
    ] {
        let out = tollgate(&["edge", target, "examples/plan.toml"]);
        assert_eq!(out.status.code(), Some(0), "{target}");
        let golden = std::fs::read_to_string(format!("tests/data/edge/golden/{golden}")).unwrap();
        assert_eq!(stdout(&out), golden, "{target}");
    }
    // nginx's notes also go to stderr; listen and origin are options.
    let out = tollgate(&[
        "edge",
        "nginx",
        "examples/plan.toml",
        "--listen",
        "127.0.0.1:8080",
        "--origin",
        "10.0.0.5:3000",
    ]);
    assert!(
        stdout(&out).contains("listen 127.0.0.1:8080;")
            && stdout(&out).contains("server 10.0.0.5:3000;")
    );
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("note: "));

    let hourly = plan_file(
        "hourly.toml",
        &std::fs::read_to_string("examples/plan.toml")
            .unwrap()
            .replace(
                "limit = 1200\nwindow = \"1m\"",
                "limit = 1000\nwindow = \"1h\"",
            ),
    );
    let out = tollgate(&["edge", "aws-waf", hourly.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        err.contains("edge.rules[0].window") && err.contains("60, 120, 300 or 600"),
        "{err}"
    );
    let out = tollgate(&[
        "edge",
        "aws-waf",
        hourly.to_str().unwrap(),
        "--round-stricter",
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains("\"Limit\": 166,"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("166 per 600 s instead of 1000 per 1h"));

    let out = tollgate(&["edge", "haproxy", "examples/plan.toml"]);
    assert_eq!(out.status.code(), Some(2));
    let out = tollgate(&["edge", "nginx", "no/such/plan.toml"]);
    assert_eq!(out.status.code(), Some(2));
    let out = tollgate(&["edge", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    for word in [
        "nginx",
        "cloudflare",
        "aws-waf",
        "envoy",
        "--round-stricter",
        "--listen",
        "--origin",
        "Exit codes",
    ] {
        assert!(stdout(&out).contains(word), "{word}: {}", stdout(&out));
    }
}

/// A secret read from an environment variable that is set but empty (a secret missing from
/// a deployment) fails the build, naming the field: an empty HMAC key is public, and keys
/// hashed under it are as guessable as unkeyed ones.
#[test]
fn an_empty_secret_variable_fails_the_build() {
    let text = "[key]\nkind = \"api_key\"\nsecret_env = \"TOLLGATE_TEST_EMPTY_SECRET\"\n\
                [[policies]]\nname = \"api\"\nlimit = 5\nwindow = \"1m\"\n\
                [default]\npolicies = [\"api\"]\n";
    let path = plan_file("empty-secret.toml", text);
    let run = |value: &str| {
        Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["audit", path.to_str().unwrap(), "--json"])
            .env("TOLLGATE_TEST_EMPTY_SECRET", value)
            .output()
            .unwrap()
    };
    let out = run("");
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["findings"][0]["field"], "key.secret_env", "{report}");
    assert!(
        report["findings"][0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("empty")),
        "{report}"
    );
    let out = run("a-secret-of-some-length-0123456789");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_ne!(report["findings"][0]["rule"], "TG000", "{report}");
}
