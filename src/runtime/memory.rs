//! Handing back the memory a configuration's reading freed. Reading a large file takes far more
//! than the configuration keeps (a million API keys: 107 MB of YAML, about 0.9 GB at the peak
//! of its parse, about 0.1 GB kept), and the binary's allocator (mimalloc) returns a thread's
//! freed pages to the system only when that thread allocates again: the thread that read the
//! file, gone idle, would hold them for as long as it stays so. So after each reading (at
//! start and on each reload) and after a reload lets the configuration it replaced go, the
//! thread's freed pages are handed back at once, with those of threads that have ended (the
//! binary reads the configuration it starts with on a thread of its own for this), by the
//! means the binary that chose the allocator names ([`set_hand_back`]): this library knows no
//! allocator and holds no `unsafe` code.

use std::sync::OnceLock;

/// How the process's allocator hands back a thread's freed memory.
static HAND_BACK: OnceLock<fn()> = OnceLock::new();

/// Names how the process's allocator hands back the calling thread's freed memory; the first
/// call wins. Without one (the test binaries), [`hand_back_freed`] does nothing.
pub fn set_hand_back(hand_back: fn()) {
    let _ = HAND_BACK.set(hand_back);
}

/// Hands back the calling thread's freed memory, and that of threads that have ended.
pub fn hand_back_freed() {
    if let Some(hand_back) = HAND_BACK.get() {
        hand_back();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static CALLS: AtomicUsize = AtomicUsize::new(0);

    fn count() {
        CALLS.fetch_add(1, Ordering::Relaxed);
    }

    fn named_second() {
        panic!("the first hand-back named is the one called");
    }

    #[test]
    fn the_first_hand_back_named_is_called_each_time() {
        set_hand_back(count);
        set_hand_back(named_second);
        let before = CALLS.load(Ordering::Relaxed);
        hand_back_freed();
        hand_back_freed();
        // Other tests' reloads may call it too.
        assert!(CALLS.load(Ordering::Relaxed) >= before + 2);
    }
}
