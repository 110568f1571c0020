//! The indexer's consumer loop: several events at once, one file at a time.
//!
//! Messages of the durable pull consumer are routed by a key (namespace + file id)
//! to one of N lanes. A lane runs its events strictly in delivery order, so two
//! events of one file never run at once and apply in publish order, while files on
//! other lanes proceed in parallel. A lane also remembers the highest stream sequence
//! it applied per key: a redelivered older event (e.g. one that was NAKed while a
//! newer one succeeded) is acked without being applied. Each message is acked only
//! after its handler says its writes are durable. Replicas of the indexer share the
//! durable consumer; a lane takes its key's lease before it runs an event and reads the
//! highest sequence applied from a shared bucket (`leases`), so the same holds across them. Every message pulled and not yet
//! settled, queued or running, gets progress acks (see `in_flight`), so JetStream
//! never redelivers work that is still pending here.

mod in_flight;
mod leases;

use std::hash::{Hash as _, Hasher as _};
use std::sync::Arc;
use std::time::Duration;

use crate::events_err;
use async_nats::jetstream::consumer::pull;
use async_nats::jetstream::{self, AckKind};
use futures::StreamExt as _;
use futures::future::BoxFuture;
use kg_stores::StoreError;
use kg_stores::consumer::{ConsumerSpec, Delivery, Handled, backoff, pause};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use in_flight::{InFlight, Pending};
use leases::Lease;
pub(crate) use leases::Leases;

/// How long one pull request waits for messages before a new one is sent. A request NATS lost
/// in a restart is given up 5 s after this (the client's margin), so this bounds how long an
/// indexer waits before it asks a restarted NATS again.
const PULL_EXPIRES: Duration = Duration::from_secs(4);
/// Pause after a failed pull, so a broken consumer does not spin.
const PULL_RETRY: Duration = Duration::from_secs(1);
/// How often the consumer's backlog is read into `kgmesh_indexer_pending_events`.
const BACKLOG_EVERY: Duration = Duration::from_secs(10);

/// What the lanes run for each message.
pub(crate) trait LaneHandler: Send + Sync + 'static {
    /// The ordering key of a message (messages with the same key share a lane);
    /// `None` for a payload that cannot be decoded (it is acked and dropped).
    fn key(&self, payload: &[u8]) -> Option<String>;
    /// Handles one message.
    fn handle<'a>(&'a self, delivery: Delivery<'a>) -> BoxFuture<'a, Handled>;
    /// Whether a message handled here becomes its key's newest applied event, which makes
    /// every older event of the key stale. A flags change must not: the uploads queued
    /// before it still have to run.
    fn records_progress(&self) -> bool {
        true
    }
    /// Makes again what the handler keeps on the bus (KV buckets) after the consumer was lost
    /// with the rest of NATS's state. Idempotent.
    fn repair(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }
}

struct Job {
    pending: Pending<jetstream::Message>,
    key: String,
}

/// The lane of a key: stable within the process.
fn lane_of(key: &str, lanes: usize) -> usize {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut hasher);
    usize::try_from(hasher.finish() % lanes.max(1) as u64).unwrap_or(0)
}

/// Messages pulled ahead of `lanes` lanes: enough to keep every lane fed when keys
/// spread unevenly, few enough that a crash leaves little waiting for its ack wait.
fn pull_ahead(lanes: usize) -> usize {
    lanes.max(1) * 4
}

type PullConsumer = jetstream::consumer::Consumer<pull::Config>;

