//! Username normalisation: every spelling an identity system treats as one account is one
//! bucket.

use std::borrow::Cow;

use icu_casemap::CaseMapperBorrowed;
use icu_normalizer::ComposingNormalizerBorrowed;
use icu_properties::props::DefaultIgnorableCodePoint;
use icu_properties::CodePointSetDataBorrowed;

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
/// made stricter for rate limiting, where merging two spellings errs on the safe side. The
/// Unicode data comes from ICU4X (`icu_normalizer`, `icu_casemap`, `icu_properties`), the
/// Unicode Consortium's own implementation. Use the same function for account lookup if
/// your accounts should follow the same equivalence; it is stable within a major version.
///
/// ```
/// use tollgate::login::normalise_username;
///
/// assert_eq!(normalise_username("  Alice\t"), "alice");
/// assert_eq!(normalise_username("ÉMILE"), "émile");
/// assert_eq!(normalise_username("ＡＬİＣＥ."), "alice");
/// assert_eq!(normalise_username("Straße"), normalise_username("STRASSE"));
/// ```
pub fn normalise_username(username: &str) -> String {
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
        // `İ` folds to `i` + U+0307; on a soft-dotted letter the dot is already there.
        if c == '\u{307}' && matches!(previous, 'i' | 'j') {
            continue;
        }
        kept.push(c);
        previous = c;
    }
    let recomposed: Cow<'_, str> = nfkc.normalize(&kept);
    recomposed
        .trim()
        .trim_end_matches('.')
        .trim_end()
        .to_owned()
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
}
