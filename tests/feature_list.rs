//! One source of truth for the feature list: `Cargo.toml`'s `[features]` section, where the
//! `##` lines above each feature say what it adds. The feature tables in the README and in
//! the crate docs (`src/lib.rs`) must name the same features, mark the same defaults and give
//! the same descriptions; `.ci/run` must check every feature on its own.

use std::collections::BTreeMap;

const CARGO_TOML: &str = include_str!("../Cargo.toml");
const README: &str = include_str!("../README.md");
const LIB_RS: &str = include_str!("../src/lib.rs");
const CI_RUN: &str = include_str!("../.ci/run");

/// A feature as a table row shows it.
#[derive(Debug, PartialEq, Eq)]
struct Row {
    default: bool,
    adds: String,
}

/// `Cargo.toml`'s features (without `default`), each with its `##` description and whether
/// `default` lists it.
fn cargo_features() -> BTreeMap<String, Row> {
    let section = CARGO_TOML
        .split_once("\n[features]\n")
        .expect("Cargo.toml has a [features] section")
        .1;
    let section = &section[..section.find("\n[").unwrap_or(section.len())];
    let mut doc: Vec<&str> = Vec::new();
    let mut defaults: Vec<String> = Vec::new();
    let mut features = BTreeMap::new();
    for line in section.lines() {
        let line = line.trim();
        if let Some(text) = line.strip_prefix("##") {
            doc.push(text.trim());
            continue;
        }
        if let Some((name, value)) = line.split_once('=') {
            let name = name.trim();
            if name == "default" {
                defaults = value
                    .trim()
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .split(',')
                    .map(|s| s.trim().trim_matches('"').to_owned())
                    .filter(|s| !s.is_empty())
                    .collect();
            } else {
                assert!(
                    !doc.is_empty(),
                    "Cargo.toml: feature `{name}` has no `##` lines above it saying what it adds"
                );
                let row = Row {
                    default: false,
                    adds: normalise(&doc.join(" ")),
                };
                features.insert(name.to_owned(), row);
            }
        }
        doc.clear();
    }
    for name in &defaults {
        features
            .get_mut(name)
            .unwrap_or_else(|| panic!("Cargo.toml: `default` names `{name}`, not a feature"))
            .default = true;
    }
    features
}

