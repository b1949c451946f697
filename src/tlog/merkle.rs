//! RFC 9162 §2.1 Merkle trees: hashes, roots, inclusion and consistency proofs, and their
//! verification.
//!
//! **Storage model.** A log keeps its tree as *tiers* (C2SP `tlog-tiles`): tier 0 holds the
//! leaf hashes, tier `L` the hashes of the complete subtrees of height `8·L` (one per 256
//! tier `L-1` hashes), so a tree of `n` leaves keeps about `n·(1 + 1/256 + …)` hashes and a
//! tier-`L` tile is 256 consecutive tier-`L` hashes. Any complete subtree of height `8·L + b`
//! folds `2^b` tier-`L` hashes; any other node is built from those by the RFC's recursion.
//! [`Edge`] is the growing right edge (the partial tile of each tier) a sequencer appends to;
//! [`Prover`] computes proofs from stored tiers that a caller loads on demand ([`Need`]), so
//! the same code serves an in-memory tree, SQLite and PostgreSQL.

use sha2::{Digest, Sha256};

/// A SHA-256 value.
pub type Hash = [u8; 32];

/// Hashes per tile and the height a tier adds (C2SP tlog-tiles: 256 hashes, 8 levels).
pub const TILE_WIDTH: u64 = 256;
pub const TILE_HEIGHT: u32 = 8;

/// The root of the empty tree: `SHA-256()` (RFC 9162 §2.1.1).
pub fn empty_root() -> Hash {
    Sha256::digest([]).into()
}

/// `SHA-256(0x00 || data)`, the hash of a leaf (RFC 9162 §2.1.1).
pub fn leaf_hash(data: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update([0u8]);
    h.update(data);
    h.finalize().into()
}

/// `SHA-256(0x01 || left || right)`, an interior node (RFC 9162 §2.1.1).
pub fn node_hash(left: &Hash, right: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update([1u8]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// The largest power of two strictly less than `n` (`n ≥ 2`): the RFC's split point `k`.
fn split(n: u64) -> u64 {
    debug_assert!(n >= 2);
    1 << (63 - (n - 1).leading_zeros())
}

/// The hash of a complete subtree from its `2^b` leftmost-first child hashes.
pub fn fold(hashes: &[Hash]) -> Hash {
    match hashes.len() {
        0 => empty_root(),
        1 => hashes[0],
        n => {
            let k = if n.is_power_of_two() { n / 2 } else { split(n as u64) as usize };
            node_hash(&fold(&hashes[..k]), &fold(&hashes[k..]))
        }
    }
}

/// The root of the tree over `leaves` (leaf hashes), straight from RFC 9162's `MTH`.
pub fn root(leaves: &[Hash]) -> Hash {
    fold(leaves)
}

/// A tree's root kept incrementally in `O(log n)` memory: one hash per set bit of the size
/// (the "compact range" of the tree). For callers that only ever need the root (airlockd's
/// per-session `audit_root`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactRange {
    size: u64,
    /// Complete subtrees, largest (leftmost) first.
    peaks: Vec<Hash>,
}

impl CompactRange {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Appends one leaf hash.
    pub fn push(&mut self, leaf: Hash) {
        let mut h = leaf;
        let mut s = self.size;
        while s & 1 == 1 {
            // A set low bit is a complete left sibling of the same height: merge.
            let Some(left) = self.peaks.pop() else { break };
            h = node_hash(&left, &h);
            s >>= 1;
        }
        self.peaks.push(h);
        self.size += 1;
    }

    /// The root of the leaves pushed so far.
    pub fn root(&self) -> Hash {
        let mut it = self.peaks.iter().rev();
        let Some(mut r) = it.next().copied() else { return empty_root() };
        for p in it {
            r = node_hash(p, &r);
        }
        r
    }
}

/// A hash to store: tier `level`, position `index` (C2SP tlog-tiles numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierHash {
    pub level: u8,
    pub index: u64,
    pub hash: Hash,
}

