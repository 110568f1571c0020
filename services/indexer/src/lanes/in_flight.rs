//! Progress acks for every message pulled and not yet settled.
//!
//! A message's ack wait starts when JetStream delivers it, not when a lane starts it: one
//! that waits behind a slow file would be redelivered while still pending here. Every
//! pulled message is tracked from the moment it arrives until it is acked, NAKed or
//! dropped, and one ticker sends each tracked message a progress ack (`+WPI`) well
//! inside the ack wait.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use futures::future::BoxFuture;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

/// Something that can be acked: a JetStream message (a recording double in unit tests).
pub(crate) trait Ackable: Clone + Send + Sync + 'static {
    /// Sends `kind` for this delivery.
    fn send_ack(&self, kind: AckKind) -> BoxFuture<'_, Result<(), async_nats::Error>>;
}

impl Ackable for jetstream::Message {
    fn send_ack(&self, kind: AckKind) -> BoxFuture<'_, Result<(), async_nats::Error>> {
        Box::pin(self.ack_with(kind))
    }
}

pub(crate) use kg_stores::consumer::progress_interval;

/// The messages pulled and not yet settled.
pub(crate) struct InFlight<M> {
    messages: Mutex<HashMap<u64, M>>,
    /// Held by a ticker pass while it sends and by [`Pending::settle`] while it removes
    /// its message, so no progress ack is ever sent after the final ack or NAK (a late
    /// `+WPI` would cut a NAK's backoff short).
    pass: tokio::sync::Mutex<()>,
    next_id: AtomicU64,
}

impl<M: Ackable> InFlight<M> {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            messages: Mutex::new(HashMap::new()),
            pass: tokio::sync::Mutex::new(()),
            next_id: AtomicU64::new(0),
        })
    }

    fn map(&self) -> MutexGuard<'_, HashMap<u64, M>> {
        match self.messages.lock() {
            Ok(map) => map,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Tracks `message` until the returned handle is settled or dropped. `permit` is
    /// its slot of the pull-ahead window, freed with it.
    pub(crate) fn track(
        self: &Arc<Self>,
        message: M,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Pending<M> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.map().insert(id, message.clone());
        Pending {
            id,
            message,
            set: Arc::clone(self),
            _permit: permit,
        }
    }

    /// How many messages are tracked.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map().len()
    }

    /// One progress ack to every tracked message.
    pub(crate) async fn send_progress(&self) {
        let _pass = self.pass.lock().await;
        let tracked: Vec<M> = self.map().values().cloned().collect();
        for message in &tracked {
            if let Err(err) = message.send_ack(AckKind::Progress).await {
                tracing::debug!(error = %err, "progress ack failed");
            }
        }
    }

    /// Sends progress acks every `every` until `shutdown`.
    pub(crate) async fn tick(self: Arc<Self>, every: Duration, shutdown: CancellationToken) {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is immediate; a message just pulled has its whole ack wait left.
        ticks.tick().await;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticks.tick() => self.send_progress().await,
            }
        }
    }
}

/// A tracked message. Dropping it unsettled (shutdown) stops its progress acks, so
/// JetStream redelivers it after the ack wait.
pub(crate) struct Pending<M: Ackable> {
    id: u64,
    message: M,
    set: Arc<InFlight<M>>,
    _permit: Option<OwnedSemaphorePermit>,
}

impl<M: Ackable> Pending<M> {
    /// The message.
    pub(crate) fn message(&self) -> &M {
        &self.message
    }

    /// Stops the progress acks, then sends the final `kind` (ack, NAK, term).
    pub(crate) async fn settle(self, kind: AckKind) -> Result<(), async_nats::Error> {
        {
            let _pass = self.set.pass.lock().await;
            self.set.map().remove(&self.id);
        }
        self.message.send_ack(kind).await
    }
}

impl<M: Ackable> Drop for Pending<M> {
    fn drop(&mut self) {
        self.set.map().remove(&self.id);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// Records every ack kind sent, in order, per message name.
    #[derive(Clone)]
    struct Recorder {
        name: &'static str,
        log: Arc<Mutex<Vec<(&'static str, String)>>>,
    }

    impl Ackable for Recorder {
        fn send_ack(&self, kind: AckKind) -> BoxFuture<'_, Result<(), async_nats::Error>> {
            let kind = match kind {
                AckKind::Ack => "ack".to_owned(),
                AckKind::Progress => "progress".to_owned(),
                other => format!("{other:?}"),
            };
            self.log.lock().unwrap().push((self.name, kind));
            Box::pin(async { Ok(()) })
        }
    }

    fn sent(log: &Arc<Mutex<Vec<(&'static str, String)>>>, name: &str) -> Vec<String> {
        log.lock()
            .unwrap()
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|(_, k)| k.clone())
            .collect()
    }

    #[tokio::test]
    async fn progress_goes_to_tracked_messages_until_they_settle_or_drop() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let set = InFlight::new();
        let message = |name| Recorder {
            name,
            log: Arc::clone(&log),
        };
        let a = set.track(message("a"), None);
        let b = set.track(message("b"), None);
        let c = set.track(message("c"), None);
        assert_eq!(set.len(), 3);
        set.send_progress().await;
        a.settle(AckKind::Ack).await.unwrap();
        b.settle(AckKind::Nak(Some(Duration::from_secs(4))))
            .await
            .unwrap();
        drop(c);
        assert_eq!(set.len(), 0, "nothing stays tracked");
        set.send_progress().await;
        assert_eq!(sent(&log, "a"), ["progress", "ack"]);
        assert_eq!(sent(&log, "b"), ["progress", "Nak(Some(4s))"]);
        assert_eq!(sent(&log, "c"), ["progress"]);
    }

    #[tokio::test]
    async fn the_ticker_repeats_and_stops_on_shutdown() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let set = InFlight::new();
        let _a = set.track(
            Recorder {
                name: "a",
                log: Arc::clone(&log),
            },
            None,
        );
        let stop = CancellationToken::new();
        let ticker = tokio::spawn(Arc::clone(&set).tick(Duration::from_millis(20), stop.clone()));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(sent(&log, "a").len() >= 3, "{:?}", sent(&log, "a"));
        stop.cancel();
        ticker.await.unwrap();
        let after_stop = sent(&log, "a").len();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(sent(&log, "a").len(), after_stop);
        assert_eq!(
            progress_interval(Duration::from_secs(30)),
            Duration::from_secs(10)
        );
        assert_eq!(
            progress_interval(Duration::ZERO),
            Duration::from_millis(100)
        );
    }
}
