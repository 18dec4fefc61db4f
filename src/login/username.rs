//! Username normalisation: every spelling an identity system treats as one account is one
//! bucket.

use std::borrow::Cow;

use unicode_normalization::{is_nfkc_quick, IsNormalized, UnicodeNormalization};

mod tables;

/// Normalises a username so that spellings of one account share one limit: NFKC, Unicode
/// full case folding, default-ignorable code points removed, NFKC again, then surrounding
/// white space and trailing dots trimmed.
///
/// Each step closes a way to split one account's guesses across buckets:
///
/// | input | why it is the same account |
/// |---|---|
/// | `ALICE`, `Alice` | case (full case folding, not just lower-casing) |
/// | `ａｌｉｃｅ`, `𝐚𝐥𝐢𝐜𝐞`, `ⓐⓛⓘⓒⓔ` | fullwidth, mathematical and circled forms (NFKC) |
/// | `al\u{200B}ice`, `al\u{200D}ice`, `al\u{AD}ice`, `\u{FEFF}alice` | zero-width space and joiner, soft hyphen, BOM (default-ignorable code points) |
/// | `straße` / `strasse` | full case folding maps `ß` to `ss` |
/// | `rene\u{301}` / `ren\u{E9}` | NFD and NFC spellings (NFKC) |
/// | `ALİCE` | `İ` folds to `i` + combining dot above, and a dot above a lowercase `i` or `j` adds nothing visible, so it is removed |
/// | ` alice `, `alice.` | surrounding white space, a trailing dot (as in a fully qualified host or mail domain) |
///
/// This is RFC 8265's UsernameCaseMapped idea (width mapping, case folding, normalisation)
/// made stricter for rate limiting, where merging two spellings errs on the safe side. NFKC
/// comes from `unicode-normalization`; case folding and the default-ignorable code points from
/// tables generated from ICU4X, the Unicode Consortium's own implementation (Unicode 18.0).
/// A test compares the whole function with one built on ICU4X alone, for every Unicode scalar
/// value and for random strings. Use the same function for account lookup if your accounts
/// should follow the same equivalence; it is stable within a major version.
///
/// ```
/// use tollgate::login::normalise_username;
///
/// assert_eq!(normalise_username("  Alice\t"), "alice");
/// assert_eq!(normalise_username("ÉMILE"), "émile");
/// assert_eq!(normalise_username("ＡＬİＣＥ."), "alice");
/// assert_eq!(normalise_username("alice. ."), "alice"); // trailing dots and spaces, any order
/// assert_eq!(normalise_username("Straße"), normalise_username("STRASSE"));
/// ```
pub fn normalise_username(username: &str) -> String {
    let composed = nfkc(username);
    let mut kept = String::with_capacity(composed.len());
    let mut previous = '\0';
    // Whether folding or removal changed anything: if not, `kept` is `composed`, already NFKC.
    let mut changed = false;
    let mut keep = |c: char| {
        if is_default_ignorable(c) {
            return false;
        }
        // `İ` folds to `i` + U+0307; on a soft-dotted letter the dot is already there.
        if c == '\u{307}' && matches!(previous, 'i' | 'j') {
            return false;
        }
        kept.push(c);
        previous = c;
        true
    };
    for c in composed.chars() {
        if c.is_ascii_uppercase() {
            keep(c.to_ascii_lowercase());
            changed = true;
        } else if c.is_ascii() {
            keep(c);
        } else if let Ok(i) = tables::CASE_FOLDING.binary_search_by_key(&c, |&(from, _)| from) {
            for c in tables::CASE_FOLDING[i].1.chars() {
                keep(c);
            }
            changed = true;
        } else if !keep(c) {
            changed = true;
        }
    }
    let recomposed = if changed {
        nfkc(&kept)
    } else {
        Cow::Borrowed(kept.as_str())
    };
    // Trailing dots and white space in any order (`alice. .`): trimming each once would
    // leave some, and the result would normalise to yet another name.
    recomposed
        .trim_start()
        .trim_end_matches(|c: char| c == '.' || c.is_whitespace())
        .to_owned()
}

/// NFKC, borrowing when the quick check finds the text already normalised.
fn nfkc(s: &str) -> Cow<'_, str> {
    match is_nfkc_quick(s.chars()) {
        IsNormalized::Yes => Cow::Borrowed(s),
        IsNormalized::No | IsNormalized::Maybe => Cow::Owned(s.nfkc().collect()),
    }
}

