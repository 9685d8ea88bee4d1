//! HTTP: the router (every endpoint, the body limit, OpenAI's error JSON for unknown paths and
//! methods), the page, and the loop that accepts connections and serves each with hyper's
//! HTTP/1 under the header-read timeout.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::http::{header, Method, Uri};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use burn::tensor::backend::Backend;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::watch;

use crate::error::{ApiError, BodyLimits};
use crate::handlers::{attention, chat, completions, embeddings, models, translations};
use crate::AppState;

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
        .with_state(state)
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::no_route(method.as_str(), uri.path())
}

async fn wrong_method(method: Method, uri: Uri) -> ApiError {
    ApiError::wrong_method(method.as_str(), uri.path())
}

async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Html(PAGE),
    )
        .into_response()
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
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
