//! The outbound connection: a signed challenge, then a long `POST /v1/runner/connect`
//! whose answer streams the control plane's lines; heartbeats and results go back as short
//! requests with the connection's session token. Reconnects with exponential backoff
//! (0.5 s doubling to 30 s, with jitter); a revoked device stops for good.

use std::sync::Arc;
use std::time::Duration;

use ed25519_dalek::SigningKey;
use futures::StreamExt;
use mira_core::remote::{
    CONNECT_DOMAIN, ChallengeAnswer, ChallengeRequest, ConnectRequest, JobResult, ServerMessage, connect_message, sign,
};
use rand::RngExt;
use tokio_util::sync::CancellationToken;

use crate::runner::Runner;

/// Why a session ended.
#[derive(Debug)]
pub enum SessionEnd {
    /// The connection ended or failed; try again.
    Retry(String),
    /// The device was revoked (or its key is no longer accepted): stop.
    Refused(String),
}

/// The client of one runner.
pub struct Connector {
    /// The control plane's base URL.
    pub server: String,
    /// The device key.
    pub key: SigningKey,
    /// The runner.
    pub runner: Arc<Runner>,
    /// HTTP client.
    pub client: reqwest::Client,
    /// Set by a session that got its welcome (resets the backoff).
    reset: std::sync::atomic::AtomicBool,
    /// The session token of the newest connection that got its welcome: a result whose
    /// own session was refused meanwhile (the connection was replaced) goes again with it.
    current: std::sync::Mutex<Option<String>>,
}

async fn refusal(resp: reqwest::Response) -> SessionEnd {
    let status = resp.status();
    let body: serde_json::Value = resp.json().await.unwrap_or_default();
    let code = body["error"]["code"].as_str().unwrap_or("").to_owned();
    let message = format!("{status} {code}: {}", body["error"]["message"].as_str().unwrap_or(""));
    if code == "device_revoked" || code == "device_auth_failed" {
        SessionEnd::Refused(message)
    } else {
        SessionEnd::Retry(message)
    }
}

impl Connector {
    /// A connector for `runner` to `server`, authenticating with `key`.
    pub fn new(server: &str, key: SigningKey, runner: Arc<Runner>, client: reqwest::Client) -> Self {
        Self {
            server: server.to_owned(),
            key,
            runner,
            client,
            reset: std::sync::atomic::AtomicBool::new(false),
            current: std::sync::Mutex::new(None),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server.trim_end_matches('/'))
    }

