//! The house kept in order: the architecture tree in the crate docs (and its copy in the
//! guide's `docs/architecture.md`) lists exactly the files under `src/`, no source file is over 700 lines and no
//! function over 120.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

/// The most lines a file under `src/` may have.
const MAX_FILE_LINES: usize = 700;
/// The most lines a function under `src/` may have, from its `fn` line to its closing brace.
const MAX_FN_LINES: usize = 120;

/// Files and functions over the limits today in the folders being restructured
/// (`src/store/`, `src/limiter/`, `src/middleware/`): each entry is a file (over
/// [`MAX_FILE_LINES`]) or `file::function` (over [`MAX_FN_LINES`]). The list only shrinks: an
/// entry that is within the limits fails the test until it is removed, and no entry may name
/// a file outside those folders.
const OVER_THE_LIMITS_FOR_NOW: &[&str] = &[];

/// Data generated from another source (each says how to regenerate it in its first lines),
/// not code: no size limit applies. Kept to tables of values, with no functions.
const GENERATED_DATA: &[&str] = &["src/login/username/tables.rs"];

/// The folders whose offenders [`OVER_THE_LIMITS_FOR_NOW`] may name.
const BEING_RESTRUCTURED: &[&str] = &["src/store/", "src/limiter/", "src/middleware/"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every file under `src/`, as `src/...` with `/` separators, sorted.
fn source_files() -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<String>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else {
                let relative = path.strip_prefix(root()).unwrap();
                let parts: Vec<_> = relative.iter().map(|p| p.to_string_lossy()).collect();
                out.push(parts.join("/"));
            }
        }
    }
    let mut out = Vec::new();
    walk(&root().join("src"), &mut out);
    out.sort();
    out
}

fn read(path: &str) -> String {
    fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// The architecture tree

/// What an architecture tree lists: files and folders as `src/...` paths, each with its line
/// in the tree (for error messages).
#[derive(Debug, Default)]
struct Tree {
    files: Vec<(String, String)>,
    folders: Vec<(String, String)>,
}

/// The `src/` tree of a ```` ```text ```` block in `doc` (without its `//! ` prefixes).
///
/// Each line below `src/` is `(│   |    )*(├── |└── )NAME  description`; a `NAME` ending in
/// `/` is a folder whose entries follow one level deeper, and a `NAME` may hold a `/` itself
/// (`engine/tests.rs`).
fn tree(doc: &str, what: &str) -> Tree {
    let mut lines = doc
        .lines()
        .skip_while(|l| l.trim_end() != "```text")
        .skip(1);
    assert_eq!(
        lines.next().map(str::trim_end),
        Some("src/"),
        "{what}: the architecture tree (a ```text block) must start with `src/`"
    );
    let mut tree = Tree::default();
    let mut stack: Vec<String> = Vec::new();
    for line in lines.take_while(|l| l.trim_end() != "```") {
        let mut rest = line;
        let mut depth = 0;
        while let Some(r) = rest
            .strip_prefix("│   ")
            .or_else(|| rest.strip_prefix("    "))
        {
            rest = r;
            depth += 1;
        }
        let name = rest
            .strip_prefix("├── ")
            .or_else(|| rest.strip_prefix("└── "))
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_else(|| {
                panic!("{what}: a tree line that is not `├── NAME  description`: {line:?}")
            });
        assert!(
            depth <= stack.len(),
            "{what}: {name} is nested deeper than its folder: {line:?}"
        );
        stack.truncate(depth);
        let path = format!(
            "src/{}{name}",
            stack.iter().map(|s| format!("{s}/")).collect::<String>()
        );
        if let Some(folder) = name.strip_suffix('/') {
            stack.push(folder.to_owned());
            tree.folders.push((
                path.trim_end_matches('/').to_owned(),
                line.trim().to_owned(),
            ));
        } else {
            tree.files.push((path, line.trim().to_owned()));
        }
    }
    tree
}

/// Every way the tree in `doc` and the files under `src/` disagree, one line each.
fn tree_differences(doc: &str, what: &str) -> Vec<String> {
    let Tree { files, folders } = tree(doc, what);
    let actual = source_files();
    let mut out = Vec::new();
    for (path, line) in &files {
        if !actual.contains(path) {
            out.push(format!(
                "lists {path}, which does not exist (the line `{line}`)"
            ));
        }
    }
    for (path, line) in &folders {
        if !root().join(path).is_dir() {
            out.push(format!(
                "lists the folder {path}/, which does not exist (the line `{line}`)"
            ));
        }
    }
    for path in &actual {
        if !files.iter().any(|(p, _)| p == path) {
            let folder = path.rsplit_once('/').map_or("src", |(f, _)| f);
            out.push(format!(
                "does not list {path} (add a line for it under {folder}/)"
            ));
        }
    }
    let mut seen = Vec::new();
    for (path, _) in &files {
        if seen.contains(&path) {
            out.push(format!("lists {path} twice"));
        }
        seen.push(path);
    }
    out
}

fn assert_tree_matches(doc: &str, what: &str) {
    let differences = tree_differences(doc, what);
    assert!(
        differences.is_empty(),
        "{what}'s architecture tree disagrees with the files under src/:\n  {}",
        differences.join("\n  ")
    );
}

#[test]
fn crate_docs_architecture_tree_lists_every_source_file() {
    let lib = read("src/lib.rs");
    let docs: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect();
    assert_tree_matches(
        &docs.join("\n"),
        "src/lib.rs (the crate docs' Architecture section)",
    );
}

#[test]
fn guide_architecture_tree_lists_every_source_file() {
    let chapter = read("docs/architecture.md");
    assert_tree_matches(&chapter, "docs/architecture.md");
}

#[test]
fn tree_reader_reports_missing_and_extra_files() {
    let doc = "```text\nsrc/\n├── lib.rs   docs\n├── gone.rs  no such file\n└── key/\n    └── mod.rs  keys\n```";
    let differences = tree_differences(doc, "test");
    assert!(differences
        .iter()
        .any(|d| d.starts_with("lists src/gone.rs, which does not exist")));
    assert!(differences
        .iter()
        .any(|d| d == "does not list src/key/extractor.rs (add a line for it under src/key/)"));
    assert!(!differences
        .iter()
        .any(|d| d.contains("src/key/mod.rs") || d.contains("src/lib.rs")));
}

// ---------------------------------------------------------------------------------------------
// Sizes

/// The functions of a rustfmt-formatted file: name, first line (1-based) and length in lines,
/// from the `fn` line to the line holding only the closing brace at the `fn`'s indentation.
/// A declaration without a body counts to its `;`.
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some((indent, name)) = fn_start(line) else {
            continue;
        };
        // The signature runs to the line ending in `{` (the body opens), `;` (no body) or `}`
        // (the whole function on one line).
        let Some(open) = (i..lines.len()).find(|&j| {
            let l = lines[j].trim_end();
            l.ends_with('{') || l.ends_with(';') || l.ends_with('}')
        }) else {
            continue;
        };
        let opened = lines[open].trim_end();
        if opened.ends_with(';') || opened.ends_with('}') {
            out.push((name, i + 1, open - i + 1));
            continue;
        }
        let close = format!("{indent}}}");
        if let Some(end) = (open + 1..lines.len()).find(|&j| lines[j].trim_end() == close) {
            out.push((name, i + 1, end - i + 1));
        }
    }
    out
}

