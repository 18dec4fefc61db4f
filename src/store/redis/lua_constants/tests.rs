//! The generated prelude is what `lua/constants.lua` holds and what every script starts
//! with, and no Lua file writes a shared value itself.

use super::*;

/// `lua/constants.lua`, read from the source tree.
fn constants_file() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("lua/constants.lua")
}

#[test]
fn lua_constants_file_is_the_generated_table() {
    let path = constants_file();
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    if on_disk != table() {
        if std::env::var_os("TOLLGATE_WRITE_LUA_CONSTANTS").is_some() {
            std::fs::write(&path, table()).expect("write lua/constants.lua");
            return;
        }
        panic!(
            "lua/constants.lua is not the table generated from the Rust constants; \
             run this test with TOLLGATE_WRITE_LUA_CONSTANTS=1 to rewrite it. Generated:\n{}",
            table()
        );
    }
}

#[test]
fn values_are_written_in_the_code_and_nowhere_else() {
    assert_eq!(
        inline("if id == ALG_GCRA and mode ~= LEDGER_GRANT then -- ALG_GCRA\n"),
        "if id == 5 and mode ~= 'g' then -- ALG_GCRA\n"
    );
    assert_eq!(inline("x = TTL_MARGIN_MS + TTL_GRID_MS"), "x = 1000 + 512");
    // Strings, longer names and fields keep their text.
    for kept in [
        "redis.call('SET', 'TTL_MARGIN_MS', \"ALG_GCRA\")",
        "local ALG_GCRA_X = MY_TTL_MARGIN_MS",
        "local s = 'a -- b' .. c",
    ] {
        assert_eq!(inline(kept), kept);
    }
}

/// Every script the stores send names no shared constant in its code (each was written in),
/// and no other upper-case name with an underscore (a misspelt one would be a nil global).
#[test]
fn assembled_scripts_hold_the_values() {
    for (name, script) in [
        ("decision", super::super::script::source()),
        ("lease", super::super::ledger_call::lease_source()),
        ("set_override", super::super::script::set_override_source()),
    ] {
        for (n, line) in script.lines().enumerate() {
            let (code, _) = split_comment(line);
            for token in code_tokens(code) {
                let shouting = token.len() > 1
                    && token.contains('_')
                    && token
                        .chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
                assert!(!shouting, "the {name} script, line {}: {token}", n + 1);
            }
        }
    }
    assert!(super::super::script::source().contains("% 512"));
}

#[test]
fn names_are_distinct_and_values_whole() {
    let all = constants();
    let names: std::collections::HashSet<&str> = all.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names.len(), all.len());
    for c in &all {
        assert!(
            c.name
                .chars()
                .all(|ch| ch.is_ascii_uppercase() || ch.is_ascii_digit() || ch == '_'),
            "{}",
            c.name
        );
        if let Value::Number(n) = c.value {
            // Exact in a Lua number (a double).
            assert!(n < 1 << 53, "{}", c.name);
        }
    }
}

/// The code tokens of one Lua line: comments and nothing else left out; strings kept whole,
/// with their quotes.
fn code_tokens(line: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut chars = line.chars().peekable();
    let mut word = String::new();
    let flush = |word: &mut String, tokens: &mut Vec<String>| {
        if !word.is_empty() {
            tokens.push(std::mem::take(word));
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '-' if chars.peek() == Some(&'-') => break,
            '\'' | '"' => {
                flush(&mut word, &mut tokens);
                let mut s = String::from(c);
                for d in chars.by_ref() {
                    s.push(d);
                    if d == c {
                        break;
                    }
                }
                tokens.push(s);
            }
            c if c.is_ascii_alphanumeric() || c == '_' => word.push(c),
            '.' if !word.is_empty() && chars.peek().is_some_and(|d| d.is_ascii_alphanumeric()) => {
                word.push(c)
            }
            '=' | '~' | '<' | '>' if chars.peek() == Some(&'=') => {
                flush(&mut word, &mut tokens);
                chars.next();
                tokens.push(format!("{c}="));
            }
            c if c.is_whitespace() => flush(&mut word, &mut tokens),
            c => {
                flush(&mut word, &mut tokens);
                tokens.push(c.to_string());
            }
        }
    }
    flush(&mut word, &mut tokens);
    tokens
}

