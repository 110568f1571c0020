//! A durable JetStream pull consumer loop with explicit acks, bounded
//! redelivery with backoff, and a hook for messages that ran out of deliveries.

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, pull};
use async_nats::jetstream::{self, AckKind};
use futures::StreamExt as _;
use tokio_util::sync::CancellationToken;

use crate::StoreError;
use crate::error::StoreKind;

/// How a durable consumer is set up.
#[derive(Debug, Clone)]
pub struct ConsumerSpec {
    /// Stream to read.
    pub stream: String,
    /// Durable consumer name (shared by every replica of a worker).
    pub durable: String,
    /// Subject filter inside the stream.
    pub filter_subject: String,
    /// Deliveries before a message is given up on.
    pub max_deliver: i64,
    /// How long a message may be worked on before it is redelivered.
    pub ack_wait: Duration,
}

/// What the handler decided about one message.
pub enum Handled {
    /// Done: acknowledge.
    Ack,
    /// Failed in a way a retry may fix: redeliver after a backoff.
    Retry(String),
}

/// Delivery facts the handler may need.
pub struct Delivery<'a> {
    /// The message subject.
    pub subject: &'a str,
    /// Payload bytes.
    pub payload: &'a [u8],
    /// 1 for the first delivery.
    pub attempt: i64,
    /// True on the last delivery the consumer will make.
    pub last_attempt: bool,
    /// The message's sequence in its stream (0 if the server did not say): events of one
    /// stream are ordered by it whichever subject and consumer they arrive on.
    pub sequence: u64,
}

/// Backoff before redelivery `attempt` (1-based): 1 s, 2 s, 4 s ... up to 60 s.
pub fn backoff(attempt: i64) -> Duration {
    let exp = u32::try_from(attempt.clamp(1, 7) - 1).unwrap_or(0);
    Duration::from_secs(2u64.pow(exp).min(60))
}

/// Pause before the consumer is opened again after an error, so a broken bus is not spun on.
const REOPEN_PAUSE: Duration = Duration::from_secs(1);
/// Each pull request lives 5 s and the server sends a heartbeat every idle second, so a
/// consumer the server no longer has (NATS restarted without its state) shows as missed
/// heartbeats within about 2 s. With the client's defaults (30 s, 15 s) the files service
/// went on waiting 15 s after such a restart before its consumer was opened again, and
/// every upload's status read `pending` until then.
const PULL_EXPIRES: Duration = Duration::from_secs(5);
const PULL_HEARTBEAT: Duration = Duration::from_secs(1);
/// Messages asked for at a time. The handler takes one at a time, and what a process pulled
/// and had not handled when it died waits out its ack wait before it is delivered again: with
/// the client's default of 200, a files service killed under load left outcomes of files
/// already searchable `pending` for the whole ack wait.
const PULL_BATCH: usize = 8;

/// The progress-ack interval for a consumer whose ack wait is `ack_wait`: a third of it,
/// so two progress acks can be lost before JetStream gives up on a message.
pub fn progress_interval(ack_wait: Duration) -> Duration {
    (ack_wait / 3).max(Duration::from_millis(100))
}

/// The messages of `consumer`, pulled as [`PULL_EXPIRES`], [`PULL_HEARTBEAT`] and
/// [`PULL_BATCH`] say.
async fn pull_messages(
    consumer: &jetstream::consumer::Consumer<pull::Config>,
) -> Result<pull::Stream, StoreError> {
    consumer
        .stream()
        .max_messages_per_batch(PULL_BATCH)
        .expires(PULL_EXPIRES)
        .heartbeat(PULL_HEARTBEAT)
        .messages()
        .await
        .map_err(|e| StoreError::unavailable(StoreKind::Events, e))
}

/// Opens the durable consumer `spec` names, creating it, and its stream, when missing. The
/// stream is made again (with [`crate::events::ensure_streams`]) when the server lost it: NATS
/// restarted without its state, or someone deleted it. Idempotent; every replica calls it.
pub async fn open(
    js: &jetstream::Context,
    spec: &ConsumerSpec,
) -> Result<jetstream::consumer::Consumer<pull::Config>, StoreError> {
    Ok(open_with_incarnation(js, spec).await?.0)
}

