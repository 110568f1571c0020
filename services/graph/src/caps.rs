//! Caps on package lists and result sizes. A package-list cap that is absent means the
//! default and an explicit 0 means an empty list; a result-size `limit` of 0 means the
//! default. Anything over its hard maximum fails closed.

use kg_proto::v1::PackageCaps;

use crate::error::{GraphError, Result};

/// Default and hard maximum of the number of packages one Open returns.
pub(crate) const OPEN_LIMIT: (u32, u32) = (8, 32);
/// Default and hard maximum of sections per Outline page.
pub(crate) const OUTLINE_LIMIT: (u32, u32) = (50, 200);
/// Most chunk keys one Packages call may name (the contract's limit).
pub(crate) const MAX_PACKAGE_KEYS: usize = kg_proto::limits::PACKAGE_KEYS_PER_CALL;
/// Longest key or file id accepted; real ones are far shorter.
pub(crate) const MAX_KEY_LEN: usize = kg_proto::limits::MAX_KEY_BYTES;

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

/// Resolves a result-size `limit` against `(default, max)`: 0 -> default (a page of
/// nothing is never what a caller means), over max -> an error naming the limit.
pub(crate) fn resolve(name: &str, value: u32, bounds: (u32, u32)) -> Result<usize> {
    resolve_cap(name, (value != 0).then_some(value), bounds)
}

/// Resolves a package-list cap against `(default, max)`: absent -> default, 0 -> an
/// empty list (the total is still counted), over max -> an error naming the cap.
pub(crate) fn resolve_cap(
    name: &str,
    value: Option<u32>,
    (default, max): (u32, u32),
) -> Result<usize> {
    let value = value.unwrap_or(default);
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
            mentions: resolve_cap("caps.mentions", caps.mentions, (8, 24))?,
            rel: resolve_cap("caps.rel", caps.rel, (8, 24))?,
            ancestors: resolve_cap("caps.ancestors", caps.ancestors, (6, 12))?,
            siblings: resolve_cap("caps.siblings", caps.siblings, (8, 24))?,
            children: resolve_cap("caps.children", caps.children, (8, 24))?,
            similar: resolve_cap("caps.similar", caps.similar, (4, 16))?,
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
    fn absent_means_default_zero_means_none_and_maxima_fail_closed() {
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
        assert_eq!(
            Caps::from_request(Some(&PackageCaps::default())).unwrap(),
            Caps::from_request(None).unwrap(),
            "every cap absent is every default"
        );
        let caps = Caps::from_request(Some(&PackageCaps {
            ancestors: Some(12),
            children: Some(1),
            mentions: Some(0),
            similar: Some(0),
            ..Default::default()
        }))
        .unwrap();
        assert_eq!(
            (
                caps.ancestors,
                caps.children,
                caps.mentions,
                caps.similar,
                caps.rel
            ),
            (12, 1, 0, 0, 8)
        );
        let err = Caps::from_request(Some(&PackageCaps {
            siblings: Some(25),
            ..Default::default()
        }))
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "caps.siblings = 25 is over its hard maximum of 24"
        );
        assert!(resolve("limit", 33, OPEN_LIMIT).is_err());
        assert_eq!(resolve("limit", 0, OUTLINE_LIMIT).unwrap(), 50);
        assert_eq!(resolve_cap("caps.rel", Some(0), (8, 24)).unwrap(), 0);
        assert_eq!(resolve_cap("caps.rel", None, (8, 24)).unwrap(), 8);
        assert!(resolve_cap("caps.rel", Some(25), (8, 24)).is_err());
    }

    #[test]
    fn keys_must_be_present_and_short() {
        assert!(check_key("chunk_key", "ch_1").is_ok());
        assert!(check_key("chunk_key", "").is_err());
        assert!(check_key("chunk_key", &"x".repeat(MAX_KEY_LEN + 1)).is_err());
    }
}
