//! The one helper for `std::sync::Mutex` in this crate.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, ignoring poison: the data a panicking holder left is still the best there is (every
/// lock here guards caches and counters that the next writer makes whole again).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
