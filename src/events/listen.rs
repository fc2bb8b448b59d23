//! The cross-replica listener: Postgres `LISTEN mira_events` feeding this replica's bus.
//!
//! Every write transaction that appends events is followed, after its commit, by
//! `pg_notify('mira_events', "<origin> <run id> <seq> <kind>")` (see
//! [`crate::store::WriteTx::commit`]; one task per replica sends them in batches). This task
//! receives what other replicas sent and publishes it on the local [`EventBus`]; subscribers
//! then re-read the store. After every (re)connection it first listens, then sends
//! [`EventBus::resync`], so whatever was committed while it was away is read from the store:
//! a dropped listener delays events, never loses them. It also resyncs every
//! [`RESYNC_EVERY`], which bounds the delay of an event whose notification was never sent
//! (its replica died between the commit and the send). Remote freezes and grants also wake
//! the local harness.

use std::str::FromStr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio_util::sync::CancellationToken;

use super::{EventBus, EventKind, Wake};

/// The notification channel.
pub const CHANNEL: &str = "mira_events";
/// Time between two resyncs while listening (see the module docs).
pub const RESYNC_EVERY: Duration = Duration::from_secs(5);
/// Longest wait between reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The `application_name` of the listener connection of node `node_id` (lets an operator
/// or a test find it in `pg_stat_activity`).
pub fn application_name(node_id: &str) -> String {
    format!("mira-listen {node_id}")
}

/// Starts the listener for a Postgres `url` (returns at once; the task ends on `shutdown`).
pub fn spawn(
    url: String,
    node_id: &str,
    bus: EventBus,
    wake: Wake,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let name = application_name(node_id);
    bus.listener().enabled.store(true, Ordering::Relaxed);
    tokio::spawn(async move {
        let mut backoff = Duration::from_millis(100);
        loop {
            let connected = tokio::select! {
                () = shutdown.cancelled() => return,
                l = connect(&url, &name) => l,
            };
            let mut listener = match connected {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64,
                        "event listener cannot connect; streams fall back to polling the store");
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
            };
            backoff = Duration::from_millis(100);
            connected_again(&bus, &wake);
            let mut resync = tokio::time::interval_at(tokio::time::Instant::now() + RESYNC_EVERY, RESYNC_EVERY);
            loop {
                let next = tokio::select! {
                    () = shutdown.cancelled() => return,
                    _ = resync.tick() => {
                        bus.resync();
                        wake.wake();
                        continue;
                    }
                    n = listener.try_recv() => n,
                };
                match next {
                    Ok(Some(n)) => {
                        if let Some(signal) = bus.feed(n.payload())
                            && matches!(signal.kind, EventKind::InvocationFrozen | EventKind::ApprovalGranted)
                        {
                            wake.wake();
                        }
                    }
                    // Lost and already re-established (and listening again): re-read.
                    Ok(None) => connected_again(&bus, &wake),
                    Err(e) => {
                        tracing::warn!(error = %e, "event listener connection failed; reconnecting");
                        bus.listener().listening.store(false, Ordering::Relaxed);
                        break;
                    }
                }
            }
        }
    })
}

/// After a (re)connection that listens: everyone re-reads the store.
fn connected_again(bus: &EventBus, wake: &Wake) {
    let status = bus.listener();
    status.listening.store(true, Ordering::Relaxed);
    status.connections.fetch_add(1, Ordering::Relaxed);
    bus.resync();
    wake.wake();
}

async fn connect(url: &str, name: &str) -> Result<PgListener, sqlx::Error> {
    let options = PgConnectOptions::from_str(url)?.application_name(name);
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .max_lifetime(None)
        .idle_timeout(None)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await?;
    let mut listener = PgListener::connect_with(&pool).await?;
    listener.ignore_pool_close_event(true);
    listener.listen(CHANNEL).await?;
    Ok(listener)
}