/// Whether `c` has the Default_Ignorable_Code_Point property.
fn is_default_ignorable(c: char) -> bool {
    c >= tables::DEFAULT_IGNORABLE[0].0
        && tables::DEFAULT_IGNORABLE
            .binary_search_by(|&(start, end)| {
                if end < c {
                    std::cmp::Ordering::Less
                } else if start > c {
                    std::cmp::Ordering::Greater
                } else {
                    std::cmp::Ordering::Equal
                }
            })
            .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sixteen_spellings_of_one_account_share_one_bucket() {
        let alice = [
            "alice",
            "Alice",
            "ALICE",
            " alice\t",
            "ALİCE",
            "ａｌｉｃｅ",
            "𝐚𝐥𝐢𝐜𝐞",
            "ⓐⓛⓘⓒⓔ",
            "al\u{200B}ice",
            "al\u{200D}ice",
            "al\u{AD}ice",
            "\u{FEFF}alice",
            "alice.",
        ];
        for spelling in alice {
            assert_eq!(normalise_username(spelling), "alice", "{spelling:?}");
        }
        assert_eq!(normalise_username("straße"), normalise_username("strasse"));
        assert_eq!(
            normalise_username("rene\u{301}"),
            normalise_username("ren\u{E9}")
        );
        assert_ne!(normalise_username("rene"), normalise_username("rené"));
    }

    #[test]
    fn hostile_input_is_bounded_and_never_panics() {
        for s in [
            "",
            ".",
            "...",
            "\u{307}",
            "i\u{307}\u{307}",
            "\u{FEFF}",
            "\u{10FFFF}",
        ] {
            let _ = normalise_username(s);
        }
        let long = "Ａ".repeat(10_000);
        assert_eq!(normalise_username(&long).len(), 10_000);
    }

    // ICU4X, the reference: what this function computed before its data became the tables.

    use icu_casemap::CaseMapperBorrowed;
    use icu_normalizer::ComposingNormalizerBorrowed;
    use icu_properties::props::{CanonicalCombiningClass, DefaultIgnorableCodePoint};
    use icu_properties::{CodePointMapDataBorrowed, CodePointSetDataBorrowed};
    use proptest::strategy::{Strategy, ValueTree};
    use proptest::test_runner::TestRunner;

    /// The same steps on ICU4X alone (the implementation up to 0.1).
    fn normalise_username_icu4x(username: &str) -> String {
        let nfkc = ComposingNormalizerBorrowed::new_nfkc();
        let composed = nfkc.normalize(username);
        let folded = CaseMapperBorrowed::new().fold_string(&composed);
        let ignorable = CodePointSetDataBorrowed::new::<DefaultIgnorableCodePoint>();
        let mut kept = String::with_capacity(folded.len());
        let mut previous = '\0';
        for c in folded.chars() {
            if ignorable.contains(c) {
                continue;
            }
            if c == '\u{307}' && matches!(previous, 'i' | 'j') {
                continue;
            }
            kept.push(c);
            previous = c;
        }
        nfkc.normalize(&kept)
            .trim_start()
            .trim_end_matches(|c: char| c == '.' || c.is_whitespace())
            .to_owned()
    }

    #[test]
    fn trailing_dots_and_white_space_go_in_any_order_and_a_name_normalises_to_itself() {
        for s in [
            "alice. .",
            "alice .",
            "alice.\t.",
            "alice. . ",
            "alice .. .",
            "alice.\u{3000}.",
            " \u{2003}Alice\u{200b}. \u{a0}.",
        ] {
            let once = normalise_username(s);
            assert_eq!(once, "alice", "{s:?}");
            assert_eq!(normalise_username(&once), once, "{s:?}");
        }
        // Dots inside a name stay.
        assert_eq!(normalise_username("a.l.ice. "), "a.l.ice");
    }

    fn scalars() -> impl Iterator<Item = char> {
        ('\0'..=char::MAX).filter(|c| !c.is_ascii())
    }

    /// The inputs on which the two implementations differ, as a readable list.
    fn differences(inputs: impl Iterator<Item = String>) -> Vec<String> {
        inputs
            .filter_map(|input| {
                let ours = normalise_username(&input);
                let icu4x = normalise_username_icu4x(&input);
                (ours != icu4x).then(|| {
                    format!(
                        "{}: {} (ICU4X: {})",
                        input.escape_unicode(),
                        ours.escape_unicode(),
                        icu4x.escape_unicode()
                    )
                })
            })
            .collect()
    }

    #[track_caller]
    fn assert_no_differences(what: &str, differences: &[String]) {
        assert!(
            differences.is_empty(),
            "{} differences from ICU4X {what}, the first 50:\n{}",
            differences.len(),
            differences[..differences.len().min(50)].join("\n")
        );
    }

    /// The text of `tables.rs` as ICU4X's data gives it.
    fn generated_tables() -> String {
        let (major, minor, update) = unicode_normalization::UNICODE_VERSION;
        let mut out = format!(
            "//! Unicode {major}.{minor}.{update} data for [`normalise_username`](super::normalise_username)\n\
             //! (the version of `unicode-normalization`'s NFKC; the tests compare both with ICU4X),\n\
             //! generated from ICU4X by the test `login::username::tests::the_tables_are_icu4x_data`:\n\
             //! after updating the ICU4X dev-dependencies,\n\
             //! `TOLLGATE_REGENERATE=1 cargo test --lib login::username` rewrites this file. Do not\n\
             //! edit it by hand.\n\n"
        );
        out += "/// Full case folding (CaseFolding.txt, statuses C and F) of every scalar value that folds to\n\
                /// something else, sorted.\n\
                pub(super) static CASE_FOLDING: &[(char, &str)] = &[\n";
        let casemapper = CaseMapperBorrowed::new();
        for c in '\0'..=char::MAX {
            let folded = casemapper
                .fold_string(c.encode_utf8(&mut [0; 4]))
                .into_owned();
            if folded != c.to_string() {
                out += &format!(
                    "    ('{}', \"{}\"),\n",
                    c.escape_unicode(),
                    folded.escape_unicode()
                );
            }
        }
        out += "];\n\n/// Default_Ignorable_Code_Point, as sorted inclusive ranges.\n\
                pub(super) static DEFAULT_IGNORABLE: &[(char, char)] = &[\n";
        for range in CodePointSetDataBorrowed::new::<DefaultIgnorableCodePoint>().iter_ranges() {
            let [start, end] = [*range.start(), *range.end()].map(|c| char::from_u32(c).unwrap());
            out += &format!(
                "    ('{}', '{}'),\n",
                start.escape_unicode(),
                end.escape_unicode()
            );
        }
        out + "];\n"
    }

    #[test]
    fn the_tables_are_icu4x_data() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/login/username/tables.rs");
        let generated = generated_tables();
        if std::fs::read_to_string(path).unwrap() == generated {
            return;
        }
        if std::env::var_os("TOLLGATE_REGENERATE").is_some() {
            std::fs::write(path, generated).unwrap();
            panic!("{path} regenerated: run the tests again");
        }
        panic!(
            "{path} is not ICU4X's data: run `TOLLGATE_REGENERATE=1 cargo test --lib login::username`"
        );
    }

    #[test]
    fn every_scalar_value_alone_normalises_as_with_icu4x() {
        let differences = differences(scalars().map(String::from));
        assert_no_differences("for a scalar value alone", &differences);
    }

    #[test]
    fn every_scalar_value_after_a_letter_normalises_as_with_icu4x() {
        let differences = differences(scalars().map(|c| format!("a{c}")));
        assert_no_differences("for a scalar value after `a`", &differences);
    }

    /// Scalar values that take part in some step: those that fold, decompose or are part of a
    /// decomposition, combine (a canonical combining class), are default-ignorable or trimmed.
    fn interesting_scalars() -> Vec<char> {
        let casemapper = CaseMapperBorrowed::new();
        let nfkd = icu_normalizer::DecomposingNormalizerBorrowed::new_nfkd();
        let ccc = CodePointMapDataBorrowed::<CanonicalCombiningClass>::new();
        let ignorable = CodePointSetDataBorrowed::new::<DefaultIgnorableCodePoint>();
        let mut interesting = std::collections::BTreeSet::new();
        for c in '\0'..=char::MAX {
            let alone = c.to_string();
            let decomposed = nfkd.normalize(&alone);
            if decomposed != alone {
                interesting.insert(c);
                interesting.extend(decomposed.chars());
            }
            if casemapper.fold_string(&alone) != alone
                || ccc.get(c) != CanonicalCombiningClass::NotReordered
                || ignorable.contains(c)
                || c.is_whitespace()
            {
                interesting.insert(c);
            }
        }
        interesting.extend(['.', 'i', 'j', '\u{307}']);
        interesting.into_iter().collect()
    }

    #[test]
    fn random_strings_normalise_as_with_icu4x() {
        const CASES: usize = 300_000;
        let interesting = interesting_scalars();
        let char = proptest::prop_oneof![
            6 => proptest::sample::select(interesting),
            2 => proptest::char::range('\0', '\u{7f}'),
            1 => proptest::char::any(),
        ];
        let strings = proptest::collection::vec(char, 0..12).prop_map(String::from_iter);
        let mut runner = TestRunner::default();
        let inputs = (0..CASES).map(|_| strings.new_tree(&mut runner).unwrap().current());
        let differences = differences(inputs);
        assert_no_differences("for random strings", &differences);
    }
}
