//! The endpoints' handlers: each request body checked field by field (an error names the
//! field), the work handed to the decoding engine or the encoder models' thread, the answer
//! one of [`api`](crate::api)'s types.

pub(crate) mod attention;
pub(crate) mod chat;
pub(crate) mod completions;
pub(crate) mod embeddings;
mod generate;
pub(crate) mod models;
pub(crate) mod translations;

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;

use crate::error::ApiError;

/// The `model` field: a loaded model of the endpoint's kind (the only one when absent).
fn pick_model<'a>(
    asked: Option<&str>,
    available: Option<&'a str>,
    endpoint: &str,
    all: &[String],
) -> Result<&'a str, ApiError> {
    match (asked, available) {
        (None, Some(name)) => Ok(name),
        (Some(asked), Some(name)) if asked == name => Ok(name),
        (asked, _) => Err(ApiError::model_not_found(
            asked.unwrap_or("(none given)"),
            endpoint,
            all,
        )),
    }
}

/// A string or an array of strings (`input`, `prompt`, `stop`), at most `max` of them.
fn strings(param: &str, value: &Value, max: usize) -> Result<Vec<String>, ApiError> {
    let list = match value {
        Value::String(s) => vec![s.clone()],
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(ApiError::invalid(
                    Some(&format!("{param}[{i}]")),
                    format!("{param}[{i}]: expected a string, got {}", kind_of(other)),
                )),
            })
            .collect::<Result<_, _>>()?,
        other => {
            return Err(ApiError::invalid(
                Some(param),
                format!(
                    "{param}: expected a string or an array of strings, got {}",
                    kind_of(other)
                ),
            ))
        }
    };
    if list.is_empty() {
        return Err(ApiError::invalid(Some(param), format!("{param} is empty")));
    }
    if list.len() > max {
        return Err(ApiError::invalid(
            Some(param),
            format!("{param}: {} items, at most {max}", list.len()),
        ));
    }
    Ok(list)
}

/// A JSON value's kind, for error messages.
fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A request's id: `prefix-N`, N counting requests since the start.
pub(crate) fn request_id(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("{prefix}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}
