//! Limiter key bytes, kept inline for keys of ordinary length.

use dashmap::DashMap;
use smallvec::SmallVec;

/// Bytes a limiter key holds without a heap allocation: more than any key sluice builds from
/// names of ordinary length (`keys.rs`); longer ones spill to the heap and still work.
pub const KEY_INLINE: usize = 128;

/// One limiter key.
pub type Key = SmallVec<[u8; KEY_INLINE]>;

/// A concurrent map keyed by limiter keys (the deny cache, lease holdings), hashed with
/// foldhash rather than SipHash: every key ends in a keyed digest of its client's parts
/// (`keys.rs`), so no client can choose keys that collide, and a key is hashed on every limited
/// request.
pub type KeyMap<V> = DashMap<Box<[u8]>, V, foldhash::fast::RandomState>;

/// An empty [`KeyMap`] of `shards` shards (a power of two).
pub fn key_map<V>(shards: usize) -> KeyMap<V> {
    DashMap::with_hasher_and_shard_amount(foldhash::fast::RandomState::default(), shards)
}

/// Appends `bytes` as lowercase hex: the digests in keys.
pub fn push_hex<A: smallvec::Array<Item = u8>>(out: &mut SmallVec<A>, bytes: &[u8]) {
    let start = out.len();
    out.resize(start + 2 * bytes.len(), 0);
    write_hex(&mut out[start..], bytes);
}

/// Writes `bytes` as lowercase hex into `out`, two digits per byte (`out` holds twice as many).
pub fn write_hex(out: &mut [u8], bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (digits, byte) in out.chunks_exact_mut(2).zip(bytes) {
        digits[0] = HEX[usize::from(byte >> 4)];
        digits[1] = HEX[usize::from(byte & 0xf)];
    }
}
