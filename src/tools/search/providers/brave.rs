//! The Brave Search API: `GET {base}/res/v1/web/search` with `X-Subscription-Token`.
//! `count` ≤ 20, freshness `pd|pw|pm|py`, `search_lang`, a site restriction is the `site:`
//! operator. The answer is `{type: "search", query: {…}, web: {results: [{title, url,
//! description, page_age, age, …}]}, …}` (`web` is absent when nothing matched); errors are
//! `{type: "ErrorResponse", error: {id, status, code, detail, meta}}` — an invalid token is
//! 422 `SUBSCRIPTION_TOKEN_INVALID`, rate limits are 429 `RATE_LIMITED` with
//! `X-RateLimit-Reset`.

use std::time::Duration;

use serde::Deserialize;

use super::{Answer, Endpoint, Freshness, ParseError, WebQuery, clean};

/// The request.
pub fn request(client: &reqwest::Client, ep: &Endpoint<'_>, q: &WebQuery) -> reqwest::RequestBuilder {
    let query = match &q.site {
        Some(site) => format!("{} site:{site}", q.query),
        None => q.query.clone(),
    };
    let mut params: Vec<(&str, String)> =
        vec![("q", query), ("count", q.count.to_string()), ("text_decorations", "false".into())];
    if let Some(f) = q.freshness {
        let code = match f {
            Freshness::Day => "pd",
            Freshness::Week => "pw",
            Freshness::Month => "pm",
            Freshness::Year => "py",
        };
        params.push(("freshness", code.into()));
    }
    if let Some(lang) = &q.language {
        params.push(("search_lang", lang.to_lowercase()));
    }
    let req =
        client.get(format!("{}/res/v1/web/search", ep.base_url)).query(&params).header("accept", "application/json");
    match ep.key {
        Some(key) => req.header("x-subscription-token", key.expose()),
        None => req,
    }
}

#[derive(Deserialize)]
struct Response {
    #[serde(rename = "type")]
    kind: String,
    web: Option<Web>,
}

#[derive(Deserialize)]
struct Web {
    #[serde(default)]
    results: Vec<Item>,
}

#[derive(Deserialize)]
struct Item {
    url: String,
    #[serde(default)]
    title: String,
    #[serde(default)]
    description: String,
    page_age: Option<String>,
}

/// Parses a 2xx body.
pub fn parse(body: &[u8], q: &WebQuery) -> Result<Answer, ParseError> {
    let resp: Response = serde_json::from_slice(body)?;
    if resp.kind != "search" {
        return Err(ParseError::NotSearch(resp.kind));
    }
    let mut answer = Answer::default();
    for item in resp.web.map(|w| w.results).unwrap_or_default() {
        if let Some(r) = clean(&item.url, &item.title, &item.description, item.page_age.as_deref()) {
            answer.results.push(r);
        }
        if answer.results.len() >= q.count {
            break;
        }
    }
    Ok(answer)
}

#[derive(Deserialize)]
struct ErrorResponse {
    error: ErrorBody,
}

#[derive(Deserialize)]
struct ErrorBody {
    code: Option<String>,
    detail: Option<String>,
}

/// `error.code: error.detail` of an `ErrorResponse`.
pub fn error_message(body: &[u8]) -> Option<String> {
    let e: ErrorResponse = serde_json::from_slice(body).ok()?;
    match (e.error.code, e.error.detail) {
        (Some(code), Some(detail)) => Some(format!("{code}: {detail}")),
        (None, Some(detail)) => Some(detail),
        (Some(code), None) => Some(code),
        (None, None) => None,
    }
}

/// The first (per-second) window of `X-RateLimit-Reset: 1, 1419704`.
pub fn reset_hint(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let v = headers.get("x-ratelimit-reset")?.to_str().ok()?;
    v.split(',').next()?.trim().parse::<u64>().ok().map(Duration::from_secs)
}
