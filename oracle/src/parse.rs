//! YAML/JSON text and values to typed inputs, with the errors of [`crate::error`]: a syntax
//! error names its source, a field error names the dotted path serde reached. Plans, model
//! cards, hardware profiles and benchmark reports all parse through these two helpers, so
//! every input error reads the same way.

use crate::error::{FieldError, PlanError};

/// Parse a YAML (or JSON) text into a JSON value, with a syntax error naming the source.
pub fn parse_yaml_value(text: &str, source_name: &str) -> Result<serde_json::Value, PlanError> {
    serde_saphyr::from_str::<serde_json::Value>(text).map_err(|e| PlanError::Syntax {
        source_name: source_name.to_string(),
        message: e.to_string().lines().next().unwrap_or_default().to_string(),
    })
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
        FieldError::new(field, e.into_inner().to_string())
    })
}
