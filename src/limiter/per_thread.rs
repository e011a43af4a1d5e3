//! A value kept one per thread and summed by whoever reads it: the counters that every
//! request writes (a route's meters, an upstream's requests in flight, the limiter's
//! process-wide meters) live in slots, one per core, so that no two cores write one cache
//! line; a value every request holds (the site in force) is held through its slot's own
//! handle; and a value every request clones (a header value from the configuration) is cloned
//! from its slot's own copy. A thread's slot is made by that thread, the first
//! time it writes, so it sits on memory its allocator keeps apart from other threads'; and each
//! slot is aligned to 128 bytes (two lines, as adjacent-line prefetch pairs them), so that two
//! slots never share one.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// The next thread's number: threads are numbered in the order they first write a slot.
static NEXT_THREAD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's number; its slot is this modulo the slots.
    static THREAD: usize = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
}

/// A value on cache lines of its own.
#[repr(align(128))]
struct Padded<T>(T);

/// One `T` per thread, made on the thread's first write: one slot per core the machine has
/// (at most 64); threads beyond that share slots, which costs only the sharing.
pub struct PerThread<T> {
    slots: Box<[OnceLock<Box<Padded<T>>>]>,
}

impl<T> PerThread<T> {
    /// As many slots as the machine has cores.
    pub fn new() -> PerThread<T> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        PerThread::with_slots(cores)
    }

    /// `slots` slots (at least 1, at most 64).
    pub fn with_slots(slots: usize) -> PerThread<T> {
        let slots = (0..slots.clamp(1, 64)).map(|_| OnceLock::new()).collect();
        PerThread { slots }
    }

    /// The number of this thread's slot. A thread being torn down (its number already gone)
    /// writes the first.
    pub fn mine(&self) -> usize {
        THREAD.try_with(|thread| *thread).unwrap_or(0) % self.slots.len()
    }

    /// Slot `slot` (a number [`PerThread::mine`] gave), made by `make` if no thread wrote it
    /// yet.
    pub fn slot(&self, slot: usize, make: impl FnOnce() -> T) -> &T {
        let slot = &self.slots[slot % self.slots.len()];
        &slot.get_or_init(|| Box::new(Padded(make()))).0
    }

    /// This thread's slot, made by `make` on its first write.
    pub fn local(&self, make: impl FnOnce() -> T) -> &T {
        self.slot(self.mine(), make)
    }

    /// The slots made so far, for summing.
    pub fn made(&self) -> impl Iterator<Item = &T> {
        self.slots
            .iter()
            .filter_map(|slot| slot.get().map(|slot| &slot.0))
    }
}

impl<T> Default for PerThread<T> {
    fn default() -> PerThread<T> {
        PerThread::new()
    }
}

/// Handles to one shared value, one per slot, each an `Arc` of its own around the value's.
/// Whoever clones its thread's handle (a request taking the site in force) writes a count that
/// only the threads of that slot write (one thread per core, as Pingora runs), where an `Arc`
/// of the value itself would be written by every core on one line; the value's own count is
/// written once per slot, when its handle is made.
pub struct ThreadHandles<T> {
    value: Arc<T>,
    per_thread: PerThread<Arc<Handle<T>>>,
}

/// A handle to a shared value: the value's own `Arc`, held in an `Arc` of the handle's.
pub struct Handle<T>(Arc<T>);

impl<T> Handle<T> {
    /// A handle of its own, outside any thread's (tools and tests).
    pub fn of(value: Arc<T>) -> Arc<Handle<T>> {
        Arc::new(Handle(value))
    }

    /// The value's own `Arc`.
    pub fn shared(&self) -> &Arc<T> {
        &self.0
    }
}

impl<T> std::ops::Deref for Handle<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> ThreadHandles<T> {
    /// Handles to `value`, none made yet.
    pub fn new(value: Arc<T>) -> ThreadHandles<T> {
        ThreadHandles {
            value,
            per_thread: PerThread::new(),
        }
    }

    /// This thread's handle, cloned.
    pub fn handle(&self) -> Arc<Handle<T>> {
        let handle = self
            .per_thread
            .local(|| Handle::of(Arc::clone(&self.value)));
        Arc::clone(handle)
    }
}

/// A value every request clones (a header value built from the configuration), copied once per
/// slot: a clone of its thread's copy writes a count (its `Bytes`'s) that only that slot's
/// threads write, where a clone of the original would write one count every core writes. Each
/// copy is made from the value's bytes, in an allocation of its own, on its thread's first
/// clone (a header value's copy is not marked sensitive: none of those copied is).
pub struct ThreadCopies<T> {
    original: T,
    copies: PerThread<T>,
}

