//! The Streamable HTTP client of a connection, watched: every request and SSE stream goes
//! through reqwest exactly as rmcp's own client sends it ([`StreamableHttpClient`] for
//! `reqwest::Client`, with the same size limits), and every failure — a refused or reset
//! request, an SSE stream that ends in an error — is reported to the connection's supervisor
//! at once ([`super::connection`]), which checks the server with a `ping` and marks the
//! connection lost when that fails too. rmcp's transport itself keeps retrying a broken
//! stream and never ends on its own, so without this a dead HTTP server looked connected
//! until the next health check.

use std::collections::HashMap;
use std::sync::Arc;

use axum::http::{HeaderName, HeaderValue};
use futures::StreamExt;
use futures::stream::BoxStream;
use rmcp::model::ClientJsonRpcMessage;
use rmcp::transport::common::client_side_sse::BoxedSseResponse;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use tokio::sync::mpsc::UnboundedSender;

/// reqwest, with failures reported on `trouble` (one sentence each).
#[derive(Clone)]
pub struct WatchedClient {
    inner: reqwest::Client,
    trouble: UnboundedSender<String>,
}

impl WatchedClient {
    /// Wraps `inner`; failures go to `trouble`.
    pub fn new(inner: reqwest::Client, trouble: UnboundedSender<String>) -> Self {
        Self { inner, trouble }
    }

    fn report<T>(&self, what: &str, r: &Result<T, StreamableHttpError<reqwest::Error>>) {
        if let Err(e) = r
            && counts(e)
        {
            let _ = self.trouble.send(format!("{what} failed: {e}"));
        }
    }

    fn watch<T: Send + 'static, E: std::fmt::Display + Send + 'static>(
        &self,
        what: &'static str,
        stream: BoxStream<'static, Result<T, E>>,
    ) -> BoxStream<'static, Result<T, E>> {
        let trouble = self.trouble.clone();
        stream
            .inspect(move |item| {
                if let Err(e) = item {
                    let _ = trouble.send(format!("the {what} broke: {e}"));
                }
            })
            .boxed()
    }
}

/// Whether an error says something about the connection (not a protocol answer of a live
/// server such as an expired session, which rmcp handles itself).
fn counts(e: &StreamableHttpError<reqwest::Error>) -> bool {
    matches!(
        e,
        StreamableHttpError::Client(_)
            | StreamableHttpError::Io(_)
            | StreamableHttpError::Sse(_)
            | StreamableHttpError::UnexpectedEndOfStream
    )
}

impl StreamableHttpClient for WatchedClient {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let r = self.inner.post_message(uri, message, session_id, auth_header, custom_headers).await;
        self.report("a request", &r);
        r.map(|resp| self.watch_post(resp))
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let r = self
            .inner
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await;
        self.report("a request", &r);
        r.map(|resp| self.watch_post(resp))
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let r = self
            .inner
            .post_message_with_response_limits(uri, message, session_id, auth_header, custom_headers, limits)
            .await;
        self.report("a request", &r);
        r.map(|resp| self.watch_post(resp))
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        self.inner.delete_session(uri, session_id, auth_header, custom_headers).await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxedSseResponse, StreamableHttpError<Self::Error>> {
        let r = self.inner.get_stream(uri, session_id, last_event_id, auth_header, custom_headers).await;
        self.report("opening the event stream", &r);
        r.map(|s| self.watch("event stream", s))
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxedSseResponse, StreamableHttpError<Self::Error>> {
        let r = self
            .inner
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await;
        self.report("opening the event stream", &r);
        r.map(|s| self.watch("event stream", s))
    }
}

impl WatchedClient {
    fn watch_post(&self, resp: StreamableHttpPostResponse) -> StreamableHttpPostResponse {
        match resp {
            StreamableHttpPostResponse::Sse(stream, session) => {
                StreamableHttpPostResponse::Sse(self.watch("response stream", stream), session)
            }
            other => other,
        }
    }
}