/// Consumes until `shutdown` with `lanes` concurrent lanes. Consumers that name the same
/// `lease_scope` share each key's lease and its highest sequence applied, so one file's
/// events never run at once across them, and one applied there makes older ones stale here.
pub(crate) async fn run<H: LaneHandler>(
    js: &jetstream::Context,
    spec: &ConsumerSpec,
    lease_scope: &str,
    lanes: usize,
    shutdown: CancellationToken,
    handler: Arc<H>,
) -> Result<(), StoreError> {
    let lanes = lanes.max(1);
    let (mut consumer, incarnation) = kg_stores::consumer::open_with_incarnation(js, spec).await?;
    // Progress is paced by the shorter of the server's ack wait and ours.
    let ack_wait = kg_stores::consumer::effective_ack_wait(&consumer, spec);

    // Sequences applied are read and recorded for the stream's incarnation: one recorded in
    // an earlier stream says nothing of the order of this one's events.
    let leases = Arc::new(Leases::open(js, incarnation).await?);
    // The lanes stop with the caller's token, or when this loop ends for any reason.
    let shutdown = shutdown.child_token();
    let in_flight = InFlight::new();
    let mut senders = Vec::with_capacity(lanes);
    let mut workers = JoinSet::new();
    workers.spawn(
        Arc::clone(&in_flight).tick(in_flight::progress_interval(ack_wait), shutdown.clone()),
    );
    let (current_consumer, watched_consumer) = watch::channel(consumer.clone());
    workers.spawn(report_backlog(
        watched_consumer,
        spec.durable.clone(),
        shutdown.clone(),
    ));
    for lane in 0..lanes {
        // Unbounded: the pull-ahead window bounds all lanes together, and the pull
        // loop must never wait on one busy lane while messages sit unseen.
        let (tx, rx) = mpsc::unbounded_channel::<Job>();
        senders.push(tx);
        workers.spawn(run_lane(
            lane,
            rx,
            Arc::clone(&handler),
            Arc::clone(&leases),
            spec.clone(),
            Arc::from(lease_scope),
            shutdown.clone(),
        ));
    }

    // One permit per message pulled and not yet settled. A pull asks for exactly the
    // free permits, so every message the server delivers is taken out of the client
    // buffer at once and tracked.
    let window = Arc::new(Semaphore::new(pull_ahead(lanes)));
    // Set when a pull failed: before the next one the consumer is opened again, and what
    // the lanes keep on the bus is made again, in case NATS lost them.
    let mut broken = false;
    let result = 'pull: loop {
        if std::mem::take(&mut broken) {
            match repair(js, spec, &*handler, &leases).await {
                Ok((reopened, stream_incarnation)) => {
                    consumer = reopened;
                    current_consumer.send_replace(consumer.clone());
                    if leases.set_incarnation(stream_incarnation) != stream_incarnation {
                        tracing::warn!(consumer = %spec.durable, "the event stream was made again since this consumer opened; sequences applied before it no longer order new events");
                    }
                }
                Err(err) => {
                    tracing::warn!(error = %err.detail(), consumer = %spec.durable, "opening the consumer again failed; retrying");
                    broken = true;
                    if !pause(PULL_RETRY, &shutdown).await {
                        break Ok(());
                    }
                    continue;
                }
            }
        }
        let first = tokio::select! {
            _ = shutdown.cancelled() => break Ok(()),
            permit = Arc::clone(&window).acquire_owned() => permit,
        };
        let Ok(mut room) = first else {
            break Err(events_err("indexer pull window closed"));
        };
        let free = u32::try_from(window.available_permits()).unwrap_or(0);
        if let Ok(more) = Arc::clone(&window).try_acquire_many_owned(free) {
            room.merge(more);
        }
        let request = consumer
            .batch()
            .max_messages(room.num_permits())
            .expires(PULL_EXPIRES)
            .messages();
        let batch = tokio::select! {
            _ = shutdown.cancelled() => break Ok(()),
            batch = request => batch,
        };
        let mut batch = match batch {
            Ok(batch) => batch,
            Err(err) => {
                tracing::warn!(error = %err, consumer = %spec.durable, "pull request failed; retrying");
                drop(room);
                broken = true;
                if !pause(PULL_RETRY, &shutdown).await {
                    break Ok(());
                }
                continue;
            }
        };
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => break 'pull Ok(()),
                next = batch.next() => next,
            };
            let message = match next {
                None => break,
                Some(Ok(message)) => message,
                Some(Err(err)) => {
                    tracing::warn!(error = %err, consumer = %spec.durable, "consumer error; opening it again");
                    broken = true;
                    if !pause(PULL_RETRY, &shutdown).await {
                        break 'pull Ok(());
                    }
                    break;
                }
            };
            let pending = in_flight.track(message, room.split(1));
            let Some(key) = handler.key(&pending.message().payload) else {
                tracing::warn!(subject = %pending.message().subject, "dropping undecodable event");
                if let Err(err) = pending.settle(AckKind::Ack).await {
                    tracing::warn!(error = %err, "ack failed");
                }
                continue;
            };
            let lane = lane_of(&key, lanes);
            if senders[lane].send(Job { pending, key }).is_err() {
                break 'pull Err(events_err(format!("indexer lane {lane} stopped")));
            }
        }
    };
    // Unsettled messages are redelivered to whoever consumes next, after their ack wait.
    drop(senders);
    shutdown.cancel();
    while workers.join_next().await.is_some() {}
    result
}

