//! What this process waits for before it is ready again: parts that run beside the services
//! in one process (the embedded stores of `kgmesh up`) mark themselves down while they are
//! restarted, and the gateway's `/ready` names them. Services deployed on their own never mark
//! anything, and their readiness is their own health checks'.

use std::collections::BTreeSet;
use std::sync::{LazyLock, Mutex};

static DOWN: LazyLock<Mutex<BTreeSet<&'static str>>> = LazyLock::new(Mutex::default);

/// `name` is down until [`mark_up`].
pub fn mark_down(name: &'static str) {
    if let Ok(mut down) = DOWN.lock() {
        down.insert(name);
    }
}

/// `name` is running again.
pub fn mark_up(name: &'static str) {
    if let Ok(mut down) = DOWN.lock() {
        down.remove(name);
    }
}

/// What is down now, by name.
pub fn down() -> Vec<&'static str> {
    DOWN.lock()
        .map(|down| down.iter().copied().collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_part_is_down_until_marked_up() {
        mark_down("falkordb");
        mark_down("falkordb");
        assert!(down().contains(&"falkordb"));
        mark_up("falkordb");
        assert!(!down().contains(&"falkordb"));
    }
}
