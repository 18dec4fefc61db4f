//! The username in a request body: a JSON object's string field, a form field. Each refuses
//! a body that names the field twice (parsers disagree on which one wins).

use std::fmt;

use crate::refusal::RefusalKind;

/// The string value of `field` in a JSON object body: `Ok(None)` when the body is not JSON or
/// has no such string field, `Err` when the field appears more than once, or when the body is
/// a JSON array (serde's derived `Deserialize`, behind axum's `Json`, reads a struct from an
/// array by position: `["victim","guess"]` is the victim's attempt to the handler).
pub(super) fn json_string_field(body: &[u8], field: &str) -> Result<Option<String>, RefusalKind> {
    use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};

    enum Found {
        Once(Option<String>),
        Twice,
        Positional,
    }
    struct Field<'f>(&'f str);
    impl<'de> Visitor<'de> for Field<'_> {
        type Value = Found;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Found, A::Error> {
            let mut found: Option<Option<String>> = None;
            while let Some(key) = map.next_key::<String>()? {
                if key != self.0 {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
                let value: serde_json::Value = map.next_value()?;
                if found.is_some() {
                    return Ok(Found::Twice);
                }
                found = Some(value.as_str().map(str::to_owned));
            }
            Ok(Found::Once(found.flatten()))
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Found, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(Found::Positional)
        }
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    match de.deserialize_any(Field(field)) {
        Ok(Found::Twice) => Err(RefusalKind::LoginUsernameAmbiguous),
        Ok(Found::Positional) if de.end().is_ok() => Err(RefusalKind::LoginUsernameAmbiguous),
        Ok(Found::Once(username)) if de.end().is_ok() => Ok(username),
        _ => Ok(None),
    }
}

/// The value of `field` in an `application/x-www-form-urlencoded` body, decoded as a form
/// (`%XX` and `+` for a space, as axum's `Form` and every framework's form reader decode it,
/// so `%61lice` is `alice`): `Ok(None)` when the body has no such field, `Err` when it appears
/// more than once (`username=decoy&username=victim`: frameworks disagree on which wins).
pub(super) fn form_field(body: &[u8], field: &str) -> Result<Option<String>, RefusalKind> {
    let mut found = None;
    for (name, value) in form_urlencoded::parse(body) {
        if name != field {
            continue;
        }
        if found.is_some() {
            return Err(RefusalKind::LoginUsernameAmbiguous);
        }
        found = Some(value.into_owned());
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duplicated_username_field_is_refused() {
        let read = |body: &str| json_string_field(body.as_bytes(), "username");
        // An array is read by position by a derived `Deserialize`: the guard cannot tell
        // which element the handler takes for the username.
        assert_eq!(
            read(r#"["alice","guess"]"#),
            Err(RefusalKind::LoginUsernameAmbiguous)
        );
        assert_eq!(read(r#""alice""#), Ok(None));
        assert_eq!(read("42"), Ok(None));
        assert_eq!(read(r#"["alice""#), Ok(None));
        assert_eq!(
            read(r#"{"username":"alice","password":"x"}"#),
            Ok(Some("alice".into()))
        );
        assert_eq!(
            read(r#"{"username":"decoy","password":"x","username":"victim"}"#),
            Err(RefusalKind::LoginUsernameAmbiguous)
        );
        // Escapes do not hide a duplicate.
        assert_eq!(
            read(r#"{"username":"decoy","user\u006eame":"victim"}"#),
            Err(RefusalKind::LoginUsernameAmbiguous)
        );
        // Other fields may repeat; nested objects are not the username.
        assert_eq!(
            read(r#"{"a":1,"a":2,"username":"bob"}"#),
            Ok(Some("bob".into()))
        );
        assert_eq!(
            read(r#"{"x":{"username":"a"},"username":"bob"}"#),
            Ok(Some("bob".into()))
        );
        assert_eq!(read("[1,2]"), Err(RefusalKind::LoginUsernameAmbiguous));
        assert_eq!(read("not json"), Ok(None));
        assert_eq!(read(r#"{"username":7}"#), Ok(None));
        assert_eq!(read(r#"{"username":"a"} trailing"#), Ok(None));
    }

    #[test]
    fn a_form_field_is_decoded_as_forms_are_and_refused_twice() {
        let read = |body: &str| form_field(body.as_bytes(), "username");
        for spelling in [
            "username=alice",
            "username=%61lice",
            "username=%61%6Cice&x=1",
        ] {
            assert_eq!(read(spelling), Ok(Some("alice".into())), "{spelling}");
        }
        assert_eq!(read("username=ali+ce"), Ok(Some("ali ce".into())));
        assert_eq!(read("user%6Eame=bob"), Ok(Some("bob".into())));
        assert_eq!(
            read("username=decoy&password=x&user%6Eame=victim"),
            Err(RefusalKind::LoginUsernameAmbiguous)
        );
        assert_eq!(read("password=x"), Ok(None));
        assert_eq!(read(""), Ok(None));
    }
}
