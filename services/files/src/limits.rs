//! Budgets and caps of the file tools (`FindFiles`, `QueryFile`).

use std::time::Duration;

/// Largest `result_json` of one call (the gateway's per-call result limit).
pub const MAX_RESULT_BYTES: usize = 1024 * 1024;

/// Budgets of `FindFiles` content scans and `QueryFile` queries. The
/// defaults follow the kg_file / kg_files specification; tests shrink them.
#[derive(Debug, Clone)]
pub struct QueryLimits {
    /// Files larger than this answer only metadata and `text` line windows;
    /// content scans skip them.
    pub max_query_file_bytes: u64,
    /// Wall-clock budget of one `FindFiles` content scan.
    pub scan_time: Duration,
    /// Blob bytes one `FindFiles` content scan may read.
    pub scan_bytes: u64,
    /// Time limit of one SQL statement, reading the file included.
    pub sql_timeout: Duration,
    /// Memory the SQL engine may hold at once, shared by concurrent statements.
    pub sql_memory_bytes: usize,
    /// Time limit of an in-file regex scan and of a JSONata evaluation.
    pub eval_timeout: Duration,
    /// Instructions one Jinja render may run.
    pub jinja_fuel: u64,
    /// Largest `result_json`.
    pub max_result_bytes: usize,
}

impl Default for QueryLimits {
    fn default() -> Self {
        Self {
            max_query_file_bytes: 10 * 1024 * 1024,
            scan_time: Duration::from_secs(2),
            scan_bytes: 64 * 1024 * 1024,
            sql_timeout: Duration::from_secs(5),
            sql_memory_bytes: 512 * 1024 * 1024,
            eval_timeout: Duration::from_secs(2),
            jinja_fuel: 1_000_000,
            max_result_bytes: MAX_RESULT_BYTES,
        }
    }
}

/// A duration as people write it in messages: "2s", "500ms".
pub(crate) fn human_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 && d.as_secs() > 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// A byte count as people write it in messages: "64 MiB", "10 KiB", "300 bytes".
pub(crate) fn human_bytes(n: u64) -> String {
    const MIB: u64 = 1024 * 1024;
    if n >= MIB && n.is_multiple_of(MIB) {
        format!("{} MiB", n / MIB)
    } else if n >= 1024 && n.is_multiple_of(1024) {
        format!("{} KiB", n / 1024)
    } else {
        format!("{n} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_units() {
        assert_eq!(human_duration(Duration::from_secs(2)), "2s");
        assert_eq!(human_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(human_bytes(64 * 1024 * 1024), "64 MiB");
        assert_eq!(human_bytes(4096), "4 KiB");
        assert_eq!(human_bytes(1000), "1000 bytes");
    }
}
