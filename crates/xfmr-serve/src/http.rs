//! HTTP: the router (every endpoint, the body limit, OpenAI's error JSON for unknown paths and
//! methods), the checks every request passes first ([`guard`]: `Host` and `Origin`, sizes,
//! `Content-Type`, admission by body bytes, the log line), the page, and the loop that accepts
//! connections and serves each with hyper's HTTP/1 under the header-read timeout, its own
//! parse-error answers given OpenAI's error JSON ([`JsonParseErrors`]).

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use base64::Engine as _;
use burn::tensor::backend::Backend;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::error::{ApiError, BodyLimits};
use crate::handlers::{attention, chat, completions, embeddings, models, translations};
use crate::{AppState, ServeConfig};

// hyper's parse-error answers given OpenAI's error JSON.
mod parse_errors;

use parse_errors::JsonParseErrors;

/// Longest request target (path and query) answered; beyond it a 414 in OpenAI's error JSON.
/// 8 KiB, nginx's default line buffer: no endpoint takes a query, and the longest path is a
/// model's name. hyper refuses targets over 65,534 bytes itself (then [`JsonParseErrors`]
/// gives its 414 the JSON body).
pub(crate) const MAX_URI_BYTES: usize = 8 << 10;
/// Most bytes of request headers (names, values and their separators) answered; beyond it a
/// 431 in OpenAI's error JSON. 32 KiB: four times the largest header section that browsers and
/// the `openai` clients send with a long `Authorization`. hyper refuses a head over its read
/// buffer (about 400 KiB) or with over 100 headers itself (431, given JSON by
/// [`JsonParseErrors`]).
pub(crate) const MAX_HEADER_BYTES: usize = 32 << 10;

/// Tokens a request used, when its handler knows them, for the log line: the handlers put it
/// in their response's extensions.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Tokens {
    /// Prompt (or input) tokens.
    pub prompt: Option<usize>,
    /// Tokens generated.
    pub completion: Option<usize>,
}

/// The page (playground and attention explorer), compiled in.
const PAGE: &str = include_str!("page.html");

impl<B: Backend> BodyLimits for Arc<AppState<B>> {
    fn body_limit(&self) -> usize {
        self.config.body_limit
    }

    fn idle_timeout(&self) -> Duration {
        self.config.idle_timeout
    }
}

/// Every endpoint, the body limit, and JSON errors for unknown paths and methods.
pub(crate) fn router<B: Backend>(state: Arc<AppState<B>>) -> Router {
    let limit = state.config.body_limit;
    Router::new()
        .route("/", get(page))
        .route("/health", get(models::health::<B>))
        .route("/v1/models", get(models::models::<B>))
        .route("/v1/models/{id}", get(models::model::<B>))
        .route("/v1/chat/completions", post(chat::chat::<B>))
        .route("/v1/completions", post(completions::completions::<B>))
        .route("/v1/embeddings", post(embeddings::embeddings::<B>))
        .route("/v1/translations", post(translations::translations::<B>))
        .route("/v1/attention", post(attention::attention::<B>))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            guard::<B>,
        ))
        .with_state(state)
}

/// What every request passes before its handler, in order: `Host` (403), `Origin` (403), the
/// target's length (414), the headers' size (431), a POST's `Content-Type` (415) and declared
/// length (413, before hyper would send `100 Continue`), then a share of
/// [`ServeConfig::max_body_bytes_in_flight`] held until the handler answers (a 429 after
/// `idle_timeout` without one). Every response gets `X-Content-Type-Options: nosniff`, and
/// with [`ServeConfig::log_requests`] a line on stderr.
async fn guard<B: Backend>(
    State(state): State<Arc<AppState<B>>>,
    req: Request,
    next: Next,
) -> Response {
    let start = Instant::now();
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let mut response = match admit(&state, req, next).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    };
    response.headers_mut().insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if state.config.log_requests {
        let tokens = response
            .extensions()
            .get::<Tokens>()
            .copied()
            .unwrap_or_default();
        eprintln!(
            "{}",
            log_line(&method, &path, response.status(), tokens, start.elapsed())
        );
    }
    response
}

