//! `mira bench news`: News Hub collection throughput and search latency on a fresh store.
//!
//! A loopback HTTP server serves `feeds` RSS 2.0 documents of `items / feeds` items each,
//! generated from a fixed seed: titles, summaries and bodies drawn from a 20,000-word
//! synthetic vocabulary with Zipf-distributed word ranks (P(rank r) ∝ 1/r, sampled as
//! `exp(u·ln V)`), so posting lists range from very common to rare words like real text.
//! The real collector fetches and stores them all (HTTP, feed-rs parsing, upserts and the
//! full-text index), timed as items stored per second. Then `queries` searches — common,
//! mid-frequency and rare single words, two-word AND queries, phrases, and time-sorted
//! queries — run one after another through the store's news search (limit 10); their
//! latencies give p50 and p99. SQLite runs in a temporary directory; Postgres in a database
//! created for the run and dropped afterwards.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use mira::store::{NewsQuery, NewsSort, NewsSourceRow};
use mira::tools::search::config::SearchConfig;
use mira::tools::search::news::collector::Collector;
use mira::tools::search::news::query;

/// Options of `mira bench news`.
#[derive(Debug, Clone, clap::Args)]
pub struct NewsBench {
    /// A Postgres server URL (a fresh database is created on it and dropped after);
    /// default a temporary SQLite file.
    #[arg(long)]
    pub postgres: Option<String>,
    /// Items to collect in total.
    #[arg(long, default_value_t = 100_000)]
    pub items: usize,
    /// Feeds they are spread over.
    #[arg(long, default_value_t = 100)]
    pub feeds: usize,
    /// Searches to time.
    #[arg(long, default_value_t = 400)]
    pub queries: usize,
    /// Feeds fetched at once.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Keep the Postgres database afterwards (to study its query plans).
    #[arg(long)]
    pub keep_db: bool,
}

/// Size of the synthetic vocabulary.
pub const VOCABULARY: usize = 20_000;

/// xorshift64* (Vigna, "An experimental exploration of Marsaglia's xorshift generators",
/// 2016): deterministic and dependency-free.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A Zipf-like rank in 0..VOCABULARY.
    fn rank(&mut self) -> usize {
        let r = (self.unit() * (VOCABULARY as f64).ln()).exp() as usize;
        r.saturating_sub(1).min(VOCABULARY - 1)
    }
}

/// The word of rank `i`: syllables from a fixed table, unique per rank.
fn word(i: usize) -> String {
    const SYL: [&str; 24] = [
        "ka", "lo", "mi", "ne", "ru", "ta", "vo", "zi", "be", "do", "fa", "gu", "ha", "ji", "ko", "lu", "ma", "no",
        "pe", "ri", "sa", "tu", "wa", "yo",
    ];
    let mut n = i + SYL.len();
    let mut w = String::new();
    while n > 0 {
        w.push_str(SYL[n % SYL.len()]);
        n /= SYL.len();
    }
    w
}

fn words(rng: &mut Rng, n: usize) -> String {
    (0..n).map(|_| word(rng.rank())).collect::<Vec<_>>().join(" ")
}

/// The RSS document of feed `f` with `per_feed` items.
fn feed_document(f: usize, per_feed: usize) -> String {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (f as u64 + 1).wrapping_mul(0xA24B_AED4_963E_E407));
    let mut s = String::with_capacity(per_feed * 1800);
    s.push_str(&format!(
        "<?xml version=\"1.0\"?><rss version=\"2.0\" xmlns:content=\"http://purl.org/rss/1.0/modules/content/\">\
         <channel><title>Feed {f}</title>"
    ));
    let base = chrono::Utc::now() - chrono::Duration::days(365);
    for i in 0..per_feed {
        let published = base + chrono::Duration::seconds((rng.next() % (365 * 86_400)) as i64);
        s.push_str(&format!(
            "<item><guid>f{f}-i{i}</guid><link>https://bench.example/{f}/{i}</link><title>{}</title>\
             <description>{}</description><pubDate>{}</pubDate><content:encoded>{}</content:encoded></item>",
            words(&mut rng, 8),
            words(&mut rng, 40),
            published.to_rfc2822(),
            words(&mut rng, 200),
        ));
    }
    s.push_str("</channel></rss>");
    s
}

/// User + system CPU time of this process so far, from fields 14 and 15 of
/// `/proc/self/stat` (all threads, in USER_HZ = 100 ticks per second, proc(5)).
fn cpu_time() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else { return Duration::ZERO };
    // The command name (field 2) may hold spaces; the fields after it follow its ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    // After ')' comes field 3 (state) at index 0, so field n is at index n - 3.
    Duration::from_millis((ticks(14 - 3) + ticks(15 - 3)) * 10)
}

/// The 1-minute load average (the machine is shared; figures depend on it).
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

