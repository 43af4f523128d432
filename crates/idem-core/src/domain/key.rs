//! The `Idempotency-Key` header value.
//!
//! Two spellings name the same key: the IETF draft's Structured Field string
//! (`"5b0e..."`, with `\"` and `\\` escapes) and Stripe's bare value (`5b0e...`).
//! After unquoting, a key is 1..=255 visible ASCII characters.

use utoipa::openapi::{ObjectBuilder, OneOfBuilder, RefOr, Schema, Type};
use utoipa::{PartialSchema, ToSchema};

/// The longest key accepted, per the contract (Stripe uses the same bound).
pub const MAX_KEY_LEN: usize = 255;

/// A valid idempotency key, unquoted.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

/// Why a header value is not a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the Idempotency-Key header was sent more than once")]
    Repeated,
    #[error("the Idempotency-Key is empty")]
    Empty,
    #[error("the Idempotency-Key is longer than {MAX_KEY_LEN} characters")]
    TooLong,
    #[error("the Idempotency-Key must be visible ASCII only")]
    NotVisibleAscii,
    #[error("the Idempotency-Key is not a well-formed quoted string")]
    BadQuoting,
}

impl IdempotencyKey {
    /// Parses a header's raw bytes in either form.
    pub fn parse(raw: &[u8]) -> Result<Self, KeyError> {
        let raw = trim_ows(raw);
        let key = match raw.first() {
            Some(b'"') => unquote_sf_string(raw)?,
            _ => raw.to_vec(),
        };
        Self::checked(key)
    }

    /// A key already unquoted, as the store keeps it. Checked like a parsed
    /// one, but never read as a header value: the stored `"k` is the key `"k`
    /// (sent as `"\"k"`), not a broken quoted string.
    pub fn from_unquoted(key: &str) -> Result<Self, KeyError> {
        Self::checked(key.as_bytes().to_vec())
    }

