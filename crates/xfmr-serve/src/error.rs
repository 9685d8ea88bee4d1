//! Errors: the server's own ([`ServeError`]) and those answered to a client ([`ApiError`], in
//! OpenAI's error JSON), and the request-body extractor that turns bad bodies into the latter.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use thiserror::Error;

use crate::api::{ErrorBody, ErrorDetail};

/// What can go wrong starting a server.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {error}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// Why: in the message, and not also the error's `source()` (which a reporter such as
        /// anyhow's `{:#}` would print a second time).
        error: std::io::Error,
    },
    /// A model that the server cannot serve as given.
    #[error("model {model}: {problem}")]
    Model {
        /// Its name.
        model: String,
        /// What is wrong.
        problem: String,
    },
    /// Two models under one name.
    #[error("two models are named {0}: give them different names")]
    DuplicateName(String),
    /// The runtime's threads could not be started.
    #[error("starting the server: {0}")]
    Runtime(std::io::Error),
}

/// An error answered to a client: an HTTP status and OpenAI's error body,
/// `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, `rate_limit_error`, `server_error`...).
    pub kind: &'static str,
    /// The request field at fault, as a path (`messages[0].content`), when one is.
    pub param: Option<String>,
    /// A machine-readable code (`model_not_found`, `context_length_exceeded`...).
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400: a request the server understood but cannot accept; `param` names the field.
    pub fn invalid(param: Option<&str>, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code: None,
        }
    }

    /// The same error with a machine-readable code.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// 404: no loaded model of that name serves this endpoint.
    pub fn model_not_found(model: &str, endpoint: &str, loaded: &[String]) -> Self {
        let loaded = match loaded.is_empty() {
            true => "none is loaded (see `xfmr serve --help`)".to_string(),
            false => format!("loaded: {}", loaded.join(", ")),
        };
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!("the model `{model}` does not exist for {endpoint}; {loaded}"),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        }
    }

    /// 404 for a path the server does not have.
    pub fn no_route(method: &str, path: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!("no endpoint {method} {path} (see GET /v1/models and the README)"),
            kind: "invalid_request_error",
            param: None,
            code: Some("unknown_url"),
        }
    }

    /// 405 for a path the server has, asked with another method.
    pub fn wrong_method(method: &str, path: &str) -> Self {
        Self {
            status: StatusCode::METHOD_NOT_ALLOWED,
            message: format!("{path} does not take {method} (see the README's endpoint table)"),
            kind: "invalid_request_error",
            param: None,
            code: Some("method_not_allowed"),
        }
    }

    /// 429: every slot and every place in the queue is taken.
    pub fn busy(what: &str, limit: usize) -> Self {
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!(
                "too many concurrent requests: {what} holds {limit} already; retry shortly"
            ),
            kind: "rate_limit_error",
            param: None,
            code: Some("rate_limit_exceeded"),
        }
    }

    /// 413: the body is over the size limit.
    pub fn too_large(limit: usize) -> Self {
        Self {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("the request body is over the limit of {limit} bytes"),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_too_large"),
        }
    }

    /// 403: the request's `Host` or `Origin` is not one the server answers (DNS rebinding, a
    /// cross-site page).
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::FORBIDDEN,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("forbidden"),
        }
    }

    /// 414: the request target is `len` bytes, over `limit`.
    pub fn uri_too_long(len: usize, limit: usize) -> Self {
        Self {
            status: StatusCode::URI_TOO_LONG,
            message: format!("the request target is {len} bytes, over the limit of {limit}"),
            kind: "invalid_request_error",
            param: None,
            code: Some("uri_too_long"),
        }
    }

    /// 431: the request's headers are `len` bytes, over `limit`.
    pub fn headers_too_large(len: usize, limit: usize) -> Self {
        Self {
            status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            message: format!("the request's headers are {len} bytes, over the limit of {limit}"),
            kind: "invalid_request_error",
            param: None,
            code: Some("headers_too_large"),
        }
    }

    /// 431 from the HTTP parser: a head over its buffer or with too many headers.
    pub(crate) fn headers_too_large_parser() -> Self {
        Self {
            message: "the request's head is over the HTTP parser's buffer (about 400 KiB) or has \
                      over 100 headers"
                .into(),
            ..Self::headers_too_large(0, 0)
        }
    }

    /// 415: a POST body that is not declared `application/json` (`content_type` as sent).
    pub fn unsupported_media_type(content_type: Option<&str>) -> Self {
        Self {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            message: format!(
                "the body must be sent as Content-Type: application/json, not {}",
                content_type.map_or("(none)".to_string(), |c| format!("{c:?}"))
            ),
            kind: "invalid_request_error",
            param: None,
            code: Some("unsupported_media_type"),
        }
    }

    /// 408: the client stopped sending its request.
    pub fn slow_client(timeout: Duration) -> Self {
        Self {
            status: StatusCode::REQUEST_TIMEOUT,
            message: format!(
                "the request body did not arrive within {} s",
                timeout.as_secs_f64()
            ),
            kind: "invalid_request_error",
            param: None,
            code: Some("timeout"),
        }
    }

    /// 504: the work took longer than the request timeout.
    pub fn timeout(timeout: Duration) -> Self {
        Self {
            status: StatusCode::GATEWAY_TIMEOUT,
            message: format!(
                "the request took longer than the server's limit of {} s",
                timeout.as_secs_f64()
            ),
            kind: "server_error",
            param: None,
            code: Some("timeout"),
        }
    }

    /// 500: the model failed (its error as text); the server goes on.
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    /// The error body, `{"error": {...}}`.
    pub fn body(&self) -> serde_json::Value {
        // A struct of strings always converts.
        serde_json::to_value(self.error_body()).unwrap_or_default()
    }

    /// The error body, typed.
    pub(crate) fn error_body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                code: self.code.map(str::to_string),
                message: self.message.clone(),
                param: self.param.clone(),
                kind: self.kind.to_string(),
            },
        }
    }
}