/// The request's checks and admission, then its handler.
async fn admit<B: Backend>(
    state: &AppState<B>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let config = &state.config;
    let headers = req.headers();
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    if let Some(host) = host.filter(|h| !host_allowed(h, state.bound, config)) {
        return Err(ApiError::forbidden(format!(
            "Host {host:?} is not one this server answers (a DNS-rebinding page?); list it \
             in the server's allowed hosts to accept it"
        )));
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("(not text)");
        if !origin_allowed(origin, host, config) {
            return Err(ApiError::forbidden(format!(
                "requests from the web page at {origin:?} are refused (not this server's own \
                 origin); list it in the server's allowed origins to accept them"
            )));
        }
    }
    let target = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if target > MAX_URI_BYTES {
        return Err(ApiError::uri_too_long(target, MAX_URI_BYTES));
    }
    let header_bytes = header_bytes(headers);
    if header_bytes > MAX_HEADER_BYTES {
        return Err(ApiError::headers_too_large(header_bytes, MAX_HEADER_BYTES));
    }
    if req.method() != Method::POST {
        return Ok(next.run(req).await);
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    if !content_type.is_some_and(is_json) {
        return Err(ApiError::unsupported_media_type(content_type));
    }
    let declared = match headers.get(header::CONTENT_LENGTH) {
        Some(v) => v.to_str().ok().and_then(|v| v.trim().parse::<u64>().ok()),
        None => None,
    };
    if declared.is_some_and(|n| n > config.body_limit as u64) {
        return Err(ApiError::too_large(config.body_limit));
    }
    // A body of unknown length (chunked) may be as long as the limit.
    let bytes = declared.map_or(config.body_limit, |n| n as usize);
    // The semaphore holds at most `u32::MAX` permits (lib.rs caps it there too).
    let bytes = (bytes.min(config.body_limit).min(u32::MAX as usize) as u32).max(1);
    let permit = tokio::time::timeout(
        config.idle_timeout,
        Arc::clone(&state.admission).acquire_many_owned(bytes),
    )
    .await;
    let permit = match permit {
        Ok(Ok(permit)) => permit,
        _ => {
            return Err(ApiError::busy(
                "request bodies being read and tokenised",
                config.max_body_bytes_in_flight.max(config.body_limit),
            ))
        }
    };
    let response = next.run(req).await;
    drop(permit);
    Ok(response)
}

/// The request's log line: method, path, status, tokens where known, milliseconds.
pub(crate) fn log_line(
    method: &Method,
    path: &str,
    status: StatusCode,
    tokens: Tokens,
    elapsed: Duration,
) -> String {
    let count = |n: Option<usize>| n.map_or("-".to_string(), |n| n.to_string());
    format!(
        "xfmr serve: {method} {path} {} prompt_tokens={} completion_tokens={} {} ms",
        status.as_u16(),
        count(tokens.prompt),
        count(tokens.completion),
        elapsed.as_millis()
    )
}

/// Bytes of a request's header section as sent: `name: value\r\n` each.
fn header_bytes(headers: &HeaderMap) -> usize {
    headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum()
}

/// `application/json`, with or without parameters (`; charset=utf-8`).
fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/json")
}

