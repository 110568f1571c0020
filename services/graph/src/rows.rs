//! Typed access to the JSON cells of a FalkorDB result row.

use serde_json::Value;

use crate::error::{GraphError, Result};

/// One result row; cells are addressed by the column position of the RETURN clause.
pub(crate) struct Row<'a>(pub(crate) &'a [Value]);

impl<'a> Row<'a> {
    fn cell(&self, i: usize) -> &'a Value {
        self.0.get(i).unwrap_or(&Value::Null)
    }

    fn bad(i: usize, want: &str, got: &Value) -> GraphError {
        GraphError::UnexpectedReply(format!("column {i}: expected {want}, got {got}"))
    }

    pub(crate) fn str(&self, i: usize) -> Result<&'a str> {
        let cell = self.cell(i);
        cell.as_str().ok_or_else(|| Self::bad(i, "a string", cell))
    }

    /// A string property that may be absent (FalkorDB returns null for missing properties).
    pub(crate) fn opt_str(&self, i: usize) -> Result<Option<&'a str>> {
        match self.cell(i) {
            Value::Null => Ok(None),
            cell => cell
                .as_str()
                .map(Some)
                .ok_or_else(|| Self::bad(i, "a string", cell)),
        }
    }

    pub(crate) fn int(&self, i: usize) -> Result<i64> {
        let cell = self.cell(i);
        cell.as_i64()
            .ok_or_else(|| Self::bad(i, "an integer", cell))
    }

    pub(crate) fn opt_int(&self, i: usize) -> Result<Option<i64>> {
        match self.cell(i) {
            Value::Null => Ok(None),
            cell => cell
                .as_i64()
                .map(Some)
                .ok_or_else(|| Self::bad(i, "an integer", cell)),
        }
    }

    pub(crate) fn list(&self, i: usize) -> Result<&'a [Value]> {
        match self.cell(i) {
            Value::Null => Ok(&[]),
            cell => cell
                .as_array()
                .map(Vec::as_slice)
                .ok_or_else(|| Self::bad(i, "a list", cell)),
        }
    }
}

/// Counts are never negative; a negative one means a broken reply.
pub(crate) fn to_u64(value: i64) -> Result<u64> {
    u64::try_from(value).map_err(|_| GraphError::UnexpectedReply(format!("negative count {value}")))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn cells_decode_or_fail_loudly() {
        let cells = [json!("a"), json!(3), Value::Null, json!([[1, "x"]])];
        let row = Row(&cells);
        assert_eq!(row.str(0).unwrap(), "a");
        assert_eq!(row.int(1).unwrap(), 3);
        assert_eq!(row.opt_str(2).unwrap(), None);
        assert_eq!(row.opt_int(2).unwrap(), None);
        assert_eq!(row.list(3).unwrap().len(), 1);
        assert!(row.list(2).unwrap().is_empty());
        assert!(row.str(1).is_err());
        assert!(row.int(0).is_err());
        assert!(row.str(9).is_err());
        assert!(to_u64(-1).is_err());
    }
}