/// Which stored hashes [`Edge::load`] needs for a tree of `size`: per tier, the partial
/// tile's range `[start, end)` (empty ranges included, tier 0 first).
pub fn edge_ranges(size: u64) -> Vec<(u8, u64, u64)> {
    let mut out = Vec::new();
    let mut level = 0u8;
    let mut count = size;
    loop {
        let partial = count % TILE_WIDTH;
        out.push((level, count - partial, count));
        count /= TILE_WIDTH;
        if count == 0 {
            break;
        }
        level += 1;
    }
    out
}

/// The growing right edge of a tiered tree: for each tier the hashes of its last, partial
/// tile. Appending a leaf yields the tier hashes (level ≥ 1) that became complete, which the
/// store writes beside the leaf; the root needs nothing else.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Edge {
    size: u64,
    /// `partial[L]`: tier-`L` hashes after the last full tile of that tier (< 256 each).
    partial: Vec<Vec<Hash>>,
}

/// A stored right edge that does not fit its size (a store defect or an edit).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the stored tree edge does not match tree size {size}: tier {level} has {got} hashes, expected {want}"
)]
pub struct EdgeMismatch {
    pub size: u64,
    pub level: u8,
    pub got: usize,
    pub want: u64,
}

impl Edge {
    pub fn new() -> Self {
        Self::default()
    }

    /// Rebuilds the edge of a tree of `size` from the ranges [`edge_ranges`] names, in that
    /// order (one `Vec` per tier).
    pub fn load(size: u64, tiers: Vec<Vec<Hash>>) -> Result<Self, EdgeMismatch> {
        let ranges = edge_ranges(size);
        if tiers.len() != ranges.len() {
            return Err(EdgeMismatch {
                size,
                level: tiers.len().min(255) as u8,
                got: tiers.len(),
                want: ranges.len() as u64,
            });
        }
        for ((level, start, end), t) in ranges.iter().zip(&tiers) {
            if t.len() as u64 != end - start {
                return Err(EdgeMismatch { size, level: *level, got: t.len(), want: end - start });
            }
        }
        Ok(Self { size, partial: tiers })
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Appends a leaf hash; returns the tier hashes (level ≥ 1) it completed, lowest first.
    pub fn append(&mut self, leaf: Hash) -> Vec<TierHash> {
        let mut done = Vec::new();
        let mut h = leaf;
        let mut level = 0usize;
        loop {
            if self.partial.len() <= level {
                self.partial.push(Vec::new());
            }
            self.partial[level].push(h);
            if self.partial[level].len() as u64 != TILE_WIDTH {
                break;
            }
            // A full tile: its fold is the next tier's hash; the tile leaves the edge.
            h = fold(&self.partial[level]);
            self.partial[level].clear();
            level += 1;
            let count_above = (self.size + 1) >> (TILE_HEIGHT * level as u32);
            done.push(TierHash { level: level as u8, index: count_above - 1, hash: h });
        }
        self.size += 1;
        done
    }

    /// The root of the tree (RFC 9162 `MTH` over all leaves appended).
    pub fn root(&self) -> Hash {
        // The complete subtrees of the size's binary decomposition, largest first: each set
        // bit b of tier L's partial count is a subtree of height 8L + b.
        let mut peaks = Vec::new();
        for level in (0..self.partial.len()).rev() {
            let tier = &self.partial[level];
            let mut at = 0usize;
            for b in (0..TILE_HEIGHT).rev() {
                let w = 1usize << b;
                if tier.len() & w != 0 {
                    peaks.push(fold(&tier[at..at + w]));
                    at += w;
                }
            }
        }
        let mut it = peaks.iter().rev();
        let Some(mut r) = it.next().copied() else { return empty_root() };
        for p in it {
            r = node_hash(p, &r);
        }
        r
    }
}

/// Stored tier hashes a [`Prover`] reads. `None`: not loaded (the prover then names the tile
/// to load, [`Need`]).
pub trait StoredHashes {
    fn stored(&self, level: u8, index: u64) -> Option<Hash>;
}

/// A tile the caller must load before the proof can be computed: tier `level`, tile `tile`
/// (hashes `tile·256 ..`, as many as the tree holds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    pub level: u8,
    pub tile: u64,
}

/// Why a proof cannot be made or checked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    #[error("leaf index {index} is not below tree size {size}")]
    IndexOutOfRange { index: u64, size: u64 },
    #[error("tree size {from} is larger than tree size {to}")]
    SizesOutOfOrder { from: u64, to: u64 },
    #[error("the proof has {got} hashes; a proof for these sizes has {want}")]
    WrongLength { got: usize, want: usize },
    #[error("the proof does not lead to the expected root")]
    RootMismatch,
}

