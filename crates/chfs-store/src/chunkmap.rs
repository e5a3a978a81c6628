//! The chunks of one file in an engine's index, by chunk index.
//!
//! Most entries have exactly one chunk: every directory, symlink, special
//! file and empty or small file is chunk 0 alone. A `BTreeMap` allocates a
//! whole leaf node (eleven slots) for its first element, which for one
//! record is most of the memory, the allocation and the cache misses of a
//! create; so a single chunk is kept inline and a `BTreeMap` is built only
//! for the second (an empty `BTreeMap` does not allocate).

use std::collections::BTreeMap;

/// Chunk index → `V`, iterated in index order.
#[derive(Debug)]
pub(crate) enum ChunkMap<V> {
    /// Exactly one chunk.
    One(u64, V),
    /// None, or two and more.
    Many(BTreeMap<u64, V>),
}

impl<V> Default for ChunkMap<V> {
    fn default() -> Self {
        ChunkMap::Many(BTreeMap::new())
    }
}

impl<V> ChunkMap<V> {
    pub fn get(&self, idx: &u64) -> Option<&V> {
        match self {
            ChunkMap::One(k, v) => (k == idx).then_some(v),
            ChunkMap::Many(m) => m.get(idx),
        }
    }

    pub fn get_mut(&mut self, idx: &u64) -> Option<&mut V> {
        match self {
            ChunkMap::One(k, v) => (k == idx).then_some(v),
            ChunkMap::Many(m) => m.get_mut(idx),
        }
    }

    /// Inserts or replaces; returns the replaced value.
    pub fn insert(&mut self, idx: u64, v: V) -> Option<V> {
        match self {
            ChunkMap::One(k, old) if *k == idx => return Some(std::mem::replace(old, v)),
            ChunkMap::Many(m) if !m.is_empty() => return m.insert(idx, v),
            _ => {}
        }
        match std::mem::take(self) {
            ChunkMap::One(k, old) => *self = ChunkMap::Many(BTreeMap::from([(k, old), (idx, v)])),
            ChunkMap::Many(_) => *self = ChunkMap::One(idx, v),
        }
        None
    }

    pub fn remove(&mut self, idx: &u64) -> Option<V> {
        match self {
            ChunkMap::One(k, _) if k == idx => match std::mem::take(self) {
                ChunkMap::One(_, v) => Some(v),
                ChunkMap::Many(_) => None,
            },
            ChunkMap::One(..) => None,
            ChunkMap::Many(m) => m.remove(idx),
        }
    }

    pub fn contains_key(&self, idx: &u64) -> bool {
        self.get(idx).is_some()
    }

    pub fn len(&self) -> usize {
        match self {
            ChunkMap::One(..) => 1,
            ChunkMap::Many(m) => m.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        match self {
            ChunkMap::One(..) => false,
            ChunkMap::Many(m) => m.is_empty(),
        }
    }

    /// Removes and returns the chunks from `from` on.
    pub fn split_off(&mut self, from: &u64) -> Self {
        match self {
            ChunkMap::One(k, _) if *k >= *from => std::mem::take(self),
            ChunkMap::One(..) => Self::default(),
            ChunkMap::Many(m) => ChunkMap::Many(m.split_off(from)),
        }
    }

    /// (index, value) in index order.
    pub fn iter(&self) -> impl Iterator<Item = (&u64, &V)> {
        let (one, many) = match self {
            ChunkMap::One(k, v) => (Some((k, v)), None),
            ChunkMap::Many(m) => (None, Some(m.iter())),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }

    /// The values in index order, taken.
    pub fn into_values(self) -> impl Iterator<Item = V> {
        let (one, many) = match self {
            ChunkMap::One(_, v) => (Some(v), None),
            ChunkMap::Many(m) => (None, Some(m.into_values())),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }

    pub fn keys(&self) -> impl Iterator<Item = &u64> {
        self.iter().map(|(k, _)| k)
    }

    #[cfg(test)]
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use super::ChunkMap;
    use std::collections::BTreeMap;

    /// Every operation agrees with a BTreeMap, through the inline and the
    /// spilled representation and back.
    #[test]
    fn behaves_like_a_btreemap() {
        let mut m: ChunkMap<u32> = ChunkMap::default();
        let mut r: BTreeMap<u64, u32> = BTreeMap::new();
        let mut x = 7u64;
        for step in 0..20_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let idx = x % 4;
            match x % 5 {
                0 | 1 => assert_eq!(m.insert(idx, step), r.insert(idx, step)),
                2 => assert_eq!(m.remove(&idx), r.remove(&idx)),
                3 => {
                    let a: Vec<_> = m.split_off(&idx).iter().map(|(k, v)| (*k, *v)).collect();
                    let b: Vec<_> = r.split_off(&idx).into_iter().collect();
                    assert_eq!(a, b);
                }
                _ => {
                    if let (Some(a), Some(b)) = (m.get_mut(&idx), r.get_mut(&idx)) {
                        *a += 1;
                        *b += 1;
                    }
                }
            }
            assert_eq!(m.is_empty(), r.is_empty());
            assert_eq!(m.len(), r.len());
            assert_eq!(m.contains_key(&idx), r.contains_key(&idx));
            assert_eq!(m.get(&idx), r.get(&idx));
            let a: Vec<_> = m.iter().map(|(k, v)| (*k, *v)).collect();
            let b: Vec<_> = r.iter().map(|(k, v)| (*k, *v)).collect();
            assert_eq!(a, b, "step {step}");
            assert!(m.keys().eq(r.keys()));
            assert!(m.values().eq(r.values()));
        }
    }

    #[test]
    fn one_chunk_is_kept_inline() {
        let mut m = ChunkMap::default();
        m.insert(0, "entry");
        assert!(matches!(m, ChunkMap::One(0, "entry")));
        m.insert(3, "chunk");
        assert!(matches!(m, ChunkMap::Many(_)));
        m.remove(&0);
        m.remove(&3);
        assert!(m.is_empty());
        m.insert(5, "again");
        assert!(matches!(m, ChunkMap::One(5, _)));
    }
}