/// The host name of a `Host` value (or of an origin without its scheme): the port removed,
/// an IPv6 address without its brackets, lower case.
fn host_name(host: &str) -> String {
    let host = host.trim();
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(rest),
        None => match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        },
    };
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// Whether a host name is this machine's loopback: `localhost`, `*.localhost`, `127.0.0.0/8`,
/// `::1`.
fn is_loopback(name: &str) -> bool {
    name == "localhost"
        || name.ends_with(".localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Whether the server answers a request sent to `host` (its `Host` header). Loopback names
/// and addresses, the bound address and [`ServeConfig::allowed_hosts`] always; any other only
/// while the server is bound to a non-loopback address and no list is set (as Ollama: a
/// server on the network is reached by names the server cannot know).
pub(crate) fn host_allowed(host: &str, bound: SocketAddr, config: &ServeConfig) -> bool {
    let name = host_name(host);
    let listed = config
        .allowed_hosts
        .iter()
        .any(|h| h.eq_ignore_ascii_case(host.trim()) || host_name(h) == name);
    listed
        || is_loopback(&name)
        || name.parse::<IpAddr>().is_ok_and(|ip| ip == bound.ip())
        || (!bound.ip().is_loopback() && config.allowed_hosts.is_empty())
}

/// Whether a browser page at `origin` may call the server: its own origin (the `Host` the
/// request was sent to), a loopback one (another local tool's page), or one of
/// [`ServeConfig::allowed_origins`] (`*`: any).
pub(crate) fn origin_allowed(origin: &str, host: Option<&str>, config: &ServeConfig) -> bool {
    let origin = origin.trim().trim_end_matches('/');
    if config
        .allowed_origins
        .iter()
        .any(|o| o == "*" || o.trim_end_matches('/').eq_ignore_ascii_case(origin))
    {
        return true;
    }
    let Some(authority) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false; // `null` (a sandboxed or file page) and other schemes
    };
    host.is_some_and(|h| h.trim().eq_ignore_ascii_case(authority))
        || is_loopback(&host_name(authority))
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::no_route(method.as_str(), uri.path())
}

async fn wrong_method(method: Method, uri: Uri) -> ApiError {
    ApiError::wrong_method(method.as_str(), uri.path())
}

/// The page's `Content-Security-Policy`: its one inline script by hash, inline styles (it
/// colours cells with `style` attributes), requests to this server only, nothing else loaded,
/// no framing, no forms, no `<base>`.
pub(crate) fn page_csp() -> &'static str {
    static CSP: OnceLock<String> = OnceLock::new();
    CSP.get_or_init(|| {
        let script = PAGE
            .split_once("<script>")
            .and_then(|(_, rest)| rest.split_once("</script>"))
            .map_or("", |(script, _)| script);
        let hash = base64::engine::general_purpose::STANDARD.encode(Sha256::digest(script));
        format!(
            "default-src 'none'; script-src 'sha256-{hash}'; style-src 'unsafe-inline'; \
             connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
             frame-ancestors 'none'"
        )
    })
}

async fn page() -> Response {
    let mut response = (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Html(PAGE),
    )
        .into_response();
    if let Ok(csp) = HeaderValue::from_str(page_csp()) {
        response
            .headers_mut()
            .insert(header::CONTENT_SECURITY_POLICY, csp);
    }
    response
}

/// Accepts connections until `shutdown` turns true: each served by hyper's HTTP/1 with the
/// header-read timeout (idle keep-alive connections are closed after it).
pub(crate) async fn accept_loop(
    listener: tokio::net::TcpListener,
    app: Router,
    idle: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                // Out of descriptors and the like: wait a little, keep serving.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        let service = TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(idle)
                .serve_connection(JsonParseErrors::new(TokioIo::new(stream)), service)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_origins() {
        let config = ServeConfig::default();
        let local: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        for host in [
            "127.0.0.1:8080",
            "localhost:8080",
            "[::1]:8080",
            "LOCALHOST",
            "a.localhost",
        ] {
            assert!(host_allowed(host, local, &config), "{host}");
        }
        for host in [
            "evil.example:8080",
            "192.168.1.5:8080",
            "127.0.0.1.evil.example",
        ] {
            assert!(!host_allowed(host, local, &config), "{host}");
        }
        let lan: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        assert!(host_allowed("box.lan:8080", lan, &config));
        let listed = ServeConfig {
            allowed_hosts: vec!["box.lan".into()],
            ..ServeConfig::default()
        };
        assert!(host_allowed("box.lan:8080", lan, &listed));
        assert!(!host_allowed("other.lan:8080", lan, &listed));
        let host = Some("127.0.0.1:8080");
        assert!(origin_allowed("http://127.0.0.1:8080", host, &config));
        assert!(origin_allowed("http://localhost:3000", host, &config));
        assert!(!origin_allowed("https://evil.example", host, &config));
        assert!(!origin_allowed("null", host, &config));
        let listed = ServeConfig {
            allowed_origins: vec!["https://app.example".into()],
            ..ServeConfig::default()
        };
        assert!(origin_allowed("https://app.example", host, &listed));
    }
}