/// Seconds a client refused for load (429) is told to wait before retrying (`Retry-After`):
/// one second, a few decoding steps of a full batch.
pub(crate) const RETRY_AFTER_SECONDS: u64 = 1;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.error_body())).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(RETRY_AFTER_SECONDS),
            );
        }
        response
    }
}

/// Limits the body extractor reads from the router's state.
pub(crate) trait BodyLimits {
    /// Largest body accepted, in bytes.
    fn body_limit(&self) -> usize;
    /// How long a body may take to arrive.
    fn idle_timeout(&self) -> Duration;
}

/// A JSON request body of type `T`: over the size limit a 413, slow a 408, malformed a 400 that
/// says where, a field of the wrong type a 400 naming the field, all in OpenAI's error JSON.
pub(crate) struct JsonBody<T>(pub T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    S: BodyLimits + Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let (limit, idle) = (state.body_limit(), state.idle_timeout());
        let bytes = match tokio::time::timeout(idle, Bytes::from_request(req, state)).await {
            Err(_) => return Err(ApiError::slow_client(idle)),
            Ok(Err(rejection)) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                return Err(ApiError::too_large(limit))
            }
            Ok(Err(rejection)) => return Err(ApiError::invalid(None, rejection.body_text())),
            Ok(Ok(bytes)) => bytes,
        };
        parse_json(&bytes).map(JsonBody)
    }
}

/// `T` from JSON bytes, errors naming the field (path) where there is one.
pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            return ApiError::invalid(None, format!("the body is not valid JSON: {inner}"));
        }
        // A missing field is reported at its parent; name the field itself.
        let message = inner.to_string();
        let missing = message
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split_once('`'))
            .map(|(field, _)| field.to_string());
        let param = match (missing, path.as_str()) {
            (Some(field), ".") => field,
            (Some(field), parent) => format!("{parent}.{field}"),
            (None, path) => path.to_string(),
        };
        ApiError::invalid(Some(&param), format!("{param}: {message}"))
    })?;
    de.end()
        .map_err(|e| ApiError::invalid(None, format!("the body is not valid JSON: {e}")))?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::ServeError;

    /// An address already taken: the OS's reason once, in the message, and no `source()` for a
    /// reporter to print a second time.
    #[test]
    fn bind_error_says_the_os_reason_once() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap().to_string();
        let err = std::net::TcpListener::bind(&addr)
            .map_err(|error| ServeError::Bind {
                addr: addr.clone(),
                error,
            })
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("cannot listen on {addr}: ")),
            "{text}"
        );
        assert_eq!(text.matches("os error").count(), 1, "{text}");
        assert!(std::error::Error::source(&err).is_none());
    }
}
