//! Fair shares of the exposure budget between sources.
//!
//! A *source* is where a tool comes from: the core public surface (`core`), one External
//! MCP server (`mcp:<serverId>`), or one kind of dynamic capability (`dynamic:<domain>`,
//! e.g. `dynamic:browser`). Without shares one server with 150 similar tools can fill all
//! 20 places and push out a core tool the task plainly needs (measured: "read the file
//! README.md and search for the word grant" exposed 20 tools without `read_open`).
//!
//! The rule, applied to the ranked order of a turn's candidates:
//! 1. Walk the ranking best first; a tool is taken while its source holds fewer than
//!    [`MAX_SHARE`] of the places. Beyond that it is *held back*, but only while a tool of
//!    another source that matches the task's words (a BM25 score above 0) is still ahead in
//!    the ranking: the share protects the tools a task plainly names, not tools that merely
//!    rank somewhere (the task "work on GitHub" keeps every GitHub tool).
//! 2. When the ranking is exhausted with places left (no other source had anything left to
//!    offer), the held-back tools fill them in ranked order ([`Inclusion::ShareFill`]).
//! 3. When the ranking carries no signal — the task matches no candidate's words and no
//!    candidate's embedding is close ([`super::Ranking::without_signal`]), e.g. the task
//!    `x` — the core tools are taken first, in ranked order ([`Inclusion::CorePrior`]),
//!    before the rule above fills the rest.
//!
//! Apart from the core tools taken first, the exposure lists the tools best first.
//! A tool counts as *held back* when its share kept it out while a tool ranked below it
//! was exposed.
//!
//! A single source (every candidate from one place) therefore ranks exactly as without
//! shares. The exposure records each tool's source and why it was included, and per source
//! how many candidates it had, how many were exposed and how many were held back, so every
//! exclusion by the shares is explained.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::registry::{ToolKind, ToolSpec};

/// The most places of the 20 one source takes while other sources still have candidates.
pub const MAX_SHARE: usize = 12;

/// Why a tool is in a turn's exposure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Inclusion {
    /// ≤ 20 candidates: every one is exposed.
    All,
    /// Among the best ranked, within its source's share.
    Ranked,
    /// Held back by its source's share, then taken because no other source had candidates
    /// left.
    ShareFill,
    /// A core tool taken first because the task matched no candidate's text.
    CorePrior,
}

/// One source's part of a ranked exposure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SourceShare {
    /// `core`, `mcp:<serverId>` or `dynamic:<domain>` ([`source_of`]).
    pub source: String,
    /// The source's public available candidates this turn.
    pub candidates: usize,
    /// Of those, exposed.
    pub exposed: usize,
    /// Ranked into the 20 but left out because the source had its [`MAX_SHARE`] places.
    pub held_back: usize,
}

/// The source of a tool (see the module docs). An MCP projection's id is
/// `mcp:<serverId>:tool:<name>`; its source is `mcp:<serverId>`.
pub fn source_of(spec: &ToolSpec) -> String {
    match spec.kind {
        ToolKind::McpProjection => {
            let server = spec.id.strip_prefix("mcp:").and_then(|rest| rest.split(":tool:").next()).unwrap_or("");
            format!("mcp:{server}")
        }
        ToolKind::Dynamic => format!("dynamic:{}", spec.domain),
        _ => "core".to_owned(),
    }
}

/// The places taken: (candidate index, score, inclusion) best first, and the sources'
/// shares sorted by source.
pub struct Selection {
    /// The exposed candidates in exposure order.
    pub taken: Vec<(usize, f64, Inclusion)>,
    /// One entry per source with candidates.
    pub shares: Vec<SourceShare>,
}

