//! The Tavily API: `POST {base}/search` with `Authorization: Bearer <key>` and a JSON body
//! `{query, max_results ≤ 20, topic, search_depth, time_range, include_domains}`. The
//! answer is `{query, answer, results: [{title, url, content, score, published_date?}],
//! response_time}`; errors are `{detail: {error: "…"}}` (401 bad key, 429 rate limit,
//! 432/433 plan or pay-as-you-go limit). Tavily has no language filter: a `language` is
//! reported back as not applied.

use serde::Deserialize;
use serde_json::json;

use super::{Answer, Endpoint, ParseError, WebQuery, clean};

/// The request.
pub fn request(client: &reqwest::Client, ep: &Endpoint<'_>, q: &WebQuery) -> reqwest::RequestBuilder {
    let mut body = json!({
        "query": q.query,
        "max_results": q.count,
        "topic": "general",
        "search_depth": "basic",
        "include_answer": false,
        "include_raw_content": false,
        "include_images": false,
    });
    if let Some(f) = q.freshness {
        body["time_range"] = json!(f.as_str());
    }
    if let Some(site) = &q.site {
        body["include_domains"] = json!([site]);
    }
    let req = client.post(format!("{}/search", ep.base_url)).json(&body);
    match ep.key {
        Some(key) => req.bearer_auth(key.expose()),
        None => req,
    }
}

#[derive(Deserialize)]
struct Response {
    results: Vec<Item>,
}

#[derive(Deserialize)]
struct Item {
    url: String,
    #[serde(default)]
    title: String,
    #[serde(default)]
    content: String,
    published_date: Option<String>,
}

/// Parses a 2xx body.
pub fn parse(body: &[u8], q: &WebQuery) -> Result<Answer, ParseError> {
    let resp: Response = serde_json::from_slice(body)?;
    let mut answer = Answer::default();
    for item in resp.results {
        if let Some(r) = clean(&item.url, &item.title, &item.content, item.published_date.as_deref()) {
            answer.results.push(r);
        }
        if answer.results.len() >= q.count {
            break;
        }
    }
    if let Some(lang) = &q.language {
        answer.notes.push(format!("tavily has no language filter; language {lang} was not applied"));
    }
    Ok(answer)
}

/// `detail.error` (or a plain string `detail`) of an error body.
pub fn error_message(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let detail = v.get("detail")?;
    detail.get("error").and_then(serde_json::Value::as_str).or_else(|| detail.as_str()).map(str::to_owned)
}
