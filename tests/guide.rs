//! The README and the guide (`docs/`) hold together: every chapter is listed in the README's
//! table and compiled as doctests by `src/lib.rs`, and every relative link leads to a file
//! that exists and, when it names one, to a heading that exists in it (GitHub's anchors).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The chapters, as `docs/NAME.md`, sorted.
fn chapters() -> Vec<String> {
    let mut out: Vec<String> = fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    out.sort();
    out
}

/// The text of `markdown` outside its fenced code blocks.
fn prose(markdown: &str) -> String {
    let mut fenced = false;
    let mut out = String::new();
    for line in markdown.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces as `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(path: &Path) -> BTreeSet<String> {
    let text = fs::read_to_string(path).unwrap();
    prose(&text)
        .lines()
        .filter_map(|l| {
            l.trim_start_matches('#')
                .strip_prefix(' ')
                .filter(|_| l.starts_with('#'))
        })
        .map(anchor)
        .collect()
}

/// Every `](target)` of `markdown`'s prose.
fn links(markdown: &str) -> Vec<String> {
    let text = prose(markdown);
    let mut out = Vec::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            out.push(rest[..end].to_owned());
        }
    }
    out
}

#[test]
fn every_relative_link_leads_somewhere() {
    let mut broken = Vec::new();
    for file in std::iter::once("README.md".to_owned()).chain(chapters()) {
        let path = root().join(&file);
        let text = fs::read_to_string(&path).unwrap();
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") || link.contains(' ') {
                continue;
            }
            let (target, heading) = link.split_once('#').unwrap_or((&link, ""));
            let target = if target.is_empty() {
                path.clone()
            } else {
                path.parent().unwrap().join(target)
            };
            if !target.exists() {
                broken.push(format!("{file}: {link}: no such file"));
            } else if !heading.is_empty()
                && target.extension().is_some_and(|e| e == "md")
                && !anchors(&target).contains(heading)
            {
                broken.push(format!("{file}: {link}: no such heading"));
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn every_chapter_is_in_the_readme_and_compiled() {
    let readme = fs::read_to_string(root().join("README.md")).unwrap();
    let lib = fs::read_to_string(root().join("src/lib.rs")).unwrap();
    for chapter in chapters() {
        assert!(
            readme.contains(&format!("]({chapter})")),
            "the README's table of capabilities does not link {chapter}"
        );
        assert!(
            lib.contains(&format!("include_str!(\"../{chapter}\")")),
            "src/lib.rs does not compile {chapter}'s code blocks as doctests"
        );
    }
}

#[test]
fn the_anchor_rule_is_githubs() {
    assert_eq!(
        anchor("Attaching policies through axum's router"),
        "attaching-policies-through-axums-router"
    );
    assert_eq!(
        anchor("Count only failures (or successes)"),
        "count-only-failures-or-successes"
    );
    assert_eq!(anchor("Reserve, then settle"), "reserve-then-settle");
}