/// Opens the consumer again (making its stream and itself again when NATS lost them), and
/// what the lanes and the handler keep in KV buckets; returns the consumer and its stream's
/// incarnation.
async fn repair<H: LaneHandler>(
    js: &jetstream::Context,
    spec: &ConsumerSpec,
    handler: &H,
    leases: &Leases,
) -> Result<(PullConsumer, i64), StoreError> {
    let opened = kg_stores::consumer::open_with_incarnation(js, spec).await?;
    leases.ensure_buckets(js).await?;
    handler.repair().await?;
    Ok(opened)
}

/// Sets `kgmesh_indexer_pending_events` for `durable` at once and every [`BACKLOG_EVERY`]:
/// the events JetStream holds for it that no replica settled yet, which is what a deploy's
/// alert on a falling-behind indexer (or its autoscaler) wants. Reads the consumer the pull
/// loop uses now, which it opens again after a failure.
async fn report_backlog(
    consumer: watch::Receiver<PullConsumer>,
    durable: String,
    shutdown: CancellationToken,
) {
    let gauge = kg_common::metrics::metrics()
        .indexer_pending_events
        .get_or_create(&kg_common::metrics::ConsumerLabels { consumer: durable })
        .clone();
    loop {
        let mut current = consumer.borrow().clone();
        match current.info().await {
            Ok(info) => {
                let pending = info.num_pending.saturating_add(info.num_ack_pending as u64);
                gauge.set(i64::try_from(pending).unwrap_or(i64::MAX));
            }
            Err(err) => tracing::debug!(error = %err, "reading the consumer's backlog failed"),
        }
        if !pause(BACKLOG_EVERY, &shutdown).await {
            return;
        }
    }
}

