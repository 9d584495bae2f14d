//! A blocked Bloom filter over 32-bit key hashes, in memory beside each
//! dedup-index file: most puts with a dedup key bring a key never seen, and
//! the filter answers "not in this file" from one cache line instead of a
//! walk of the file's bucket chain. It is never stored: opening an index
//! file fills its filter from the file's entries.
//!
//! A "maybe" costs only the walk the filter saves; a "no" is certain for
//! every hash inserted, so a lookup that trusts it misses nothing the
//! index holds.

/// Bits per 64-bit word, words per block: a block is one 64-byte cache line.
const WORDS_PER_BLOCK: usize = 8;
const BITS_PER_BLOCK: u64 = (WORDS_PER_BLOCK * 64) as u64;
/// Filter bits per hash it is sized for: with [`PROBES`] bits set per hash,
/// about 2 % of the hashes not inserted answer "maybe" when it is full.
const BITS_PER_HASH: u64 = 10;
/// Bits set (and tested) per hash, all in one block.
const PROBES: u32 = 6;

/// See the module docs.
pub(crate) struct HashFilter {
    blocks: Box<[[u64; WORDS_PER_BLOCK]]>,
}

impl HashFilter {
    /// An empty filter sized for `capacity` hashes (it takes more, with
    /// more "maybe"s).
    pub fn with_capacity(capacity: u64) -> Self {
        let blocks = (capacity * BITS_PER_HASH).div_ceil(BITS_PER_BLOCK).max(1);
        Self { blocks: vec![[0; WORDS_PER_BLOCK]; blocks as usize].into_boxed_slice() }
    }

    /// Records `hash`.
    pub fn insert(&mut self, hash: u32) {
        let (block, bits) = locate(hash, self.blocks.len());
        let block = &mut self.blocks[block];
        for bit in bits {
            block[bit / 64] |= 1 << (bit % 64);
        }
    }

    /// False only if `hash` was never inserted.
    pub fn may_contain(&self, hash: u32) -> bool {
        let (block, mut bits) = locate(hash, self.blocks.len());
        let block = &self.blocks[block];
        bits.all(|bit| block[bit / 64] & (1 << (bit % 64)) != 0)
    }
}

/// The block of `hash` among `blocks` and its bits in it. The key hash's
/// own bits also pick the index's bucket, so they are mixed first (two
/// multiplicative hashes: one picks the block, the other the bits).
fn locate(hash: u32, blocks: usize) -> (usize, impl Iterator<Item = usize>) {
    let picks_block = u64::from(hash).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
    let block = (picks_block * blocks as u64) >> 32;
    let picks_bits = u64::from(hash).wrapping_mul(0xC2B2_AE3D_27D4_EB4F) ^ picks_block;
    let bits = (0..PROBES).map(move |i| ((picks_bits >> (i * 9)) % BITS_PER_BLOCK) as usize);
    (block as usize, bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_inserted_hash_may_be_there_and_few_others_answer_maybe() {
        let capacity = 100_000u32;
        let mut filter = HashFilter::with_capacity(u64::from(capacity));
        let inserted = |i: u32| i.wrapping_mul(2_654_435_761);
        for i in 0..capacity {
            filter.insert(inserted(i));
        }
        assert!((0..capacity).all(|i| filter.may_contain(inserted(i))), "no false negative");
        let others = (capacity..capacity * 3).filter(|&i| filter.may_contain(inserted(i))).count();
        let rate = others as f64 / f64::from(capacity * 2);
        assert!(rate < 0.04, "false positive rate {rate}");
    }

    #[test]
    fn an_empty_filter_holds_nothing_and_a_tiny_one_still_works() {
        let mut filter = HashFilter::with_capacity(0);
        assert!(!filter.may_contain(42));
        filter.insert(42);
        assert!(filter.may_contain(42));
        assert_eq!(filter.blocks.len(), 1);
    }
}