/// What `lua` (a file named `file`) writes that it should name instead: one message per
/// place. A shared value of ten or more written as a number (the clock's conversion of
/// `TIME` to milliseconds aside); a shared name defined; an algorithm id, a ledger kind or a
/// mode compared with a literal; a ledger mode's letter; `ALG` indexed by a number.
fn hard_coded(file: &str, lua: &str) -> Vec<String> {
    let all = constants();
    let mut found = Vec::new();
    for (n, line) in lua.lines().enumerate() {
        let at = format!("{file}:{}", n + 1);
        let tokens = code_tokens(line);
        let clock = line.contains("t[1]") || line.contains("t[2]");
        for (i, t) in tokens.iter().enumerate() {
            let next = tokens.get(i + 1).map(String::as_str);
            if next == Some("=") && all.iter().any(|c| c.name == *t) {
                found.push(format!("{at}: defines {t}"));
            }
            if let Ok(v) = t.parse::<u64>() {
                for c in &all {
                    if c.value == Value::Number(v) && v >= 10 && !clock {
                        found.push(format!("{at}: writes {v}, the value of {}", c.name));
                    }
                }
            }
            if all.iter().any(|c| match c.value {
                Value::Text(s) => *t == format!("'{s}'") || *t == format!("\"{s}\""),
                Value::Number(_) => false,
            }) {
                found.push(format!("{at}: writes the ledger code {t}"));
            }
            let compared = matches!(next, Some("==" | "~=" | "<=" | ">=" | "<" | ">"));
            let coded = ["id", "kind", "mode"].contains(&t.rsplit('.').next().unwrap_or(""));
            let literal = |s: Option<&String>| {
                s.is_some_and(|s| s.starts_with(|c: char| c.is_ascii_digit() || c == '\''))
            };
            if coded && compared && literal(tokens.get(i + 2)) {
                found.push(format!("{at}: compares {t} with a literal"));
            }
            if t == "ALG" && next == Some("[") && literal(tokens.get(i + 2)) {
                found.push(format!("{at}: indexes ALG with a literal"));
            }
        }
    }
    found
}

#[test]
fn lua_files_name_the_shared_constants_and_never_write_them() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("lua");
    let mut checked = 0;
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("lua/") {
        let path = entry.expect("lua/ entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !name.ends_with(".lua") || name == "constants.lua" {
            continue;
        }
        let lua = std::fs::read_to_string(&path).expect("a Lua file");
        found.extend(hard_coded(name, &lua));
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} Lua files found");
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_scan_finds_values_written_instead_of_named() {
    let bad = [
        "local TTL_MARGIN_MS = 1000",
        "  target = target + (-target) % 512",
        "if id == 1 then",
        "elseif p.kind ~= 3 then",
        "local charge = mode == 1",
        "if mode == 'g' then",
        "if ARGV[1] ~= 'B' then",
        "ALG[4] = function()",
        "if #blob ~= 88 then",
        "local cap = 4503599627370496",
    ];
    for line in bad {
        assert!(!hard_coded("x.lua", line).is_empty(), "{line}");
    }
    let good = [
        "now = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)",
        "-- TTL_MARGIN_MS is 1000 and the grid 512, as in Rust",
        "if id == ALG_SLIDING_WINDOW_COUNTER then",
        "if p.kind == KIND_LOG or mode == LEDGER_GRANT then",
        "ALG[ALG_GCRA] = function()",
        "local ttl = fin + p.window - now + TTL_MARGIN_MS",
        "redis.call('SET', key, state, 'PX', target - now)",
        "for i = 1, #s.add do",
    ];
    for line in good {
        assert!(hard_coded("x.lua", line).is_empty(), "{line}");
    }
}

/// decide.lua tells the modes that decide (peek, charge) from the others by their order.
#[test]
fn the_modes_that_decide_come_first() {
    assert!((Mode::Peek as u8) < (Mode::Charge as u8));
    for other in [Mode::Refund, Mode::Settle, Mode::Refresh] {
        assert!((Mode::Charge as u8) < (other as u8), "{other:?}");
        assert!((Mode::Refund as u8) <= (other as u8), "{other:?}");
    }
}