/// Runs the benchmark and prints its figures as JSON.
pub async fn run(args: NewsBench) -> anyhow::Result<()> {
    let tmp = std::env::temp_dir().join(format!("mira-bench-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&tmp)?;
    let db = super::ScratchDb::create(args.postgres.as_deref(), &tmp, "mira_bench").await?;
    let result = bench(&args, &db.url, &tmp).await;
    db.drop(args.keep_db).await?;
    let _ = std::fs::remove_dir_all(&tmp);
    println!("{}", serde_json::to_string_pretty(&result?)?);
    Ok(())
}

async fn bench(args: &NewsBench, url: &str, tmp: &std::path::Path) -> anyhow::Result<serde_json::Value> {
    let store = mira::server::open_store(tmp, url).await?;
    let user = store.create_user("bench", false, &mira::auth::hash_token("bench")).await?;
    let feeds = args.feeds.max(1);
    let per_feed = args.items.div_ceil(feeds);

    // Documents are rendered before the clock starts: the figure is the collector's.
    let documents: Arc<Vec<String>> = Arc::new((0..feeds).map(|f| feed_document(f, per_feed)).collect());
    let feed_bytes: usize = documents.iter().map(String::len).sum();
    let router = axum::Router::new().route(
        "/feed/{n}",
        axum::routing::get(move |axum::extract::Path(n): axum::extract::Path<usize>| {
            let documents = Arc::clone(&documents);
            async move {
                let body = documents.get(n).cloned().unwrap_or_default();
                ([("content-type", "application/rss+xml")], body)
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, router).await });

    for f in 0..feeds {
        store
            .create_news_source(&NewsSourceRow::new(
                Some(user.id.clone()),
                format!("Feed {f}"),
                format!("http://{addr}/feed/{f}"),
                86_400,
            ))
            .await?;
    }
    let config = SearchConfig {
        news_concurrency: args.concurrency.max(1),
        news_max_items_per_fetch: per_feed,
        news_max_items_per_source: per_feed,
        news_max_items_per_user: usize::MAX,
        news_max_feed_bytes: 1 << 30,
        news_fetch_timeout_secs: 600,
        ..SearchConfig::default()
    };
    let collector = Arc::new(Collector::new(store.clone(), &config, Arc::new(mira::net::AddressPolicy::new(true))));
    let started = Instant::now();
    let cpu_before = cpu_time();
    let fetches = collector.collect_due_now().await;
    let collect_time = started.elapsed();
    let collect_cpu = cpu_time().saturating_sub(cpu_before);
    let stored = store.count_news_items().await?;
    server.abort();
    if fetches != feeds || stored < i64::try_from(args.items).unwrap_or(i64::MAX) {
        anyhow::bail!("collected {stored} items in {fetches} fetches; expected {} in {feeds}", args.items);
    }

    // Queries: a fixed mix over the vocabulary's frequency range.
    let mut rng = Rng(42);
    let mut texts = Vec::with_capacity(args.queries);
    for i in 0..args.queries {
        let text = match i % 6 {
            0 => word(rng.next() as usize % 50),
            1 => word(100 + rng.next() as usize % 900),
            2 => word(5_000 + rng.next() as usize % 15_000),
            3 => format!("{} {}", word(rng.rank()), word(rng.rank())),
            4 => format!("\"{} {}\"", word(rng.next() as usize % 200), word(rng.next() as usize % 200)),
            _ => word(rng.rank()),
        };
        texts.push((text, if i % 6 == 5 { NewsSort::Time } else { NewsSort::Relevance }));
    }
    let mut latencies = Vec::with_capacity(texts.len());
    let mut hits_total = 0usize;
    let search_cpu_before = cpu_time();
    for (text, sort) in &texts {
        anyhow::ensure!(query::has_positive_term(text), "benchmark query has no term");
        let q = NewsQuery { user_id: &user.id, text, since: None, until: None, source: None, sort: *sort, limit: 10 };
        let t = Instant::now();
        let hits = store.search_news(&q).await?;
        latencies.push(t.elapsed());
        hits_total += hits.len();
    }
    let search_cpu = cpu_time().saturating_sub(search_cpu_before);
    let pct = super::percentiles(&latencies);
    store.close().await;
    let ms = |v: f64| (v * 100.0).round() / 100.0;
    Ok(json!({
        "backend": store.backend().name(),
        "items_stored": stored,
        "feeds": feeds,
        "collect_seconds": (collect_time.as_secs_f64() * 100.0).round() / 100.0,
        "items_per_second": (stored as f64 / collect_time.as_secs_f64()).round(),
        "feed_megabytes": (feed_bytes as f64 / 1e4).round() / 100.0,
        "collect_process_cpu_seconds": (collect_cpu.as_secs_f64() * 100.0).round() / 100.0,
        "search_process_cpu_seconds": (search_cpu.as_secs_f64() * 100.0).round() / 100.0,
        "load_average_1m": load_average(),
        "queries": latencies.len(),
        "mean_hits_per_query": (hits_total as f64 / latencies.len().max(1) as f64 * 10.0).round() / 10.0,
        "search_p50_ms": ms(pct.p50),
        "search_p99_ms": ms(pct.p99),
        "search_max_ms": ms(pct.max),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_unique_and_feeds_parse() {
        let set: std::collections::HashSet<String> = (0..VOCABULARY).map(word).collect();
        assert_eq!(set.len(), VOCABULARY);
        let doc = feed_document(3, 5);
        let parsed = mira::tools::search::news::feed::parse(doc.as_bytes(), None, "http://x.example/", 100).unwrap();
        assert_eq!(parsed.items.len(), 5);
        assert!(!parsed.items[0].content.is_empty());
    }
}
