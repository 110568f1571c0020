//! [`PriorityGate`]: the slots in which embedding batches run, handed out query first.
//!
//! A search embeds one short text; the indexer embeds documents in batches that take
//! seconds on a CPU. Every batch takes a slot for its run only, so a waiting query gets
//! the next free slot ahead of every ingest batch that has not started yet and never
//! waits behind more than the batches already running. Queries are tiny, and after
//! [`QUERY_STREAK`] queries in a row a waiting ingest batch goes first, so a stream of
//! searches cannot stall indexing.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

use crate::EmbedError;

/// Query grants in a row, while ingest batches wait, before one ingest batch goes first.
pub const QUERY_STREAK: usize = 8;

/// Who is waiting for an embedding: decides the order of waiting batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Priority {
    /// A search's query text or entity names: latency matters, the texts are few.
    Query,
    /// Chunks of indexed documents: throughput matters.
    Ingest,
}

#[derive(Debug)]
struct State {
    /// Slots nobody holds; while it is above zero nobody waits.
    free: usize,
    queries: VecDeque<oneshot::Sender<Slot>>,
    ingest: VecDeque<oneshot::Sender<Slot>>,
    /// Queries granted in a row since the last ingest grant.
    streak: usize,
}

/// A bounded set of slots in which embedding batches run; cheap to clone.
#[derive(Debug, Clone)]
pub struct PriorityGate {
    state: Arc<Mutex<State>>,
}

/// A held slot; dropping it hands the slot to the next waiter.
#[derive(Debug)]
pub struct Slot {
    state: Option<Arc<Mutex<State>>>,
}

impl PriorityGate {
    /// A gate of `slots` concurrent batches (at least 1).
    pub fn new(slots: usize) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                free: slots.max(1),
                queries: VecDeque::new(),
                ingest: VecDeque::new(),
                streak: 0,
            })),
        }
    }

    /// Waits for a slot: queries before ingest batches, each kind in arrival order.
    pub async fn acquire(&self, priority: Priority) -> Result<Slot, EmbedError> {
        let waiting = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            if state.free > 0 {
                state.free -= 1;
                return Ok(Slot {
                    state: Some(Arc::clone(&self.state)),
                });
            }
            let (tx, rx) = oneshot::channel();
            match priority {
                Priority::Query => state.queries.push_back(tx),
                Priority::Ingest => state.ingest.push_back(tx),
            }
            rx
        };
        // The sender lives in the state this gate holds, so it only goes away with a grant.
        waiting
            .await
            .map_err(|_| EmbedError::Inference("the embedder is shutting down".to_owned()))
    }

    /// Runs `batches` one slot each on the blocking pool, in order, and returns their
    /// outputs in the same order. Between two batches the slot goes back to the gate,
    /// so a query arriving mid-stream runs before the next ingest batch.
    pub async fn run_blocking<B, T, F>(
        &self,
        priority: Priority,
        batches: Vec<B>,
        work: F,
    ) -> Result<Vec<T>, EmbedError>
    where
        B: Send + 'static,
        T: Send + 'static,
        F: Fn(B) -> Result<T, EmbedError> + Send + Sync + 'static,
    {
        let work = Arc::new(work);
        let mut out = Vec::with_capacity(batches.len());
        for batch in batches {
            let slot = self.acquire(priority).await?;
            let work = Arc::clone(&work);
            let result = tokio::task::spawn_blocking(move || work(batch))
                .await
                .map_err(|e| EmbedError::Inference(format!("embedding task failed: {e}")));
            drop(slot);
            out.push(result??);
        }
        Ok(out)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let Some(shared) = self.state.take() else {
            return;
        };
        let mut state = shared.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let ingest_turn = !state.ingest.is_empty()
                && (state.queries.is_empty() || state.streak >= QUERY_STREAK);
            let (next, is_query) = if ingest_turn {
                (state.ingest.pop_front(), false)
            } else {
                (state.queries.pop_front(), true)
            };
            let Some(next) = next else {
                state.free += 1;
                return;
            };
            match next.send(Slot {
                state: Some(Arc::clone(&shared)),
            }) {
                Ok(()) => {
                    state.streak = if is_query { state.streak + 1 } else { 0 };
                    return;
                }
                // That waiter gave up; its slot must not release again while we hold the lock.
                Err(mut unclaimed) => unclaimed.state = None,
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Lets queued acquirers register before the test goes on.
    async fn settle() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    /// Queues `who` on `gate` one after the other; each sends its id when granted.
    async fn queue(
        gate: &PriorityGate,
        who: &[(Priority, usize)],
    ) -> (
        tokio::sync::mpsc::UnboundedReceiver<usize>,
        Vec<tokio::task::JoinHandle<()>>,
    ) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut handles = Vec::new();
        for &(priority, id) in who {
            let gate = gate.clone();
            let tx = tx.clone();
            handles.push(tokio::spawn(async move {
                let _slot = gate.acquire(priority).await.unwrap();
                tx.send(id).unwrap();
            }));
            settle().await;
        }
        (rx, handles)
    }

    #[tokio::test]
    async fn a_waiting_query_gets_the_next_slot_before_earlier_ingest() {
        let gate = PriorityGate::new(1);
        let held = gate.acquire(Priority::Ingest).await.unwrap();
        let who = [
            (Priority::Ingest, 1),
            (Priority::Ingest, 2),
            (Priority::Query, 3),
            (Priority::Query, 4),
        ];
        let (mut rx, handles) = queue(&gate, &who).await;
        drop(held);
        for h in handles {
            h.await.unwrap();
        }
        let order: Vec<usize> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        assert_eq!(order, [3, 4, 1, 2]);
    }

    #[tokio::test]
    async fn queries_cannot_starve_ingest_and_cancelled_waiters_release() {
        let gate = PriorityGate::new(1);
        let held = gate.acquire(Priority::Query).await.unwrap();
        // A waiter that gives up must not take the slot with it.
        let cancelled = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.acquire(Priority::Ingest).await.map(drop) })
        };
        settle().await;
        cancelled.abort();
        let mut who = vec![(Priority::Ingest, 100)];
        who.extend((0..2 * QUERY_STREAK).map(|i| (Priority::Query, i)));
        let (mut rx, handles) = queue(&gate, &who).await;
        drop(held);
        for h in handles {
            h.await.unwrap();
        }
        let order: Vec<usize> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
        let ingest_at = order.iter().position(|&id| id == 100).unwrap();
        assert_eq!(ingest_at, QUERY_STREAK, "{order:?}");
        // Every slot came back: the gate is free again.
        let _again = tokio::time::timeout(Duration::from_secs(1), gate.acquire(Priority::Ingest))
            .await
            .unwrap()
            .unwrap();
    }
}