    fn checked(key: Vec<u8>) -> Result<Self, KeyError> {
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if !key.iter().all(|b| (0x21..=0x7e).contains(b)) {
            return Err(KeyError::NotVisibleAscii);
        }
        if key.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong);
        }
        // Checked above: visible ASCII is valid UTF-8.
        String::from_utf8(key)
            .map(Self)
            .map_err(|_| KeyError::NotVisibleAscii)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn trim_ows(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// RFC 8941 §4.2.5: a string is `"` chars `"`, where only `\"` and `\\` escape.
/// Parameters after the closing quote are not part of this header's grammar.
fn unquote_sf_string(raw: &[u8]) -> Result<Vec<u8>, KeyError> {
    let mut out = Vec::with_capacity(raw.len());
    let mut bytes = raw[1..].iter();
    loop {
        match bytes.next() {
            None => return Err(KeyError::BadQuoting),
            Some(b'"') => break,
            Some(b'\\') => match bytes.next() {
                Some(&c @ (b'"' | b'\\')) => out.push(c),
                _ => return Err(KeyError::BadQuoting),
            },
            Some(&c) if (0x20..=0x7e).contains(&c) => out.push(c),
            Some(_) => return Err(KeyError::NotVisibleAscii),
        }
    }
    if bytes.next().is_some() {
        return Err(KeyError::BadQuoting);
    }
    Ok(out)
}

/// The header's two accepted spellings, as [`IdempotencyKey::parse`] reads them.
/// A value that starts with `"` is always read as the quoted form.
impl PartialSchema for IdempotencyKey {
    fn schema() -> RefOr<Schema> {
        let bare = ObjectBuilder::new()
            .schema_type(Type::String)
            .title(Some("bare token"))
            .description(Some(
                "Stripe's form: the key itself, visible ASCII, not starting with a double quote.",
            ))
            .pattern(Some(format!("^[!#-~][!-~]{{0,{}}}$", MAX_KEY_LEN - 1)))
            .examples(["5b0e7a52-3f1c-4d7e-9a61-2c8f0d4e7b13"]);
        let quoted = ObjectBuilder::new()
            .schema_type(Type::String)
            .title(Some("sf-string"))
            .description(Some(
                "The IETF form: an RFC 8941 Structured Field string, in double quotes, \
                 where only \\\" and \\\\ are escapes. The key inside is visible ASCII.",
            ))
            .pattern(Some(format!(
                r#"^"(?:[!#-\[\]-~]|\\["\\]){{1,{MAX_KEY_LEN}}}"$"#
            )))
            .examples(["\"5b0e7a52-3f1c-4d7e-9a61-2c8f0d4e7b13\""]);
        OneOfBuilder::new()
            .item(bare)
            .item(quoted)
            .description(Some(format!(
                "1 to {MAX_KEY_LEN} visible ASCII characters after unquoting; both forms name the same key."
            )))
            .into()
    }
}
impl ToSchema for IdempotencyKey {}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: &str = "5b0e7a52-3f1c-4d7e-9a61-2c8f0d4e7b13";

    #[test]
    fn both_forms_name_the_same_key() {
        let bare = IdempotencyKey::parse(UUID.as_bytes()).unwrap();
        let quoted = IdempotencyKey::parse(format!("\"{UUID}\"").as_bytes()).unwrap();
        assert_eq!(bare, quoted);
        assert_eq!(bare.as_str(), UUID);
    }

    #[test]
    fn an_unquoted_key_is_taken_as_it_is() {
        for header in [r#""\"k""#, r#""\"k\"""#, "plain", r#""a\\b""#] {
            let key = IdempotencyKey::parse(header.as_bytes()).unwrap();
            assert_eq!(IdempotencyKey::from_unquoted(key.as_str()), Ok(key));
        }
        assert_eq!(IdempotencyKey::from_unquoted(""), Err(KeyError::Empty));
        assert_eq!(
            IdempotencyKey::from_unquoted("a b"),
            Err(KeyError::NotVisibleAscii)
        );
    }

    #[test]
    fn escapes_are_unquoted() {
        let k = IdempotencyKey::parse(br#""a\"b\\c""#).unwrap();
        assert_eq!(k.as_str(), r#"a"b\c"#);
    }

    #[test]
    fn length_bounds_apply_after_unquoting() {
        let max = "k".repeat(MAX_KEY_LEN);
        assert!(IdempotencyKey::parse(max.as_bytes()).is_ok());
        assert!(IdempotencyKey::parse(format!("\"{max}\"").as_bytes()).is_ok());
        let long = "k".repeat(MAX_KEY_LEN + 1);
        assert_eq!(
            IdempotencyKey::parse(long.as_bytes()),
            Err(KeyError::TooLong)
        );
        assert_eq!(IdempotencyKey::parse(b"\"\""), Err(KeyError::Empty));
        assert_eq!(IdempotencyKey::parse(b""), Err(KeyError::Empty));
    }

    #[test]
    fn malformed_values_are_refused() {
        let cases: [(&[u8], KeyError); 7] = [
            (b"\"open", KeyError::BadQuoting),
            (b"\"a\";p=1", KeyError::BadQuoting),
            (b"\"a\\n\"", KeyError::BadQuoting),
            (b"has space", KeyError::NotVisibleAscii),
            (b"\"has space\"", KeyError::NotVisibleAscii),
            ("ch\u{e1}ve".as_bytes(), KeyError::NotVisibleAscii),
            (b"tab\there", KeyError::NotVisibleAscii),
        ];
        for (raw, want) in cases {
            assert_eq!(IdempotencyKey::parse(raw), Err(want), "{raw:?}");
        }
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    /// The IETF form of a key: quoted, with `"` and `\` escaped.
    fn quote(key: &str) -> String {
        format!("\"{}\"", key.replace('\\', "\\\\").replace('"', "\\\""))
    }

    proptest! {
        #[test]
        fn both_forms_of_any_valid_key_parse_to_it(key in "[!-~]{1,255}") {
            let bare = IdempotencyKey::parse(key.as_bytes());
            let quoted = IdempotencyKey::parse(quote(&key).as_bytes());
            // A bare value that starts with a quote is read as the quoted form.
            if !key.starts_with('"') {
                prop_assert_eq!(bare.as_ref().map(|k| k.as_str()), Ok(key.as_str()));
            }
            prop_assert_eq!(quoted.map(|k| k.as_str().to_owned()), Ok(key));
        }

        #[test]
        fn a_key_with_any_invisible_or_non_ascii_char_is_refused(
            head in "[!-~]{0,20}", bad in "[^!-~]", tail in "[!-~]{0,20}"
        ) {
            let key = format!("{head}{bad}{tail}");
            // A blank at either end is HTTP whitespace, trimmed before parsing.
            let blank = bad == " " || bad == "\t";
            prop_assume!(!blank || (!head.is_empty() && !tail.is_empty()));
            prop_assert!(IdempotencyKey::parse(key.as_bytes()).is_err());
        }

        #[test]
        fn keys_over_255_are_refused(key in "[!-~]{256,300}") {
            prop_assume!(!key.starts_with('"'));
            prop_assert_eq!(IdempotencyKey::parse(key.as_bytes()), Err(KeyError::TooLong));
        }
    }
}