/// The indentation and name of a line that starts a function (`pub(crate) async fn name`).
fn fn_start(line: &str) -> Option<(&str, String)> {
    let trimmed = line.trim_start();
    let indent = &line[..line.len() - trimmed.len()];
    let mut rest = trimmed;
    loop {
        let before = rest;
        if let Some(r) = rest.strip_prefix("pub") {
            rest = match r.strip_prefix('(') {
                Some(r) => r.split_once(')')?.1,
                None => r,
            }
            .trim_start();
        }
        for qualifier in ["const ", "async ", "unsafe ", "default "] {
            if let Some(r) = rest.strip_prefix(qualifier) {
                rest = r.trim_start();
            }
        }
        if let Some(r) = rest.strip_prefix("extern ") {
            rest = r.trim_start();
            if rest.starts_with('"') {
                rest = rest[1..].split_once('"')?.1.trim_start();
            }
        }
        if rest == before {
            break;
        }
    }
    let name: String = rest
        .strip_prefix("fn ")?
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some((indent, name))
}

#[test]
fn no_file_or_function_over_the_limits() {
    let mut over: Vec<(String, String)> = Vec::new();
    for path in source_files().iter().filter(|p| p.ends_with(".rs")) {
        let text = read(path);
        let lines = text.lines().count();
        if GENERATED_DATA.contains(&path.as_str()) {
            assert!(
                text.lines().take(8).any(|l| l.contains("generated")) && functions(&text).is_empty(),
                "{path} is listed as generated data: it must say so in its first lines and hold no functions"
            );
            continue;
        }
        if lines > MAX_FILE_LINES {
            over.push((
                path.clone(),
                format!("{path}: {lines} lines (at most {MAX_FILE_LINES})"),
            ));
        }
        for (name, line, length) in functions(&text) {
            if length > MAX_FN_LINES {
                over.push((
                    format!("{path}::{name}"),
                    format!("{path}:{line}: fn {name} is {length} lines (at most {MAX_FN_LINES})"),
                ));
            }
        }
    }
    let mut report = String::new();
    for (entry, what) in &over {
        if !OVER_THE_LIMITS_FOR_NOW.contains(&entry.as_str()) {
            writeln!(report, "  {what}").unwrap();
        }
    }
    for entry in OVER_THE_LIMITS_FOR_NOW {
        if !over.iter().any(|(e, _)| e == entry) {
            writeln!(
                report,
                "  {entry} is within the limits now: remove it from OVER_THE_LIMITS_FOR_NOW"
            )
            .unwrap();
        }
        if !BEING_RESTRUCTURED.iter().any(|f| entry.starts_with(f)) {
            writeln!(
                report,
                "  {entry}: OVER_THE_LIMITS_FOR_NOW may only name files in {BEING_RESTRUCTURED:?}"
            )
            .unwrap();
        }
    }
    assert!(report.is_empty(), "sizes under src/:\n{report}");
}

#[test]
fn function_reader_measures_bodies() {
    let text = "\
impl X {
    pub(crate) async fn long(
        &self,
    ) -> u8 {
        let s = \"}\";
    }

    fn declared(&self);
    fn one_line(&self) -> u8 { 1 }
}
pub const fn top() {
}
";
    assert_eq!(
        functions(text),
        [
            ("long".to_owned(), 2, 5),
            ("declared".to_owned(), 8, 1),
            ("one_line".to_owned(), 9, 1),
            ("top".to_owned(), 11, 2),
        ]
    );
}
