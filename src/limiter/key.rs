//! Limiter key bytes, kept inline for keys of ordinary length.

use smallvec::SmallVec;

/// Bytes a limiter key holds without a heap allocation: more than any key sluice builds from
/// names of ordinary length (`keys.rs`); longer ones spill to the heap and still work.
pub const KEY_INLINE: usize = 128;

/// One limiter key.
pub type Key = SmallVec<[u8; KEY_INLINE]>;

/// Appends `bytes` as lowercase hex: the digests in keys, the request id in script arguments.
pub fn push_hex(out: &mut impl Extend<u8>, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.extend(
        bytes
            .iter()
            .flat_map(|b| [HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]]),
    );
}
