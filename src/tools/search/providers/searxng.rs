//! SearXNG's JSON API: `GET {base}/search?q=…&format=json` (the instance must list `json`
//! in `search.formats`, else it answers 403). Freshness is `time_range`, language is
//! `language`, a site restriction is the `site:` operator in the query. The answer is
//! `{query, number_of_results, results: [{url, title, content, publishedDate, engine, …}],
//! unresponsive_engines: [[engine, reason], …], …}`.

use serde::Deserialize;

use super::{Answer, Endpoint, ProviderError, WebQuery, clean};
use crate::error::ErrorCode;

/// The request.
pub fn request(client: &reqwest::Client, ep: &Endpoint<'_>, q: &WebQuery) -> reqwest::RequestBuilder {
    let query = match &q.site {
        Some(site) => format!("{} site:{site}", q.query),
        None => q.query.clone(),
    };
    let mut params: Vec<(&str, String)> =
        vec![("q", query), ("format", "json".into()), ("pageno", "1".into()), ("safesearch", "0".into())];
    if let Some(f) = q.freshness {
        params.push(("time_range", f.as_str().into()));
    }
    if let Some(lang) = &q.language {
        params.push(("language", lang.clone()));
    }
    let req = client.get(format!("{}/search", ep.base_url)).query(&params).header("accept", "application/json");
    match ep.key {
        Some(key) => req.bearer_auth(key.expose()),
        None => req,
    }
}

#[derive(Deserialize)]
struct Response {
    results: Vec<Item>,
    #[serde(default)]
    unresponsive_engines: Vec<Vec<serde_json::Value>>,
}

#[derive(Deserialize)]
struct Item {
    url: Option<String>,
    #[serde(default)]
    title: String,
    #[serde(default)]
    content: Option<String>,
    #[serde(rename = "publishedDate", default)]
    published_date: Option<String>,
}

/// Parses a 2xx body. No results with every engine failing is an error
/// (`provider_engines_failed`), not an empty list.
pub fn parse(body: &[u8], q: &WebQuery) -> Result<Answer, ProviderError> {
    let resp: Response = serde_json::from_slice(body).map_err(|e| ProviderError {
        code: ErrorCode::ProviderBadResponse,
        message: format!("searxng answered 2xx with a body that is not its JSON format: {e}"),
        status: None,
        retry_after_ms: None,
        attempts: 0,
    })?;
    let failed: Vec<String> = resp
        .unresponsive_engines
        .iter()
        .map(|e| {
            let parts: Vec<String> =
                e.iter().map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned)).collect();
            parts.join(": ")
        })
        .collect();
    let mut answer = Answer::default();
    let mut seen = std::collections::HashSet::new();
    for item in resp.results {
        let Some(url) = item.url else { continue };
        if !seen.insert(url.clone()) {
            continue;
        }
        if let Some(r) = clean(&url, &item.title, item.content.as_deref().unwrap_or(""), item.published_date.as_deref())
        {
            answer.results.push(r);
        }
        if answer.results.len() >= q.count {
            break;
        }
    }
    if answer.results.is_empty() && !failed.is_empty() {
        return Err(ProviderError {
            code: ErrorCode::ProviderEnginesFailed,
            message: format!("searxng returned no results because its engines failed: {}", failed.join("; ")),
            status: None,
            retry_after_ms: None,
            attempts: 0,
        });
    }
    if !failed.is_empty() {
        answer.notes.push(format!("searxng engines that did not answer: {}", failed.join("; ")));
    }
    Ok(answer)
}