/// Computes RFC 9162 proofs over stored tiers of a tree of `size` leaves.
#[derive(Debug)]
pub struct Prover<'a, S: StoredHashes> {
    src: &'a S,
}

impl<'a, S: StoredHashes> Prover<'a, S> {
    pub fn new(src: &'a S) -> Self {
        Self { src }
    }

    /// The hash of the complete subtree of `height` at position `index` (covering leaves
    /// `index·2^height ..`).
    pub fn complete(&self, height: u32, index: u64) -> Result<Hash, Need> {
        let level = (height / TILE_HEIGHT) as u8;
        let b = height % TILE_HEIGHT;
        let start = index << b;
        let mut hashes = Vec::with_capacity(1 << b);
        for i in start..start + (1u64 << b) {
            match self.src.stored(level, i) {
                Some(h) => hashes.push(h),
                None => return Err(Need { level, tile: i / TILE_WIDTH }),
            }
        }
        Ok(fold(&hashes))
    }

    /// `MTH(D[start:end])` for a range the RFC's recursion produces (`start` a multiple of
    /// the largest power of two ≤ `end - start`).
    pub fn subtree(&self, start: u64, end: u64) -> Result<Hash, Need> {
        let n = end - start;
        if n == 0 {
            return Ok(empty_root());
        }
        if n.is_power_of_two() && start.is_multiple_of(n) {
            return self.complete(n.trailing_zeros(), start / n);
        }
        let k = split(n);
        Ok(node_hash(&self.subtree(start, start + k)?, &self.subtree(start + k, end)?))
    }

    /// The root of the tree of `size` leaves.
    pub fn root(&self, size: u64) -> Result<Hash, Need> {
        self.subtree(0, size)
    }

    /// RFC 9162 §2.1.3.1 `PATH(m, D[n])`, leaf side first.
    pub fn inclusion(&self, index: u64, size: u64) -> Result<Result<Vec<Hash>, ProofError>, Need> {
        if index >= size {
            return Ok(Err(ProofError::IndexOutOfRange { index, size }));
        }
        let mut out = Vec::new();
        self.path(index, 0, size, &mut out)?;
        Ok(Ok(out))
    }

    fn path(&self, m: u64, start: u64, end: u64, out: &mut Vec<Hash>) -> Result<(), Need> {
        let n = end - start;
        if n <= 1 {
            return Ok(());
        }
        let k = split(n);
        if m < start + k {
            self.path(m, start, start + k, out)?;
            out.push(self.subtree(start + k, end)?);
        } else {
            self.path(m, start + k, end, out)?;
            out.push(self.subtree(start, start + k)?);
        }
        Ok(())
    }

    /// RFC 9162 §2.1.4.1 `PROOF(m, D[n])`, from tree size `from` to `to`.
    pub fn consistency(&self, from: u64, to: u64) -> Result<Result<Vec<Hash>, ProofError>, Need> {
        if from > to {
            return Ok(Err(ProofError::SizesOutOfOrder { from, to }));
        }
        let mut out = Vec::new();
        if from > 0 && from < to {
            self.subproof(from, 0, to, true, &mut out)?;
        }
        Ok(Ok(out))
    }

    fn subproof(
        &self,
        m: u64,
        start: u64,
        end: u64,
        complete: bool,
        out: &mut Vec<Hash>,
    ) -> Result<(), Need> {
        let n = end - start;
        if m == n {
            if !complete {
                out.push(self.subtree(start, end)?);
            }
            return Ok(());
        }
        let k = split(n);
        if m <= k {
            self.subproof(m, start, start + k, complete, out)?;
            out.push(self.subtree(start + k, end)?);
        } else {
            self.subproof(m - k, start + k, end, false, out)?;
            out.push(self.subtree(start, start + k)?);
        }
        Ok(())
    }
}

/// Tier hashes in memory: a whole tree, for tests, benchmarks and small logs.
#[derive(Debug, Clone, Default)]
pub struct MemTree {
    pub tiers: Vec<Vec<Hash>>,
    edge: Edge,
}