async fn run_lane<H: LaneHandler>(
    lane: usize,
    mut jobs: mpsc::UnboundedReceiver<Job>,
    handler: Arc<H>,
    leases: Arc<Leases>,
    spec: ConsumerSpec,
    lease_scope: Arc<str>,
    shutdown: CancellationToken,
) {
    loop {
        let job = tokio::select! {
            _ = shutdown.cancelled() => return,
            job = jobs.recv() => job,
        };
        let Some(Job { pending, key }) = job else {
            return;
        };
        let message = pending.message();
        let (attempt, sequence) = message
            .info()
            .map(|i| (i.delivered, i.stream_sequence))
            .unwrap_or((1, 0));
        let shared_key = Leases::bucket_key(&lease_scope, &key);
        let lease = match leases.acquire(&shared_key, &shutdown).await {
            Ok(Some(lease)) => lease,
            // Stopping: the message is redelivered to whoever consumes next.
            Ok(None) => return,
            Err(err) => {
                tracing::warn!(error = %err.detail(), lane, "indexer lease unavailable; the message will be redelivered");
                settle(&spec, pending, AckKind::Nak(Some(backoff(attempt)))).await;
                continue;
            }
        };
        // Highest stream sequence applied for this key by any replica, so an older
        // redelivery never wins.
        let stream_incarnation = leases.incarnation();
        let last = match leases.applied(&shared_key, stream_incarnation).await {
            Ok(last) => last,
            Err(err) => {
                tracing::warn!(error = %err.detail(), lane, "indexer progress unreadable; the message will be redelivered");
                leases.release(lease).await;
                settle(&spec, pending, AckKind::Nak(Some(backoff(attempt)))).await;
                continue;
            }
        };
        if let Some(last) = last
            && sequence < last
        {
            tracing::info!(lane, key = ?key, sequence, last, "skipping an event older than one already applied");
            leases.release(lease).await;
            settle(&spec, pending, AckKind::Ack).await;
            continue;
        }
        let delivery = Delivery {
            subject: message.subject.as_str(),
            payload: &message.payload,
            attempt,
            last_attempt: attempt >= spec.max_deliver,
            sequence,
        };
        // The in-flight ticker keeps the message alive while this runs, and the lease is
        // renewed alongside.
        let Some((outcome, lease)) =
            handle_leased(&*handler, delivery, &leases, lease, &shutdown).await
        else {
            return;
        };
        let kind = match outcome {
            Handled::Ack if !handler.records_progress() => AckKind::Ack,
            Handled::Ack => {
                if let Err(err) = leases
                    .record(&shared_key, sequence, last, stream_incarnation)
                    .await
                {
                    tracing::warn!(error = %err.detail(), lane, "recording indexer progress failed; an older redelivery of this file could apply again");
                }
                AckKind::Ack
            }
            Handled::Retry(reason) => {
                tracing::warn!(consumer = %spec.durable, lane, attempt, reason = %reason, "message will be redelivered");
                AckKind::Nak(Some(backoff(attempt)))
            }
        };
        settle(&spec, pending, kind).await;
        leases.release(lease).await;
    }
}

/// Runs one event while renewing its lease; `None` when stopping (the lease is released and
/// the message is redelivered to whoever consumes next).
async fn handle_leased<H: LaneHandler>(
    handler: &H,
    delivery: Delivery<'_>,
    leases: &Leases,
    mut lease: Lease,
    shutdown: &CancellationToken,
) -> Option<(Handled, Lease)> {
    let handling = handler.handle(delivery);
    tokio::pin!(handling);
    let mut renew = tokio::time::interval_at(
        tokio::time::Instant::now() + leases::RENEW_EVERY,
        leases::RENEW_EVERY,
    );
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => {
                leases.release(lease).await;
                return None;
            }
            outcome = &mut handling => return Some((outcome, lease)),
            _ = renew.tick() => {
                if let Err(err) = leases.renew(&mut lease).await {
                    tracing::warn!(error = %err.detail(), "renewing an indexer lease failed; another replica may start this file after it expires");
                }
            }
        }
    }
}

async fn settle(spec: &ConsumerSpec, pending: Pending<jetstream::Message>, kind: AckKind) {
    if let Err(err) = pending.settle(kind).await {
        tracing::warn!(error = %err, consumer = %spec.durable, "ack failed; the message will be redelivered");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_always_lands_on_the_same_lane() {
        let lanes = 4;
        let first = lane_of("ns\u{0}file-1", lanes);
        for _ in 0..10 {
            assert_eq!(lane_of("ns\u{0}file-1", lanes), first);
        }
        let used: std::collections::HashSet<usize> = (0..64)
            .map(|i| lane_of(&format!("ns\u{0}file-{i}"), lanes))
            .collect();
        assert!(used.len() > 1 && used.iter().all(|l| *l < lanes));
        assert_eq!(lane_of("x", 1), 0);
    }
}