/// [`open`], and when the consumer's stream was created (Unix nanoseconds): its stream
/// sequences count from 1 again each time it is made again, so a sequence recorded under one
/// incarnation says nothing about another.
pub async fn open_with_incarnation(
    js: &jetstream::Context,
    spec: &ConsumerSpec,
) -> Result<(jetstream::consumer::Consumer<pull::Config>, i64), StoreError> {
    let stream = crate::events::stream(js, &spec.stream).await?;
    let incarnation = crate::events::incarnation_of(&stream);
    let config = pull::Config {
        durable_name: Some(spec.durable.clone()),
        filter_subject: spec.filter_subject.clone(),
        ack_policy: AckPolicy::Explicit,
        ack_wait: spec.ack_wait,
        max_deliver: spec.max_deliver,
        ..Default::default()
    };
    let mut consumer = stream
        .get_or_create_consumer(&spec.durable, config.clone())
        .await
        .map_err(|e| StoreError::unavailable(StoreKind::Events, e))?;
    // A durable made by an earlier release keeps the settings it was made with: brought to
    // this one's (a shorter ack wait is how soon a delivery lost with its process is made
    // again). On a server that refuses, the old ones stay; callers pace by the shorter wait.
    let made = &consumer.cached_info().config;
    if made.ack_wait != spec.ack_wait || made.max_deliver != spec.max_deliver {
        match stream.update_consumer(config).await {
            Ok(updated) => consumer = updated,
            Err(err) => {
                tracing::warn!(error = %err, consumer = %spec.durable, "could not bring the consumer's ack wait and deliveries to this release's; keeping the old ones");
            }
        }
    }
    Ok((consumer, incarnation))
}

/// The ack wait `consumer` runs with: the server's, when it holds a shorter one than `spec`
/// (a durable an earlier release made, on a server that refused the update).
pub fn effective_ack_wait(
    consumer: &jetstream::consumer::Consumer<pull::Config>,
    spec: &ConsumerSpec,
) -> Duration {
    let made = consumer.cached_info().config.ack_wait;
    if made.is_zero() {
        spec.ack_wait
    } else {
        made.min(spec.ack_wait)
    }
}

/// Waits `delay` unless `shutdown` comes first; false on shutdown.
pub async fn pause(delay: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        _ = shutdown.cancelled() => false,
        _ = tokio::time::sleep(delay) => true,
    }
}

/// Runs `handler` on every message until `shutdown` fires. A message is acked
/// only after the handler returns `Ack`, i.e. after its writes are durable. When the
/// consumer errs or its messages end (NATS restarted, or lost the consumer with its state),
/// it is opened again, and made again if it is gone, after a short pause: a lost bus heals
/// without a restart of this process.
pub async fn run<F, Fut>(
    js: &jetstream::Context,
    spec: &ConsumerSpec,
    shutdown: CancellationToken,
    mut handler: F,
) -> Result<(), StoreError>
where
    F: FnMut(Delivery<'_>) -> Fut,
    Fut: Future<Output = Handled>,
{
    let consumer = open(js, spec).await?;
    let mut progress_every = progress_interval(effective_ack_wait(&consumer, spec));
    let mut messages = pull_messages(&consumer).await?;
    loop {
        let next = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            next = messages.next() => next,
        };
        let message = match next {
            Some(Ok(message)) => message,
            failed => {
                match failed {
                    Some(Err(err)) => {
                        tracing::warn!(error = %err, consumer = %spec.durable, "consumer error; opening it again");
                    }
                    _ => {
                        tracing::warn!(consumer = %spec.durable, "the consumer's messages ended; opening it again");
                    }
                }
                loop {
                    if !pause(REOPEN_PAUSE, &shutdown).await {
                        return Ok(());
                    }
                    let reopened = match open(js, spec).await {
                        Ok(consumer) => {
                            progress_every = progress_interval(effective_ack_wait(&consumer, spec));
                            pull_messages(&consumer).await
                        }
                        Err(err) => Err(err),
                    };
                    match reopened {
                        Ok(reopened) => {
                            messages = reopened;
                            break;
                        }
                        Err(err) => {
                            tracing::warn!(error = %err.detail(), consumer = %spec.durable, "opening the consumer failed; trying again");
                        }
                    }
                }
                continue;
            }
        };
        let (attempt, sequence) = message
            .info()
            .map(|i| (i.delivered, i.stream_sequence))
            .unwrap_or((1, 0));
        let handling = handler(Delivery {
            subject: message.subject.as_str(),
            payload: &message.payload,
            attempt,
            last_attempt: attempt >= spec.max_deliver,
            sequence,
        });
        // While the handler works (a store that is slow or down, a purge waiting for events
        // still running), the server is told it is in progress, so the ack wait can stay
        // short: it is how long a delivery lost with its process waits to be made again.
        tokio::pin!(handling);
        let mut progress =
            tokio::time::interval_at(tokio::time::Instant::now() + progress_every, progress_every);
        let outcome = loop {
            tokio::select! {
                outcome = &mut handling => break outcome,
                _ = progress.tick() => {
                    if let Err(err) = message.ack_with(AckKind::Progress).await {
                        tracing::debug!(error = %err, consumer = %spec.durable, "progress ack failed");
                    }
                }
            }
        };
        let acked = match outcome {
            Handled::Ack => message.ack().await,
            Handled::Retry(reason) => {
                tracing::warn!(consumer = %spec.durable, attempt, reason = %reason, "message will be redelivered");
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
    fn backoff_grows_and_is_capped() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(2), Duration::from_secs(2));
        assert_eq!(backoff(4), Duration::from_secs(8));
        assert_eq!(backoff(100), Duration::from_secs(60));
    }
}