impl MemTree {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, leaf: Hash) {
        if self.tiers.is_empty() {
            self.tiers.push(Vec::new());
        }
        self.tiers[0].push(leaf);
        for t in self.edge.append(leaf) {
            let level = t.level as usize;
            if self.tiers.len() <= level {
                self.tiers.push(Vec::new());
            }
            self.tiers[level].push(t.hash);
        }
    }

    pub fn size(&self) -> u64 {
        self.edge.size()
    }

    pub fn root(&self) -> Hash {
        self.edge.root()
    }

    pub fn edge(&self) -> &Edge {
        &self.edge
    }
}

impl StoredHashes for MemTree {
    fn stored(&self, level: u8, index: u64) -> Option<Hash> {
        self.tiers.get(level as usize)?.get(usize::try_from(index).ok()?).copied()
    }
}

/// The number of hashes in an inclusion proof for `index` in a tree of `size` (`index <
/// size`), from the RFC 9162 §2.1.3.2 walk.
pub fn inclusion_len(index: u64, size: u64) -> usize {
    let (mut fnode, mut snode, mut n) = (index, size - 1, 0);
    while snode > 0 {
        // At the right edge a node with no right sibling moves up without a proof hash.
        if fnode == snode && fnode & 1 == 0 {
            while fnode & 1 == 0 && fnode != 0 {
                fnode >>= 1;
                snode >>= 1;
            }
        }
        fnode >>= 1;
        snode >>= 1;
        n += 1;
    }
    n
}

/// Verifies an inclusion proof (RFC 9162 §2.1.3.2).
pub fn verify_inclusion(
    leaf: &Hash,
    index: u64,
    size: u64,
    proof: &[Hash],
    root: &Hash,
) -> Result<(), ProofError> {
    verify_inclusion_cached(leaf, index, size, proof, root, &mut PathCache::default())
}

/// Nodes already verified against one `(size, root)`, keyed by the leaf range they cover:
/// consecutive leaves share most of their paths, so an export of a million events verifies
/// with a few hashes per event instead of ~24 ([`verify_inclusion_cached`]).
#[derive(Debug, Clone, Default)]
pub struct PathCache {
    tree: Option<(u64, Hash)>,
    /// By height: the last verified node's `(start, end, hash)`.
    nodes: Vec<Option<(u64, u64, Hash)>>,
}

/// [`verify_inclusion`] that stops as soon as it reaches a node `cache` holds as verified
/// for the same tree (then the rest of the path is already proven), and remembers the nodes
/// of every path it verifies to the root. The proof's length is always checked in full.
pub fn verify_inclusion_cached(
    leaf: &Hash,
    index: u64,
    size: u64,
    proof: &[Hash],
    root: &Hash,
    cache: &mut PathCache,
) -> Result<(), ProofError> {
    if index >= size {
        return Err(ProofError::IndexOutOfRange { index, size });
    }
    let want = inclusion_len(index, size);
    if proof.len() != want {
        return Err(ProofError::WrongLength { got: proof.len(), want });
    }
    if cache.tree != Some((size, *root)) {
        cache.tree = Some((size, *root));
        cache.nodes.clear();
    }
    let (mut fnode, mut snode) = (index, size - 1);
    let mut shift = 0u32;
    let mut r = *leaf;
    let mut walked: Vec<(u32, u64, u64, Hash)> = Vec::with_capacity(proof.len() + 1);
    let cover = |fnode: u64, shift: u32| -> (u64, u64) {
        let start = fnode << shift;
        let end = (fnode + 1).checked_shl(shift).map_or(size, |e| e.min(size));
        (start, end)
    };
    for p in proof {
        if snode == 0 {
            return Err(ProofError::WrongLength { got: proof.len(), want });
        }
        if fnode & 1 == 1 || fnode == snode {
            r = node_hash(p, &r);
            if fnode & 1 == 0 {
                while fnode & 1 == 0 && fnode != 0 {
                    fnode >>= 1;
                    snode >>= 1;
                    shift += 1;
                }
            }
        } else {
            r = node_hash(&r, p);
        }
        fnode >>= 1;
        snode >>= 1;
        shift += 1;
        let (start, end) = cover(fnode, shift);
        if let Some(Some((s, e, h))) = cache.nodes.get(shift as usize)
            && (*s, *e) == (start, end)
        {
            // Same node position in the same tree: it must have the verified hash.
            if *h != r {
                return Err(ProofError::RootMismatch);
            }
            return Ok(());
        }
        walked.push((shift, start, end, r));
    }
    if snode != 0 || r != *root {
        return Err(ProofError::RootMismatch);
    }
    for (shift, start, end, h) in walked {
        let at = shift as usize;
        if cache.nodes.len() <= at {
            cache.nodes.resize(at + 1, None);
        }
        cache.nodes[at] = Some((start, end, h));
    }
    Ok(())
}