/// Applies the rule of the module docs.
///
/// - `order`: every candidate as (index, score), best first (see [`super::top_k`]);
/// - `sources`: the source of each candidate, by index;
/// - `matched`: whether each candidate matches the task's words, by index (empty: all do);
/// - `core_prior`: true when the ranking carries no signal;
/// - `k`: the number of places.
pub fn select(order: &[(usize, f64)], sources: &[String], matched: &[bool], core_prior: bool, k: usize) -> Selection {
    let mut shares: BTreeMap<&str, SourceShare> = BTreeMap::new();
    for s in sources {
        shares
            .entry(s.as_str())
            .or_insert_with(|| SourceShare { source: s.clone(), candidates: 0, exposed: 0, held_back: 0 })
            .candidates += 1;
    }
    let mut taken: Vec<(usize, f64, Inclusion)> = Vec::with_capacity(k);
    let mut is_taken = vec![false; sources.len()];
    let mut take = |i: usize, score: f64, why: Inclusion, shares: &mut BTreeMap<&str, SourceShare>| {
        taken.push((i, score, why));
        if let Some(s) = shares.get_mut(sources[i].as_str()) {
            s.exposed += 1;
        }
    };
    if core_prior {
        for &(i, score) in order.iter().filter(|(i, _)| sources[*i] == "core").take(k) {
            is_taken[i] = true;
            take(i, score, Inclusion::CorePrior, &mut shares);
        }
    }
    // For each position of the ranking: whether a matching candidate of another source than
    // the one there comes later (counts of matching candidates after it, in all and of its
    // own source).
    let matches = |i: usize| matched.get(i).copied().unwrap_or(true);
    let mut contended = vec![false; order.len()];
    let mut after_total = 0usize;
    let mut after_by_source: BTreeMap<&str, usize> = BTreeMap::new();
    for (pos, &(i, _)) in order.iter().enumerate().rev() {
        let own = after_by_source.get(sources[i].as_str()).copied().unwrap_or(0);
        contended[pos] = after_total > own;
        if matches(i) && !is_taken[i] {
            after_total += 1;
            *after_by_source.entry(sources[i].as_str()).or_insert(0) += 1;
        }
    }
    let mut places = k.saturating_sub(shares.values().map(|s| s.exposed).sum());
    let mut held: Vec<(usize, f64)> = Vec::new();
    for (pos, &(i, score)) in order.iter().enumerate() {
        if places == 0 {
            break;
        }
        if is_taken[i] {
            continue;
        }
        if !contended[pos] || shares.get(sources[i].as_str()).map_or(0, |s| s.exposed) < MAX_SHARE {
            take(i, score, Inclusion::Ranked, &mut shares);
            places -= 1;
        } else {
            held.push((i, score));
        }
    }
    let fill = places.min(held.len());
    for &(i, score) in &held[..fill] {
        take(i, score, Inclusion::ShareFill, &mut shares);
    }
    // Held back: kept out by the share while a worse-ranked tool of another source got in.
    let worst_taken = taken.iter().filter(|t| t.2 == Inclusion::Ranked).map(|t| t.1).reduce(f64::min);
    for &(i, score) in &held[fill..] {
        if worst_taken.is_some_and(|w| score > w)
            && let Some(s) = shares.get_mut(sources[i].as_str())
        {
            s.held_back += 1;
        }
    }
    // Best first after the core tools taken first (a fill ranks above the tools of other
    // sources taken after it was held). The sort is stable: ties keep the ranking's order.
    let prior = taken.iter().take_while(|t| t.2 == Inclusion::CorePrior).count();
    taken[prior..].sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap_or(std::cmp::Ordering::Equal));
    Selection { taken, shares: shares.into_values().collect() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(n: usize) -> Vec<(usize, f64)> {
        (0..n).map(|i| (i, 1.0 - i as f64 / 100.0)).collect()
    }

    #[test]
    fn one_source_ranks_as_without_shares() {
        let sources = vec!["core".to_owned(); 30];
        let s = select(&order(30), &sources, &[], false, 20);
        assert_eq!(s.taken.iter().map(|t| t.0).collect::<Vec<_>>(), (0..20).collect::<Vec<_>>());
        assert_eq!(s.taken.iter().filter(|t| t.2 == Inclusion::Ranked).count(), 20);
        assert_eq!(s.shares, vec![SourceShare { source: "core".into(), candidates: 30, exposed: 20, held_back: 0 }]);
    }

    #[test]
    fn a_crowding_source_keeps_its_share_and_the_rest_go_to_others() {
        // 25 MCP tools rank above 10 core tools.
        let sources: Vec<String> =
            (0..35).map(|i| if i < 25 { "mcp:srv".to_owned() } else { "core".to_owned() }).collect();
        let s = select(&order(35), &sources, &[], false, 20);
        let taken: Vec<usize> = s.taken.iter().map(|t| t.0).collect();
        assert_eq!(taken, (0..12).chain(25..33).collect::<Vec<_>>());
        let mcp = s.shares.iter().find(|x| x.source == "mcp:srv").unwrap();
        assert_eq!((mcp.candidates, mcp.exposed, mcp.held_back), (25, 12, 13));
    }

    #[test]
    fn held_back_tools_fill_places_no_other_source_wants() {
        let sources: Vec<String> =
            (0..30).map(|i| if i < 27 { "mcp:srv".to_owned() } else { "core".to_owned() }).collect();
        let s = select(&order(30), &sources, &[], false, 20);
        assert_eq!(s.taken.len(), 20);
        assert_eq!(s.taken.iter().filter(|t| t.2 == Inclusion::ShareFill).count(), 5);
        assert_eq!(s.shares.iter().find(|x| x.source == "mcp:srv").unwrap().held_back, 10);
    }

    #[test]
    fn a_source_is_not_held_back_for_tools_that_do_not_match_the_task() {
        // 15 GitHub tools match "work on GitHub"; the 11 core tools do not.
        let sources: Vec<String> =
            (0..26).map(|i| if i < 15 { "dynamic:github".to_owned() } else { "core".to_owned() }).collect();
        let matched: Vec<bool> = (0..26).map(|i| i < 15).collect();
        let s = select(&order(26), &sources, &matched, false, 20);
        assert_eq!(s.taken.iter().filter(|t| sources[t.0] == "dynamic:github").count(), 15);
        assert!(s.shares.iter().all(|x| x.held_back == 0));
        // One matching core tool is enough to hold GitHub at its share.
        let mut matched = matched;
        matched[15] = true;
        let s = select(&order(26), &sources, &matched, false, 20);
        assert_eq!(s.taken.iter().filter(|t| sources[t.0] == "dynamic:github").count(), 12);
        assert!(s.taken.iter().any(|t| t.0 == 15));
        assert_eq!(s.shares.iter().find(|x| x.source == "dynamic:github").unwrap().held_back, 3);
    }

    #[test]
    fn without_a_lexical_match_core_tools_come_first() {
        let sources: Vec<String> =
            (0..40).map(|i| if i < 35 { "mcp:srv".to_owned() } else { "core".to_owned() }).collect();
        let s = select(&order(40), &sources, &[], true, 20);
        assert_eq!(
            s.taken[..5].iter().map(|t| (t.0, t.2)).collect::<Vec<_>>(),
            (35..40).map(|i| (i, Inclusion::CorePrior)).collect::<Vec<_>>()
        );
        assert_eq!(s.taken.len(), 20);
    }
}
