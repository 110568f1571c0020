//! The indexer's consumer loop: several events at once, one file at a time.
//!
//! Messages of the durable pull consumer are routed by a key (namespace + file id)
//! to one of N lanes. A lane runs its events strictly in delivery order, so two
//! events of one file never run at once and apply in publish order, while files on
//! other lanes proceed in parallel. A lane also remembers the highest stream sequence
//! it applied per key: a redelivered older event (e.g. one that was NAKed while a
//! newer one succeeded) is acked without being applied. Each message is acked only
//! after its handler says its writes are durable; long handlers send progress acks
//! so JetStream does not redeliver work that is still running.

use std::collections::HashMap;
use std::hash::{Hash as _, Hasher as _};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, pull};
use async_nats::jetstream::{self, AckKind};
use futures::StreamExt as _;
use futures::future::BoxFuture;
use kg_stores::StoreError;
use kg_stores::consumer::{ConsumerSpec, Delivery, Handled, backoff};
use kg_stores::error::StoreKind;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// What the lanes run for each message.
pub(crate) trait LaneHandler: Send + Sync + 'static {
    /// The ordering key of a message (messages with the same key share a lane);
    /// `None` for a payload that cannot be decoded (it is acked and dropped).
    fn key(&self, payload: &[u8]) -> Option<String>;
    /// Handles one message.
    fn handle<'a>(&'a self, delivery: Delivery<'a>) -> BoxFuture<'a, Handled>;
}

struct Job {
    message: jetstream::Message,
    key: String,
}

fn events_err(err: impl Into<kg_stores::error::BoxError>) -> StoreError {
    StoreError::Unavailable {
        store: StoreKind::Events,
        source: err.into(),
    }
}

/// The lane of a key: stable within the process.
fn lane_of(key: &str, lanes: usize) -> usize {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut hasher);
    usize::try_from(hasher.finish() % lanes.max(1) as u64).unwrap_or(0)
}

/// Consumes until `shutdown` with `lanes` concurrent lanes.
pub(crate) async fn run<H: LaneHandler>(
    js: &jetstream::Context,
    spec: &ConsumerSpec,
    lanes: usize,
    shutdown: CancellationToken,
    handler: Arc<H>,
) -> Result<(), StoreError> {
    let lanes = lanes.max(1);
    let stream = js.get_stream(&spec.stream).await.map_err(events_err)?;
    let consumer = stream
        .get_or_create_consumer(
            &spec.durable,
            pull::Config {
                durable_name: Some(spec.durable.clone()),
                filter_subject: spec.filter_subject.clone(),
                ack_policy: AckPolicy::Explicit,
                ack_wait: spec.ack_wait,
                max_deliver: spec.max_deliver,
                ..Default::default()
            },
        )
        .await
        .map_err(events_err)?;
    // Pull little ahead of the lanes: a buffered message's ack wait is already running.
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(lanes * 2)
        .messages()
        .await
        .map_err(events_err)?;

    // The lanes stop with the caller's token, or when this loop ends for any reason.
    let shutdown = shutdown.child_token();
    let mut senders = Vec::with_capacity(lanes);
    let mut workers = JoinSet::new();
    for lane in 0..lanes {
        let (tx, rx) = mpsc::channel::<Job>(1);
        senders.push(tx);
        workers.spawn(run_lane(
            lane,
            rx,
            Arc::clone(&handler),
            spec.clone(),
            shutdown.clone(),
        ));
    }

    let result = loop {
        let next = tokio::select! {
            _ = shutdown.cancelled() => break Ok(()),
            next = messages.next() => next,
        };
        let Some(message) = next else {
            break Err(events_err("message stream ended"));
        };
        let message = match message {
            Ok(m) => m,
            Err(err) => {
                tracing::warn!(error = %err, consumer = %spec.durable, "consumer error; continuing");
                continue;
            }
        };
        let Some(key) = handler.key(&message.payload) else {
            tracing::warn!(subject = %message.subject, "dropping undecodable event");
            if let Err(err) = message.ack().await {
                tracing::warn!(error = %err, "ack failed");
            }
            continue;
        };
        let lane = lane_of(&key, lanes);
        let sent = tokio::select! {
            _ = shutdown.cancelled() => break Ok(()),
            sent = senders[lane].send(Job { message, key }) => sent,
        };
        if sent.is_err() {
            break Err(events_err(format!("indexer lane {lane} stopped")));
        }
    };
    // Unacked messages in flight are redelivered to whoever consumes next.
    drop(senders);
    shutdown.cancel();
    while workers.join_next().await.is_some() {}
    result
}

async fn run_lane<H: LaneHandler>(
    lane: usize,
    mut jobs: mpsc::Receiver<Job>,
    handler: Arc<H>,
    spec: ConsumerSpec,
    shutdown: CancellationToken,
) {
    // Highest stream sequence applied per key, so an older redelivery never wins.
    let mut applied: HashMap<String, u64> = HashMap::new();
    loop {
        let job = tokio::select! {
            _ = shutdown.cancelled() => return,
            job = jobs.recv() => job,
        };
        let Some(Job { message, key }) = job else {
            return;
        };
        let (attempt, sequence) = message
            .info()
            .map(|i| (i.delivered, i.stream_sequence))
            .unwrap_or((1, 0));
        if let Some(&last) = applied.get(&key)
            && sequence < last
        {
            tracing::info!(lane, key = %key, sequence, last, "skipping an event older than one already applied");
            if let Err(err) = message.ack().await {
                tracing::warn!(error = %err, "ack failed");
            }
            continue;
        }
        let delivery = Delivery {
            subject: message.subject.as_str(),
            payload: &message.payload,
            attempt,
            last_attempt: attempt >= spec.max_deliver,
        };
        let work = handler.handle(delivery);
        tokio::pin!(work);
        // Tell JetStream the message is still being worked on, well before ack_wait.
        let mut progress = tokio::time::interval((spec.ack_wait / 3).max(Duration::from_secs(1)));
        progress.tick().await;
        let outcome = loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                outcome = &mut work => break outcome,
                _ = progress.tick() => {
                    if let Err(err) = message.ack_with(AckKind::Progress).await {
                        tracing::debug!(error = %err, "progress ack failed");
                    }
                }
            }
        };
        let acked = match outcome {
            Handled::Ack => {
                let entry = applied.entry(key).or_insert(sequence);
                *entry = (*entry).max(sequence);
                message.ack().await
            }
            Handled::Retry(reason) => {
                tracing::warn!(consumer = %spec.durable, lane, attempt, reason = %reason, "message will be redelivered");
                message.ack_with(AckKind::Nak(Some(backoff(attempt)))).await
            }
        };
        if let Err(err) = acked {
            tracing::warn!(error = %err, consumer = %spec.durable, "ack failed; the message will be redelivered");
        }
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
