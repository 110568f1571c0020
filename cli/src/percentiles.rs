//! Nearest-rank percentiles for the benchmark binaries' reports.

/// p50, p95, p99 and the mean of a sample, in the sample's unit.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Arithmetic mean.
    pub mean: f64,
}

impl Summary {
    /// Nearest-rank percentiles of `values` (NaN when there are none).
    pub fn of(mut values: Vec<f64>) -> Self {
        values.sort_by(f64::total_cmp);
        let rank = |p: f64| {
            if values.is_empty() {
                return f64::NAN;
            }
            let index = ((p * values.len() as f64).ceil() as usize).clamp(1, values.len()) - 1;
            values[index]
        };
        Self {
            p50: rank(0.50),
            p95: rank(0.95),
            p99: rank(0.99),
            mean: values.iter().sum::<f64>() / values.len().max(1) as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Summary;

    #[test]
    fn nearest_rank_percentiles() {
        let summary = Summary::of((1..=100).rev().map(f64::from).collect());
        assert_eq!(
            (summary.p50, summary.p95, summary.p99, summary.mean),
            (50.0, 95.0, 99.0, 50.5)
        );
        assert!(Summary::of(Vec::new()).p50.is_nan());
    }
}