/// A description as compared: rustdoc links reduced to their text (`[`x`]` and `[`x`](y)`
/// are `` `x` ``), white space collapsed, no final period.
fn normalise(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("[`") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        match after.find("`]") {
            Some(end) => {
                out.push_str(&after[..end + 1]);
                rest = &after[end + 2..];
                if rest.starts_with('(') {
                    rest = &rest[rest.find(')').map_or(0, |i| i + 1)..];
                }
            }
            None => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    let out = out.split_whitespace().collect::<Vec<_>>().join(" ");
    out.trim_end_matches('.').to_owned()
}

/// The rows of the `| feature | adds |` table in `text`, by feature name.
fn table(text: &str, what: &str) -> BTreeMap<String, Row> {
    let mut lines = text
        .lines()
        .skip_while(|l| l.trim() != "| feature | adds |");
    assert!(
        lines.next().is_some(),
        "{what}: no `| feature | adds |` table"
    );
    let mut rows = BTreeMap::new();
    for line in lines.skip(1) {
        let Some(cells) = line.trim().strip_prefix('|') else {
            break;
        };
        let (name_cell, adds) = cells
            .trim_end_matches('|')
            .split_once('|')
            .unwrap_or_else(|| panic!("{what}: a feature row without two cells: {line}"));
        let name_cell = name_cell.trim();
        let name = name_cell
            .split('`')
            .nth(1)
            .unwrap_or_else(|| panic!("{what}: the feature is not in backticks: {line}"));
        let row = Row {
            default: name_cell.ends_with("(default)"),
            adds: normalise(adds),
        };
        assert!(
            rows.insert(name.to_owned(), row).is_none(),
            "{what}: feature `{name}` has two rows"
        );
    }
    rows
}

/// The crate docs of `src/lib.rs`, without their `//! ` prefixes.
fn crate_docs() -> String {
    LIB_RS
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The table row `Cargo.toml` asks for, to paste.
fn expected_row(name: &str, row: &Row) -> String {
    let default = if row.default { " (default)" } else { "" };
    format!("| `{name}`{default} | {} |", row.adds)
}

/// Every difference between `table` and `Cargo.toml`, one line each.
fn differences(cargo: &BTreeMap<String, Row>, table: &BTreeMap<String, Row>) -> Vec<String> {
    let mut out = Vec::new();
    for (name, want) in cargo {
        match table.get(name) {
            None => out.push(format!(
                "feature `{name}` is missing; add the row\n    {}",
                expected_row(name, want)
            )),
            Some(got) if got != want => out.push(format!(
                "feature `{name}` differs from Cargo.toml;\n    table      {}\n    Cargo.toml {}",
                expected_row(name, got),
                expected_row(name, want)
            )),
            Some(_) => {}
        }
    }
    for name in table.keys().filter(|n| !cargo.contains_key(*n)) {
        out.push(format!(
            "feature `{name}` is not in Cargo.toml's [features]"
        ));
    }
    out
}

fn assert_matches(what: &str, text: &str) {
    let differences = differences(&cargo_features(), &table(text, what));
    assert!(
        differences.is_empty(),
        "{what}'s feature table disagrees with Cargo.toml's [features] (the `##` lines above \
         each feature are the descriptions):\n{}",
        differences.join("\n")
    );
}

#[test]
fn every_feature_says_what_it_adds() {
    let features = cargo_features();
    for name in ["axum", "config", "redis", "cluster", "cli"] {
        assert!(features.contains_key(name), "Cargo.toml lost `{name}`");
    }
    assert!(features["axum"].default && features["config"].default);
    assert!(!features["redis"].default);
}

#[test]
fn readme_feature_table_matches_cargo_toml() {
    assert_matches("README.md", README);
}

#[test]
fn crate_docs_feature_table_matches_cargo_toml() {
    assert_matches("src/lib.rs (crate docs)", &crate_docs());
}

#[test]
fn ci_checks_every_feature_alone() {
    let line = CI_RUN
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("for features in "))
        .expect(".ci/run has a `for features in …` loop");
    let listed: Vec<&str> = line["for features in ".len()..]
        .split(';')
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .filter(|f| *f != "\"\"")
        .collect();
    let cargo = cargo_features();
    let missing: Vec<&String> = cargo
        .keys()
        .filter(|f| !listed.contains(&f.as_str()))
        .collect();
    let extra: Vec<&&str> = listed.iter().filter(|f| !cargo.contains_key(**f)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        ".ci/run's per-feature check: missing {missing:?}, not features {extra:?}"
    );
}

/// The `tollgate` command acts on any plan a service can build: its feature brings in every
/// store a plan's `[store]` can name, or `audit`, `edge` and the store commands fail on a
/// valid plan with "needs the cargo feature".
#[test]
fn the_cli_reads_every_store_a_plan_can_name() {
    let line = CARGO_TOML
        .lines()
        .find(|l| l.starts_with("cli = ["))
        .expect("Cargo.toml has a `cli` feature");
    for store in ["redis", "cluster", "sentinel", "regions"] {
        let implied = line.contains(&format!("\"{store}\""))
            || (store == "redis" && line.contains("\"cluster\""));
        assert!(
            implied,
            "the `cli` feature does not bring in `{store}`: {line}"
        );
    }
}

#[test]
fn normalise_reduces_rustdoc_links() {
    assert_eq!(
        normalise("TOML plans ([`config::Plan`]), the [`audit()`](crate::audit)."),
        "TOML plans (`config::Plan`), the `audit()`"
    );
    assert_eq!(normalise("a  [b] [`c`]\n d"), "a [b] `c` d");
}
