//! Lock poisoning, decided once: a thread that panicked while holding one of our locks leaves state that is
//! still consistent (no invariant spans a point that can panic, and nothing may panic on peer input), so a
//! poisoned lock, condvar wait or `into_inner` is taken as it is rather than spreading the panic.

#![forbid(unsafe_code)]

use std::sync::{LockResult, PoisonError};

pub trait Unpoison<T> {
    /// The guard (or value) whether or not the lock was poisoned.
    fn unpoison(self) -> T;
}

impl<T> Unpoison<T> for LockResult<T> {
    fn unpoison(self) -> T {
        self.unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn a_lock_poisoned_by_a_panicking_holder_is_still_taken() {
        let m = Arc::new(Mutex::new(7));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(*m.lock().unpoison(), 7);
    }
}