    /// Connects and reconnects until the device is refused or `stop` is cancelled. Returns
    /// the refusal.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) -> Option<String> {
        let mut backoff = Duration::from_millis(500);
        loop {
            let end = tokio::select! {
                end = self.clone().session() => end,
                () = stop.cancelled() => return None,
            };
            // Terminal output waits for the next connection's bearer.
            if let Some(uplink) = self.runner.uplink() {
                uplink.set_session(None);
            }
            // The control plane forgot this connection's browser channels with it.
            if let Some(browser) = self.runner.browser() {
                browser.close_all("the connection to the control plane ended");
            }
            match end {
                SessionEnd::Refused(why) => return Some(why),
                SessionEnd::Retry(why) => {
                    let jitter = Duration::from_millis(rand::rng().random_range(0..250));
                    tracing::warn!(reason = %why, retry_in_ms = (backoff + jitter).as_millis() as u64, "disconnected");
                    tokio::select! {
                        () = tokio::time::sleep(backoff + jitter) => {}
                        () = stop.cancelled() => return None,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
            // A session that got as far as the welcome resets the backoff.
            if self.reset.swap(false, std::sync::atomic::Ordering::Relaxed) {
                backoff = Duration::from_millis(500);
            }
        }
    }

    async fn session(self: Arc<Self>) -> SessionEnd {
        let device_id = self.runner.device_id().to_owned();
        let retry = |e: reqwest::Error| SessionEnd::Retry(e.to_string());
        let resp = match self
            .client
            .post(self.url("/v1/runner/challenge"))
            .json(&ChallengeRequest { device_id: device_id.clone() })
            .send()
            .await
        {
            Ok(r) => r,
            Err(e) => return retry(e),
        };
        if !resp.status().is_success() {
            return refusal(resp).await;
        }
        let challenge: ChallengeAnswer = match resp.json().await {
            Ok(c) => c,
            Err(e) => return retry(e),
        };
        let signature = sign(&self.key, CONNECT_DOMAIN, &connect_message(&device_id, &challenge.challenge));
        let req = ConnectRequest {
            device_id: device_id.clone(),
            challenge: challenge.challenge,
            signature,
            advertised: self.runner.advertised(),
        };
        let resp = match self.client.post(self.url("/v1/runner/connect")).json(&req).send().await {
            Ok(r) => r,
            Err(e) => return retry(e),
        };
        if !resp.status().is_success() {
            return refusal(resp).await;
        }
        let mut body = resp.bytes_stream();
        let mut buf: Vec<u8> = Vec::new();
        let session_over = CancellationToken::new();
        let _over = session_over.clone().drop_guard();
        let mut session: Option<String> = None;
        let mut silence = Duration::from_secs(60);
        loop {
            while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=pos).collect();
                let message: ServerMessage = match serde_json::from_slice(&line) {
                    Ok(m) => m,
                    Err(e) => return SessionEnd::Retry(format!("an unreadable line from the server: {e}")),
                };
                match message {
                    ServerMessage::Welcome { session: token, lease_ms, heartbeat_ms } => {
                        tracing::info!(device = %device_id, lease_ms, "connected");
                        self.reset.store(true, std::sync::atomic::Ordering::Relaxed);
                        // The server pings every third of the lease: a whole lease of silence
                        // means the connection is dead.
                        silence = Duration::from_millis(lease_ms.max(1000));
                        session = Some(token.clone());
                        if let Some(uplink) = self.runner.uplink() {
                            uplink.set_session(Some(token.clone()));
                        }
                        if let Ok(mut current) = self.current.lock() {
                            *current = Some(token.clone());
                        }
                        tokio::spawn(self.clone().heartbeats(
                            token.clone(),
                            Duration::from_millis(heartbeat_ms.max(100)),
                            session_over.clone(),
                        ));
                        tokio::spawn(self.clone().deliver_undelivered(token));
                    }
                    ServerMessage::Ping => {}
                    ServerMessage::Cdp(frame) => match (self.runner.browser(), session.as_deref()) {
                        (Some(browser), Some(token)) => browser.handle(frame, token),
                        _ => tracing::warn!("a DevTools frame for a browser this runner does not attach; ignored"),
                    },
                    ServerMessage::Job(job) => {
                        let Some(token) = session.clone() else {
                            return SessionEnd::Retry("a job before the welcome".into());
                        };
                        let this = self.clone();
                        tokio::spawn(async move {
                            let result = this.runner.handle(&job).await;
                            this.send_result(&token, &result).await;
                        });
                    }
                }
            }
            let chunk = tokio::select! {
                c = body.next() => c,
                () = session_over.cancelled() => return SessionEnd::Retry("the session was refused".into()),
                () = tokio::time::sleep(silence) => return SessionEnd::Retry("the server went silent".into()),
            };
            match chunk {
                Some(Ok(bytes)) => buf.extend_from_slice(&bytes),
                Some(Err(e)) => return retry(e),
                None => return SessionEnd::Retry("the server closed the connection".into()),
            }
        }
    }

    async fn heartbeats(self: Arc<Self>, session: String, every: Duration, over: CancellationToken) {
        loop {
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = over.cancelled() => return,
            }
            match self.client.post(self.url("/v1/runner/heartbeat")).bearer_auth(&session).send().await {
                Ok(r) if r.status().is_success() => {}
                Ok(r) if r.status().is_client_error() => {
                    tracing::warn!(status = %r.status(), "heartbeat refused; reconnecting");
                    over.cancel();
                    return;
                }
                Ok(r) => tracing::warn!(status = %r.status(), "heartbeat failed"),
                Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
            }
        }
    }

    async fn deliver_undelivered(self: Arc<Self>, session: String) {
        match self.runner.journal().undelivered() {
            Ok(results) => {
                for mut r in results {
                    r.late = true;
                    self.send_result(&session, &r).await;
                }
            }
            Err(e) => tracing::error!(error = %e, "the journal cannot be read"),
        }
    }

    /// Sends a result; an execution's result is marked delivered in the journal once the
    /// control plane took it (otherwise it goes again on the next connection).
    /// A result produced while its connection was replaced (the session refused) goes once
    /// more with the newest connection's session, marked late.
    async fn send_result(&self, session: &str, result: &JobResult) {
        if self.post_result(session, result).await {
            return;
        }
        let newer = self.current.lock().ok().and_then(|c| c.clone()).filter(|c| c != session);
        if let Some(newer) = newer {
            let mut late = result.clone();
            late.late = true;
            self.post_result(&newer, &late).await;
        }
    }

    /// Posts one result; true when the control plane took it.
    async fn post_result(&self, session: &str, result: &JobResult) -> bool {
        let sent = self.client.post(self.url("/v1/runner/results")).bearer_auth(session).json(result).send().await;
        match sent {
            Ok(r) if r.status().is_success() => {
                if !result.invocation_id.is_empty()
                    && let Err(e) = self.runner.journal().delivered(&result.invocation_id)
                {
                    tracing::warn!(error = %e, "marking a result delivered failed");
                }
                true
            }
            Ok(r) => {
                tracing::warn!(status = %r.status(), invocation = %result.invocation_id, "result not taken; kept for the next connection");
                false
            }
            Err(e) => {
                tracing::warn!(error = %e, invocation = %result.invocation_id, "result not sent; kept for the next connection");
                false
            }
        }
    }
}
