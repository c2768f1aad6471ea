//! The free-pool key and the address-index hasher.

use std::collections::BTreeSet;
use std::hash::Hasher;

/// Free-pool key, packed into one `u128` so the B-tree compares a single integer: interned
/// stream (16 bits), size / 512 (40 bits), address / 512 (40 bits), block id (32 bits).
/// Ordered by stream, then size, then address: best fit per stream, lowest address first.
/// Blocks are at least 512 B and disjoint, so `address / 512` is distinct per free block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Key(u128);

impl Key {
    #[inline]
    pub(super) fn new(stream: u32, size: usize, addr: u64, id: u32) -> Key {
        let units = |v: u64| u128::from(v >> 9) & ((1 << 40) - 1);
        Key((stream as u128) << 112 | units(size as u64) << 72 | units(addr) << 32 | id as u128)
    }

    /// The smallest key of `stream` with at least `size` bytes.
    #[inline]
    pub(super) fn at_least(stream: u32, size: usize) -> Key {
        Key::new(stream, size, 0, 0)
    }

    #[inline]
    pub(super) fn stream(self) -> u32 {
        (self.0 >> 112) as u32
    }

    #[inline]
    pub(super) fn size(self) -> usize {
        (((self.0 >> 72) & ((1 << 40) - 1)) as usize) << 9
    }

    #[inline]
    pub(super) fn id(self) -> u32 {
        self.0 as u32
    }
}

/// Interned streams are limited by the 16 bits they get in a [`Key`].
pub(super) const MAX_STREAMS: u32 = 1 << 16;
/// Segments must end below this address (40 bits of 512-byte units in a [`Key`]).
pub(super) const ADDRESS_LIMIT: u64 = 1 << 49;

#[derive(Default)]
pub(super) struct Pool {
    pub(super) free: BTreeSet<Key>,
    /// Searches of this pool since creation (garbage-collection clock).
    pub(super) gc_calls: u64,
}

/// Hashes block addresses for the address index: one folded multiply (addresses are
/// distinct and 512-byte spaced, so no defence against adversarial keys is needed).
#[derive(Default)]
pub(super) struct AddrHasher(u64);

impl Hasher for AddrHasher {
    #[inline]
    fn finish(&self) -> u64 {
        let p = u128::from(self.0) * 0x9E37_79B9_7F4A_7C15;
        (p as u64) ^ ((p >> 64) as u64)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

#[cfg(test)]
mod tests {
    use super::Key;

    #[test]
    fn packed_key_round_trips_and_orders_by_stream_size_address() {
        let k = Key::new(7, 20 << 20, 0x7f00_1234_5600, 99);
        assert_eq!((k.stream(), k.size(), k.id()), (7, 20 << 20, 99));
        let ordered = [
            Key::new(0, 1 << 40, 0x9000, 1),
            Key::new(1, 512, 0xffff_0000, 2),
            Key::new(1, 1024, 0x1000, 3),
            Key::new(1, 1024, 0x1200, 0),
            Key::new(2, 512, 0, 4),
        ];
        assert!(ordered.windows(2).all(|w| w[0] < w[1]));
        assert!(Key::at_least(1, 1024) <= ordered[2]);
        assert!(Key::at_least(1, 1024) > ordered[1]);
    }
}