/// Verifies a consistency proof from (`from`, `from_root`) to (`to`, `to_root`)
/// (RFC 9162 §2.1.4.2).
pub fn verify_consistency(
    from: u64,
    to: u64,
    from_root: &Hash,
    to_root: &Hash,
    proof: &[Hash],
) -> Result<(), ProofError> {
    if from > to {
        return Err(ProofError::SizesOutOfOrder { from, to });
    }
    if from == to || from == 0 {
        // Equal sizes: equal roots, no proof. The empty tree is a prefix of every tree.
        if !proof.is_empty() {
            return Err(ProofError::WrongLength { got: proof.len(), want: 0 });
        }
        if from == to && from_root != to_root {
            return Err(ProofError::RootMismatch);
        }
        if from == 0 && *from_root != empty_root() {
            return Err(ProofError::RootMismatch);
        }
        return Ok(());
    }
    if proof.is_empty() {
        return Err(ProofError::WrongLength { got: 0, want: 1 });
    }
    let mut path: Vec<Hash> = Vec::with_capacity(proof.len() + 1);
    if from.is_power_of_two() {
        path.push(*from_root);
    }
    path.extend_from_slice(proof);
    let (mut fnode, mut snode) = (from - 1, to - 1);
    while fnode & 1 == 1 {
        fnode >>= 1;
        snode >>= 1;
    }
    let (mut fr, mut sr) = (path[0], path[0]);
    for c in &path[1..] {
        if snode == 0 {
            return Err(ProofError::WrongLength { got: proof.len(), want: proof.len() - 1 });
        }
        if fnode & 1 == 1 || fnode == snode {
            fr = node_hash(c, &fr);
            sr = node_hash(c, &sr);
            if fnode & 1 == 0 {
                while fnode & 1 == 0 && fnode != 0 {
                    fnode >>= 1;
                    snode >>= 1;
                }
            }
        } else {
            sr = node_hash(&sr, c);
        }
        fnode >>= 1;
        snode >>= 1;
    }
    if snode != 0 {
        return Err(ProofError::WrongLength { got: proof.len(), want: proof.len() + 1 });
    }
    if fr != *from_root || sr != *to_root {
        return Err(ProofError::RootMismatch);
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// RFC 9162 §2.1.1, §2.1.3.1 and §2.1.4.1 written as the RFC states them, over a list of
    /// leaf hashes: the reference the tiered code is checked against.
    mod reference {
        use super::super::{Hash, empty_root, node_hash};

        fn k_of(n: usize) -> usize {
            let mut k = 1;
            while k * 2 < n {
                k *= 2;
            }
            k
        }

        pub fn mth(d: &[Hash]) -> Hash {
            match d.len() {
                0 => empty_root(),
                1 => d[0],
                n => {
                    let k = k_of(n);
                    node_hash(&mth(&d[..k]), &mth(&d[k..]))
                }
            }
        }

        pub fn path(m: usize, d: &[Hash]) -> Vec<Hash> {
            let n = d.len();
            if n <= 1 {
                return vec![];
            }
            let k = k_of(n);
            if m < k {
                let mut p = path(m, &d[..k]);
                p.push(mth(&d[k..]));
                p
            } else {
                let mut p = path(m - k, &d[k..]);
                p.push(mth(&d[..k]));
                p
            }
        }

        fn subproof(m: usize, d: &[Hash], b: bool) -> Vec<Hash> {
            let n = d.len();
            if m == n {
                return if b { vec![] } else { vec![mth(d)] };
            }
            let k = k_of(n);
            if m <= k {
                let mut p = subproof(m, &d[..k], b);
                p.push(mth(&d[k..]));
                p
            } else {
                let mut p = subproof(m - k, &d[k..], false);
                p.push(mth(&d[..k]));
                p
            }
        }

        pub fn proof(m: usize, d: &[Hash]) -> Vec<Hash> {
            if m == 0 || m == d.len() { vec![] } else { subproof(m, d, true) }
        }
    }

    fn leaves(n: usize) -> Vec<Hash> {
        (0..n).map(|i| leaf_hash(&(i as u64).to_be_bytes())).collect()
    }

    fn tree(d: &[Hash]) -> MemTree {
        let mut t = MemTree::new();
        d.iter().for_each(|h| t.push(*h));
        t
    }

    #[test]
    fn empty_and_single_leaf_roots() {
        assert_eq!(
            hex::encode(empty_root()),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let l = leaf_hash(b"");
        // RFC 6962 test vector: the hash of the empty leaf.
        assert_eq!(
            hex::encode(l),
            "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"
        );
        assert_eq!(root(&[l]), l);
        assert_eq!(Edge::new().root(), empty_root());
    }

    #[test]
    fn small_trees_match_the_reference_for_every_index_and_size() {
        let d = leaves(70);
        for n in 0..=d.len() {
            let t = tree(&d[..n]);
            let want = reference::mth(&d[..n]);
            assert_eq!(t.root(), want, "edge root n={n}");
            assert_eq!(root(&d[..n]), want, "fold root n={n}");
            let mut c = CompactRange::new();
            d[..n].iter().for_each(|h| c.push(*h));
            assert_eq!(c.root(), want, "compact root n={n}");
            let p = Prover::new(&t);
            assert_eq!(p.root(n as u64).unwrap(), want);
            for m in 0..n {
                let proof = p.inclusion(m as u64, n as u64).unwrap().unwrap();
                assert_eq!(proof, reference::path(m, &d[..n]), "path m={m} n={n}");
                assert_eq!(proof.len(), inclusion_len(m as u64, n as u64));
                verify_inclusion(&d[m], m as u64, n as u64, &proof, &want).unwrap();
            }
            for m in 0..=n {
                let proof = p.consistency(m as u64, n as u64).unwrap().unwrap();
                assert_eq!(proof, reference::proof(m, &d[..n]), "consistency {m}->{n}");
                let from_root = reference::mth(&d[..m]);
                verify_consistency(m as u64, n as u64, &from_root, &want, &proof).unwrap();
            }
        }
    }

    #[test]
    fn tiers_hold_complete_subtrees() {
        let d = leaves(256 * 3 + 5);
        let t = tree(&d);
        assert_eq!(t.tiers[1].len(), 3);
        assert_eq!(t.tiers[1][1], reference::mth(&d[256..512]));
        // A subtree of height 9 folds two tier-1 hashes.
        let p = Prover::new(&t);
        assert_eq!(p.complete(9, 0).unwrap(), reference::mth(&d[..512]));
        // The edge of size 773 is 3 tier-1 hashes' worth of tier 0 plus 5 leaves.
        let ranges = edge_ranges(773);
        assert_eq!(ranges, vec![(0, 768, 773), (1, 0, 3)]);
        let tiers: Vec<Vec<Hash>> = ranges
            .iter()
            .map(|(l, s, e)| t.tiers[*l as usize][*s as usize..*e as usize].to_vec())
            .collect();
        let edge = Edge::load(773, tiers).unwrap();
        assert_eq!(edge.root(), reference::mth(&d));
        assert!(Edge::load(774, vec![vec![], vec![]]).is_err());
    }

    #[test]
    fn a_missing_tile_is_named_not_guessed() {
        struct Only<'a>(&'a MemTree, u8);
        impl StoredHashes for Only<'_> {
            fn stored(&self, level: u8, index: u64) -> Option<Hash> {
                if level == self.1 { self.0.stored(level, index) } else { None }
            }
        }
        let d = leaves(600);
        let t = tree(&d);
        let only = Only(&t, 1);
        let p = Prover::new(&only);
        assert_eq!(p.inclusion(300, 600), Err(Need { level: 0, tile: 1 }));
    }

    #[test]
    fn tampered_proofs_fail() {
        let d = leaves(37);
        let t = tree(&d);
        let r = t.root();
        let p = Prover::new(&t);
        let mut proof = p.inclusion(5, 37).unwrap().unwrap();
        assert_eq!(verify_inclusion(&d[6], 5, 37, &proof, &r), Err(ProofError::RootMismatch));
        // The size must be the checkpoint's: the walk differs for a tree of another shape
        // (the RFC's algorithm does not bind sizes that share the path's shape, like 36).
        assert!(verify_inclusion(&d[5], 5, 5, &proof, &r).is_err());
        assert!(verify_inclusion(&d[5], 5, 6, &proof, &r).is_err());
        proof[2][0] ^= 1;
        assert_eq!(verify_inclusion(&d[5], 5, 37, &proof, &r), Err(ProofError::RootMismatch));
        proof.pop();
        assert!(matches!(
            verify_inclusion(&d[5], 5, 37, &proof, &r),
            Err(ProofError::WrongLength { .. })
        ));
        let c = p.consistency(10, 37).unwrap().unwrap();
        let r10 = root(&d[..10]);
        verify_consistency(10, 37, &r10, &r, &c).unwrap();
        assert!(verify_consistency(10, 37, &root(&d[..11]), &r, &c).is_err());
        assert!(verify_consistency(11, 37, &r10, &r, &c).is_err());
        assert!(verify_consistency(37, 10, &r, &r10, &c).is_err());
        assert!(verify_consistency(10, 37, &r10, &r, &c[..c.len() - 1]).is_err());
        let mut longer = c.clone();
        longer.push(r);
        assert!(verify_consistency(10, 37, &r10, &r, &longer).is_err());
        assert!(verify_consistency(37, 37, &r, &r10, &[]).is_err());
    }

    #[test]
    fn the_path_cache_accepts_only_verified_nodes() {
        let d = leaves(1000);
        let t = tree(&d);
        let r = t.root();
        let p = Prover::new(&t);
        let mut cache = PathCache::default();
        for m in 0..1000u64 {
            let proof = p.inclusion(m, 1000).unwrap().unwrap();
            verify_inclusion_cached(&d[m as usize], m, 1000, &proof, &r, &mut cache).unwrap();
        }
        // A wrong leaf next to verified ones still fails, even with the cache warm.
        let proof = p.inclusion(501, 1000).unwrap().unwrap();
        assert_eq!(
            verify_inclusion_cached(&d[500], 501, 1000, &proof, &r, &mut cache),
            Err(ProofError::RootMismatch)
        );
        // And a forged sibling cannot ride on the cache either.
        let mut forged = proof.clone();
        forged[0][0] ^= 1;
        assert_eq!(
            verify_inclusion_cached(&d[501], 501, 1000, &forged, &r, &mut cache),
            Err(ProofError::RootMismatch)
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn proofs_match_the_reference(n in 1usize..3000, m_frac in 0.0f64..1.0, from_frac in 0.0f64..=1.0) {
            let d = leaves(n);
            let t = tree(&d);
            let p = Prover::new(&t);
            let m = ((n as f64) * m_frac) as usize % n;
            let want_root = reference::mth(&d);
            prop_assert_eq!(t.root(), want_root);
            let proof = p.inclusion(m as u64, n as u64).unwrap().unwrap();
            prop_assert_eq!(&proof, &reference::path(m, &d));
            prop_assert!(verify_inclusion(&d[m], m as u64, n as u64, &proof, &want_root).is_ok());
            let from = ((n as f64) * from_frac) as usize;
            let c = p.consistency(from as u64, n as u64).unwrap().unwrap();
            prop_assert_eq!(&c, &reference::proof(from, &d));
            prop_assert!(verify_consistency(from as u64, n as u64, &reference::mth(&d[..from]), &want_root, &c).is_ok());
        }

        #[test]
        fn verification_never_panics(index in 0u64..100, size in 0u64..100,
                proof in proptest::collection::vec(any::<[u8; 32]>(), 0..10)) {
            let _ = verify_inclusion(&[0; 32], index, size, &proof, &[0; 32]);
            let _ = verify_consistency(index, size, &[0; 32], &[0; 32], &proof);
        }
    }
}
