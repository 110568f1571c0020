//! How long a search's lanes, or an entity search's sides, may run. They share one instant:
//! the time the caller allows (its gRPC deadline, within the server's own bound) less a
//! reserve for fusing and answering. A lane still running then soft-fails with `timeout`,
//! so one slow part (an embedding endpoint retrying, a store that stopped answering) costs
//! its own lane, and the others still answer inside the caller's deadline instead of the
//! whole call failing at it.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Result, RetrievalError};

/// When the lanes of a call allowed `allowed` from now must have finished.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LaneDeadline {
    at: Instant,
    budget: Duration,
}

impl LaneDeadline {
    /// A tenth of `allowed` is kept back, within 50 ms and 1 s, for fusing and answering
    /// ([`kg_common::grpc::work_budget`]).
    pub(crate) fn within(allowed: Duration) -> Self {
        let budget = kg_common::grpc::work_budget(allowed);
        Self {
            at: Instant::now() + budget,
            budget,
        }
    }

    /// Runs `work` until the deadline; past it the work is dropped (the stores' clients
    /// pipeline requests, so a dropped one leaves their connections usable) and the result
    /// is [`RetrievalError::OutOfTime`].
    pub(crate) async fn run<T>(self, work: impl Future<Output = Result<T>>) -> Result<T> {
        // Boxed: a lane's future is deep, and the search holds several at once; on the
        // stack they overflowed a 2 MiB test thread in a debug build.
        match tokio::time::timeout_at(self.at, Box::pin(work)).await {
            Ok(result) => result,
            Err(_elapsed) => Err(RetrievalError::OutOfTime {
                budget_ms: u64::try_from(self.budget.as_millis()).unwrap_or(u64::MAX),
            }),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use kg_common::error::{ErrorCode, ErrorExt as _};

    use super::*;

    #[test]
    fn a_tenth_is_kept_back_within_bounds() {
        let budget = |ms| LaneDeadline::within(Duration::from_millis(ms)).budget;
        assert_eq!(budget(20_000), Duration::from_millis(19_000));
        assert_eq!(budget(30_000), Duration::from_millis(29_000), "at most 1 s");
        assert_eq!(budget(2_000), Duration::from_millis(1_800));
        assert_eq!(budget(100), Duration::from_millis(50), "at least 50 ms");
        assert_eq!(budget(10), Duration::ZERO, "nothing left to run in");
    }

    #[tokio::test(start_paused = true)]
    async fn work_past_the_deadline_is_out_of_time() {
        let deadline = LaneDeadline::within(Duration::from_secs(2));
        let quick = deadline.run(async { Ok(7) }).await.unwrap();
        assert_eq!(quick, 7);
        let slow = deadline
            .run(async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                Ok(())
            })
            .await
            .unwrap_err();
        assert_eq!(slow.code(), ErrorCode::Timeout);
        assert!(matches!(
            slow,
            RetrievalError::OutOfTime { budget_ms: 1800 }
        ));
    }
}
