//! Caps on package lists and result sizes: 0 means the default, over the hard maximum fails.

use kg_proto::v1::PackageCaps;

use crate::error::{GraphError, Result};

/// Default and hard maximum of the number of packages one Open returns.
pub(crate) const OPEN_LIMIT: (u32, u32) = (8, 32);
/// Default and hard maximum of sections per Outline page.
pub(crate) const OUTLINE_LIMIT: (u32, u32) = (50, 200);
/// Most chunk keys one Packages call may name (the top-k hard maximum).
pub(crate) const MAX_PACKAGE_KEYS: usize = 32;
/// Longest key or file id accepted; real ones are far shorter.
pub(crate) const MAX_KEY_LEN: usize = 256;

/// Per-package list caps after defaults were applied and maxima checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Caps {
    pub(crate) ancestors: usize,
    pub(crate) siblings: usize,
    pub(crate) children: usize,
    // Entities arrive in a later release; their caps are validated now so a
    // request that works today keeps working then.
    pub(crate) mentions: usize,
    pub(crate) rel: usize,
    pub(crate) similar: usize,
}

/// Resolves `value` against `(default, max)`: 0 -> default, over max -> an error naming the cap.
pub(crate) fn resolve(name: &str, value: u32, (default, max): (u32, u32)) -> Result<usize> {
    let value = if value == 0 { default } else { value };
    if value > max {
        return Err(GraphError::invalid(format!(
            "{name} = {value} is over its hard maximum of {max}"
        )));
    }
    Ok(value as usize)
}

impl Caps {
    pub(crate) fn from_request(caps: Option<&PackageCaps>) -> Result<Self> {
        let caps = caps.copied().unwrap_or_default();
        Ok(Self {
            mentions: resolve("caps.mentions", caps.mentions, (8, 24))?,
            rel: resolve("caps.rel", caps.rel, (8, 24))?,
            ancestors: resolve("caps.ancestors", caps.ancestors, (6, 12))?,
            siblings: resolve("caps.siblings", caps.siblings, (8, 24))?,
            children: resolve("caps.children", caps.children, (8, 24))?,
            similar: resolve("caps.similar", caps.similar, (4, 16))?,
        })
    }
}

/// Checks a key or id from a request.
pub(crate) fn check_key(name: &str, key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(GraphError::invalid(format!("{name} is empty")));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(GraphError::invalid(format!(
            "{name} is longer than {MAX_KEY_LEN} bytes"
        )));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn zero_means_default_and_maxima_fail_closed() {
        let caps = Caps::from_request(None).unwrap();
        assert_eq!(
            (
                caps.ancestors,
                caps.siblings,
                caps.children,
                caps.mentions,
                caps.rel,
                caps.similar
            ),
            (6, 8, 8, 8, 8, 4)
        );
        let caps = Caps::from_request(Some(&PackageCaps {
            ancestors: 12,
            children: 1,
            ..Default::default()
        }))
        .unwrap();
        assert_eq!((caps.ancestors, caps.children), (12, 1));
        let err = Caps::from_request(Some(&PackageCaps {
            siblings: 25,
            ..Default::default()
        }))
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "caps.siblings = 25 is over its hard maximum of 24"
        );
        assert!(resolve("limit", 33, OPEN_LIMIT).is_err());
        assert_eq!(resolve("limit", 0, OUTLINE_LIMIT).unwrap(), 50);
    }

    #[test]
    fn keys_must_be_present_and_short() {
        assert!(check_key("chunk_key", "ch_1").is_ok());
        assert!(check_key("chunk_key", "").is_err());
        assert!(check_key("chunk_key", &"x".repeat(MAX_KEY_LEN + 1)).is_err());
    }
}
