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

/// Runs `handler` on every message until `shutdown` fires. A message is acked
/// only after the handler returns `Ack`, i.e. after its writes are durable.
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
    let stream = js
        .get_stream(&spec.stream)
        .await
        .map_err(|e| StoreError::unavailable(StoreKind::Events, e))?;
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
        .map_err(|e| StoreError::unavailable(StoreKind::Events, e))?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| StoreError::unavailable(StoreKind::Events, e))?;
    loop {
        let next = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            next = messages.next() => next,
        };
        let Some(message) = next else {
            return Err(StoreError::unavailable(
                StoreKind::Events,
                "message stream ended",
            ));
        };
        let message = match message {
            Ok(m) => m,
            Err(err) => {
                tracing::warn!(error = %err, consumer = %spec.durable, "consumer error; continuing");
                continue;
            }
        };
        let (attempt, sequence) = message
            .info()
            .map(|i| (i.delivered, i.stream_sequence))
            .unwrap_or((1, 0));
        let outcome = handler(Delivery {
            subject: message.subject.as_str(),
            payload: &message.payload,
            attempt,
            last_attempt: attempt >= spec.max_deliver,
            sequence,
        })
        .await;
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
