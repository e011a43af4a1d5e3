//! Handing back the memory a configuration's reading freed. Reading a large file takes far more
//! than the configuration keeps (a million API keys: 107 MB of YAML, about 1 GB at the peak
//! of its parse, about 0.1 GB kept), and the binary's allocator (mimalloc) returns a thread's
//! freed pages to the system only at that thread's next use of the allocator: the thread that
//! read the file, gone idle, would hold them for as long as it stays so. So after each reading
//! (at start and on each reload) and after each reload (what it let go: the configuration it
//! replaced, or the one it built and refused), the thread's freed pages are handed back at
//! once, with the abandoned segments of threads that have ended (the binary reads the
//! configuration it starts with on a thread of its own for this), by the means the binary
//! that chose the allocator names ([`set_hand_back`]): this library knows no allocator and
//! holds no `unsafe` code.

use std::sync::OnceLock;

/// How the process's allocator hands back a thread's freed memory.
static HAND_BACK: OnceLock<fn()> = OnceLock::new();

/// Names how the process's allocator hands back the calling thread's freed memory; the first
/// call wins. Until one is named, [`hand_back_freed`] does nothing.
pub fn set_hand_back(hand_back: fn()) {
    let _ = HAND_BACK.set(hand_back);
}

/// Hands back the calling thread's freed memory, and that of threads that have ended.
pub fn hand_back_freed() {
    if let Some(hand_back) = HAND_BACK.get() {
        hand_back();
    }
}

/// A hand-back that counts its calls on the calling thread, for tests: every test that sets
/// one sets this one, so whichever sets it first, each counts its own thread's calls.
#[cfg(test)]
pub mod counting {
    use std::cell::Cell;

    thread_local! {
        static CALLS: Cell<usize> = const { Cell::new(0) };
    }

    /// Counts one call on this thread.
    pub fn hand_back() {
        CALLS.with(|calls| calls.set(calls.get() + 1));
    }

    /// The calls counted on this thread.
    pub fn calls() -> usize {
        CALLS.with(Cell::get)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named_second() {
        panic!("the first hand-back named is the one called");
    }

    #[test]
    fn the_first_hand_back_named_is_called_each_time() {
        set_hand_back(counting::hand_back);
        set_hand_back(named_second);
        let before = counting::calls();
        hand_back_freed();
        hand_back_freed();
        assert_eq!(counting::calls(), before + 2);
    }
}
