//! YAML/JSON text and values to typed inputs, with the errors of [`crate::error`]: a syntax
//! error names its source, a field error names the dotted path serde reached. Plans, model
//! cards, hardware profiles and benchmark reports all parse through these two helpers, so
//! every input error reads the same way.

use crate::error::{FieldError, PlanError};

/// Parse a YAML (or JSON) text into a JSON value, with a syntax error naming the source.
pub fn parse_yaml_value(text: &str, source_name: &str) -> Result<serde_json::Value, PlanError> {
    serde_saphyr::from_str::<serde_json::Value>(text).map_err(|e| PlanError::Syntax {
        source_name: source_name.to_string(),
        message: one_line(&syntax_message(
            e.to_string().lines().next().unwrap_or_default(),
        )),
    })
}

/// The parser's first line in this crate's words: without its own `error: ` prefix (the
/// caller adds one), and a breached parser budget (nodes, aliases, depth: what anchors and
/// aliases expand to) said as what it is.
fn syntax_message(line: &str) -> String {
    let line = line.strip_prefix("error: ").unwrap_or(line);
    match line.split_once("budget breached: ") {
        Some((at, what)) => format!(
            "{at}more YAML than any plan or profile (anchors and aliases count each time they are used; the parser's budget: {what})"
        ),
        None => line.to_string(),
    }
}

/// Deserialize `value` into `T`, turning serde errors into a [`FieldError`] whose field is
/// `prefix` + the path serde reached.
pub fn from_value_at<T: serde::de::DeserializeOwned>(
    value: serde_json::Value,
    prefix: &str,
) -> Result<T, FieldError> {
    serde_path_to_error::deserialize::<_, T>(value).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." || path.is_empty() {
            prefix.to_string()
        } else if prefix.is_empty() {
            path
        } else {
            format!("{prefix}.{path}")
        };
        FieldError::new(field, one_line(&e.into_inner().to_string()))
    })
}

/// Most characters of an input value quoted in a message ([`quote`]).
const QUOTED_CHARS: usize = 64;

/// `value` quoted for a message (`"..."`, escapes as `{:?}`), cut after 64 characters.
pub fn quote(value: &str) -> String {
    if value.chars().nth(QUOTED_CHARS).is_none() {
        return format!("{value:?}");
    }
    let cut: String = value.chars().take(QUOTED_CHARS).collect();
    format!("{cut:?}... ({} characters)", value.chars().count())
}

/// Most characters of a message that quotes the input (serde's `unknown variant `...``).
const MESSAGE_CHARS: usize = 500;

/// A message on one line and at most [`MESSAGE_CHARS`] characters: errors quote what they
/// reject, and a rejected value may be 100,000 characters or hold newlines.
pub fn one_line(message: &str) -> String {
    let flat = message.replace(['\n', '\r'], " ");
    if flat.chars().nth(MESSAGE_CHARS).is_none() {
        return flat;
    }
    let cut: String = flat.chars().take(MESSAGE_CHARS).collect();
    format!("{cut}...")
}