/// A copy is made from the value's bytes.
impl<T: Clone + AsRef<[u8]> + for<'a> TryFrom<&'a [u8]>> ThreadCopies<T> {
    /// Copies of `original`, none made yet.
    pub fn new(original: T) -> ThreadCopies<T> {
        ThreadCopies {
            original,
            copies: PerThread::new(),
        }
    }

    /// A clone of this thread's copy.
    pub fn get(&self) -> T {
        let copy = || T::try_from(self.original.as_ref()).unwrap_or_else(|_| self.original.clone());
        self.copies.local(copy).clone()
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for ThreadCopies<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.original.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn each_thread_writes_its_own_slot_and_a_read_sees_them_all() {
        let counts = PerThread::<AtomicU64>::with_slots(4);
        let slots: Vec<usize> = std::thread::scope(|scope| {
            let threads: Vec<_> = (1..=4)
                .map(|n| {
                    let counts = &counts;
                    scope.spawn(move || {
                        counts
                            .local(AtomicU64::default)
                            .fetch_add(n, Ordering::Relaxed);
                        let mine = counts.mine();
                        let seen = counts.slot(mine, || unreachable!("written above"));
                        assert!(seen.load(Ordering::Relaxed) >= n, "its own slot");
                        mine
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().expect("a thread"))
                .collect()
        });
        let total: u64 = counts.made().map(|c| c.load(Ordering::Relaxed)).sum();
        assert_eq!(total, 10, "every thread's writes summed");
        let distinct: std::collections::BTreeSet<_> = slots.iter().collect();
        assert_eq!(counts.made().count(), distinct.len(), "{slots:?}");
    }

    #[test]
    fn each_thread_clones_its_own_handle_to_the_one_value() {
        let value = Arc::new(7);
        let handles = ThreadHandles::new(Arc::clone(&value));
        let (first, again) = (handles.handle(), handles.handle());
        assert!(Arc::ptr_eq(&first, &again), "one handle per thread");
        let other = std::thread::scope(|scope| scope.spawn(|| handles.handle()).join());
        let other = other.expect("a thread");
        assert!(!Arc::ptr_eq(&first, &other) || handles.per_thread.made().count() == 1);
        assert!(Arc::ptr_eq(first.shared(), &value) && Arc::ptr_eq(other.shared(), &value));
        let made = handles.per_thread.made().count();
        assert_eq!(
            Arc::strong_count(&value),
            2 + made,
            "ours, the handles' and one per handle"
        );
    }

    #[test]
    fn each_thread_clones_its_own_copy_of_a_value() {
        // A header value as the limiter sees one: bytes in a shared allocation.
        let value: Arc<[u8]> = Arc::from(&b"\"a\";q=10;w=1"[..]);
        let copies = ThreadCopies {
            original: value,
            copies: PerThread::with_slots(2),
        };
        let (first, again) = (copies.get(), copies.get());
        assert_eq!(first, copies.original);
        let at = |v: &Arc<[u8]>| v.as_ptr();
        assert_eq!(at(&first), at(&again), "one copy per thread");
        assert_ne!(
            at(&first),
            at(&copies.original),
            "the copy is not the original"
        );
        // Threads are numbered across the whole test binary: a new one may share our slot, so
        // threads are started until one has the other.
        let ours = copies.copies.mine();
        let other = (0..64).find_map(|_| {
            let spawned = std::thread::scope(|scope| {
                let other = scope.spawn(|| (copies.copies.mine(), copies.get()));
                other.join()
            });
            let (slot, other) = spawned.expect("a thread");
            (slot != ours).then_some(other)
        });
        let other = other.expect("a thread with the other slot");
        assert_eq!(other, copies.original);
        assert_ne!(at(&first), at(&other), "another slot, another copy");
    }

    #[test]
    fn threads_beyond_the_slots_share_them_and_slots_are_apart() {
        let counts = PerThread::<AtomicU64>::with_slots(2);
        std::thread::scope(|scope| {
            for _ in 0..5 {
                scope.spawn(|| {
                    counts
                        .local(AtomicU64::default)
                        .fetch_add(1, Ordering::Relaxed)
                });
            }
        });
        let total: u64 = counts.made().map(|c| c.load(Ordering::Relaxed)).sum();
        assert_eq!(total, 5);
        assert!(counts.made().count() <= 2);
        let addresses: Vec<usize> = counts.made().map(|c| c as *const _ as usize).collect();
        assert!(addresses.iter().all(|a| a % 128 == 0), "{addresses:x?}");
    }
}
