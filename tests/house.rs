//! The house kept in order: the architecture tree in the crate docs (and its copy in the
//! README) lists exactly the files under `src/`.

use std::fs;
use std::path::{Path, PathBuf};

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
fn readme_architecture_tree_lists_every_source_file() {
    let readme = read("README.md");
    let section = readme
        .split_once("\n## Architecture\n")
        .expect("README.md has an Architecture section")
        .1;
    assert_tree_matches(section, "README.md (Architecture)");
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
