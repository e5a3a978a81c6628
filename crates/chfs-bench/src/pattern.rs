//! IO500 access patterns: phase order, file names, offsets, data stamps,
//! the rank that reads another rank's data, and the find predicate.

use serde::{Deserialize, Serialize};

/// Size of an ior-hard transfer (IO500: 47,008 bytes, aligned to nothing).
pub const IOR_HARD_XFER: usize = 47_008;
/// Size of an mdtest-hard file (IO500: 3,901 bytes).
pub const MD_HARD_SIZE: usize = 3_901;
/// Substring that find looks for in names (IO500: `-name *01*`).
pub const FIND_NAME: &str = "01";

/// The shared file of ior-hard.
pub const IOR_HARD_FILE: &str = "ior-hard/file";

/// Whether a phase counts towards bandwidth, metadata, or neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// An ior phase (GiB/s).
    Bw,
    /// An mdtest or find phase (kIOPS).
    Md,
}

/// The twelve IO500 phases, in IO500's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// File per process, large transfers.
    IorEasyWrite,
    /// Empty files, a directory per process.
    MdtestEasyWrite,
    /// One shared file, 47,008-byte interleaved records.
    IorHardWrite,
    /// 3,901-byte files in one shared directory.
    MdtestHardWrite,
    /// Files newer than the start whose name matches, parallel listing.
    Find,
    /// Reads ior-easy files written by another rank.
    IorEasyRead,
    /// Stats mdtest-easy files created by another rank.
    MdtestEasyStat,
    /// Reads ior-hard records written by another rank.
    IorHardRead,
    /// Stats mdtest-hard files created by another rank.
    MdtestHardStat,
    /// Removes mdtest-easy files.
    MdtestEasyDelete,
    /// Reads mdtest-hard files.
    MdtestHardRead,
    /// Removes mdtest-hard files.
    MdtestHardDelete,
}

impl Phase {
    /// Every phase, in IO500's order.
    pub const ALL: [Phase; 12] = [
        Phase::IorEasyWrite,
        Phase::MdtestEasyWrite,
        Phase::IorHardWrite,
        Phase::MdtestHardWrite,
        Phase::Find,
        Phase::IorEasyRead,
        Phase::MdtestEasyStat,
        Phase::IorHardRead,
        Phase::MdtestHardStat,
        Phase::MdtestEasyDelete,
        Phase::MdtestHardRead,
        Phase::MdtestHardDelete,
    ];

    /// IO500's name of the phase.
    pub fn name(self) -> &'static str {
        match self {
            Phase::IorEasyWrite => "ior-easy-write",
            Phase::MdtestEasyWrite => "mdtest-easy-write",
            Phase::IorHardWrite => "ior-hard-write",
            Phase::MdtestHardWrite => "mdtest-hard-write",
            Phase::Find => "find",
            Phase::IorEasyRead => "ior-easy-read",
            Phase::MdtestEasyStat => "mdtest-easy-stat",
            Phase::IorHardRead => "ior-hard-read",
            Phase::MdtestHardStat => "mdtest-hard-stat",
            Phase::MdtestEasyDelete => "mdtest-easy-delete",
            Phase::MdtestHardRead => "mdtest-hard-read",
            Phase::MdtestHardDelete => "mdtest-hard-delete",
        }
    }

    /// Bandwidth or metadata.
    pub fn kind(self) -> Kind {
        match self {
            Phase::IorEasyWrite | Phase::IorHardWrite | Phase::IorEasyRead | Phase::IorHardRead => {
                Kind::Bw
            }
            _ => Kind::Md,
        }
    }

    /// A write/create phase, bounded by the stonewall time.
    pub fn is_write(self) -> bool {
        matches!(
            self,
            Phase::IorEasyWrite
                | Phase::MdtestEasyWrite
                | Phase::IorHardWrite
                | Phase::MdtestHardWrite
        )
    }

    /// The write phase whose output this phase consumes.
    pub fn source(self) -> Option<Phase> {
        match self {
            Phase::IorEasyRead => Some(Phase::IorEasyWrite),
            Phase::IorHardRead => Some(Phase::IorHardWrite),
            Phase::MdtestEasyStat | Phase::MdtestEasyDelete => Some(Phase::MdtestEasyWrite),
            Phase::MdtestHardStat | Phase::MdtestHardRead | Phase::MdtestHardDelete => {
                Some(Phase::MdtestHardWrite)
            }
            _ => None,
        }
    }
}

/// The rank whose data `rank` reads, stats or deletes: `shift` ranks
/// further (IO500's `-N`: the ranks per node, so that data is read on
/// another node), so that no rank reads what it wrote itself (unless it is
/// alone). A shift that is a multiple of the rank count becomes 1.
pub fn source_rank(rank: usize, nprocs: usize, shift: usize) -> usize {
    let n = nprocs.max(1);
    let shift = if shift % n == 0 { 1 } else { shift };
    (rank + shift) % n
}

/// ior-easy: the file of `rank`.
pub fn ior_easy_file(rank: usize) -> String {
    format!("ior-easy/file.{rank:08}")
}

/// ior-easy: offset of transfer `seg` (contiguous within the rank's file).
pub fn ior_easy_offset(seg: u64, xfer: usize) -> u64 {
    seg * xfer as u64
}

/// ior-hard: offset of record `seg` of `rank` in the shared file; records
/// of all ranks are interleaved: segment-major, then rank.
pub fn ior_hard_offset(rank: usize, seg: u64, nprocs: usize, xfer: usize) -> u64 {
    (seg * nprocs as u64 + rank as u64) * xfer as u64
}

/// mdtest-easy: the directory of `rank`.
pub fn md_easy_dir(rank: usize) -> String {
    format!("mdtest-easy/rank{rank}")
}

/// mdtest-easy: file `i` of `rank` (mdtest's `file.mdtest.<rank>.<i>`).
pub fn md_easy_file(rank: usize, i: u64) -> String {
    format!("mdtest-easy/rank{rank}/file.mdtest.{rank}.{i}")
}

/// mdtest-hard: the one shared directory.
pub const MD_HARD_DIR: &str = "mdtest-hard";

/// mdtest-hard: file `i` of `rank`, in the shared directory.
pub fn md_hard_file(rank: usize, i: u64) -> String {
    format!("mdtest-hard/file.mdtest.{rank}.{i}")
}

/// Every directory the benchmark creates under its root, parents first.
pub fn directories(nprocs: usize) -> Vec<String> {
    let mut v = vec![
        "ior-easy".to_string(),
        "ior-hard".to_string(),
        "mdtest-easy".to_string(),
        MD_HARD_DIR.to_string(),
    ];
    v.extend((0..nprocs).map(md_easy_dir));
    v
}

/// Writes the stamp `(rank, record)` into the first 16 bytes of `buf` (or
/// as much as fits), so that a reader can tell whose record it got.
pub fn stamp(buf: &mut [u8], rank: u64, rec: u64) {
    let mut s = [0u8; 16];
    s[..8].copy_from_slice(&rank.to_le_bytes());
    s[8..].copy_from_slice(&rec.to_le_bytes());
    let n = buf.len().min(16);
    buf[..n].copy_from_slice(&s[..n]);
}

/// Reads the stamp of a buffer (bytes missing from a short buffer are 0).
pub fn read_stamp(buf: &[u8]) -> (u64, u64) {
    let mut s = [0u8; 16];
    let n = buf.len().min(16);
    s[..n].copy_from_slice(&buf[..n]);
    (
        u64::from_le_bytes(s[..8].try_into().unwrap_or_default()),
        u64::from_le_bytes(s[8..].try_into().unwrap_or_default()),
    )
}

/// Fills a buffer with non-zero filler bytes (so that the data is not a
/// run of zeros that some layer might treat specially).
pub fn filler(len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    fill(&mut v, len);
    v
}

/// Appends `len` of [`filler`]'s bytes to `v`.
pub fn fill(v: &mut Vec<u8>, len: usize) {
    v.extend((0..len).map(|i| (i % 251) as u8 | 1));
}

/// What find looks for (IO500: `-newer <start> -size 3901c -name *01*`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FindSpec {
    /// Entries modified strictly after this time (ns since the epoch).
    pub newer_ns: i64,
    /// Exact size in bytes.
    pub size: u64,
    /// Substring of the name.
    pub name_contains: String,
}

impl FindSpec {
    /// The IO500 find of files newer than `newer_ns`.
    pub fn io500(newer_ns: i64) -> Self {
        FindSpec {
            newer_ns,
            size: MD_HARD_SIZE as u64,
            name_contains: FIND_NAME.to_string(),
        }
    }

    /// Does a regular file with this name, mtime and size match?
    pub fn matches(&self, name: &str, mtime_ns: i64, size: u64) -> bool {
        name.contains(&self.name_contains) && mtime_ns > self.newer_ns && size == self.size
    }

    /// Only the name test (checked first: it needs no stat).
    pub fn name_matches(&self, name: &str) -> bool {
        name.contains(&self.name_contains)
    }
}

/// How many mdtest-hard files find must report when rank `r` created
/// `counts[r]` files after the start time.
pub fn expected_find(counts: &[u64], spec: &FindSpec) -> u64 {
    counts
        .iter()
        .enumerate()
        .map(|(r, &n)| {
            (0..n)
                .filter(|&i| {
                    let p = md_hard_file(r, i);
                    spec.name_matches(p.rsplit('/').next().unwrap_or(&p))
                })
                .count() as u64
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn order_and_kinds_are_io500s() {
        let names: Vec<_> = Phase::ALL.iter().map(|p| p.name()).collect();
        assert_eq!(
            names,
            [
                "ior-easy-write",
                "mdtest-easy-write",
                "ior-hard-write",
                "mdtest-hard-write",
                "find",
                "ior-easy-read",
                "mdtest-easy-stat",
                "ior-hard-read",
                "mdtest-hard-stat",
                "mdtest-easy-delete",
                "mdtest-hard-read",
                "mdtest-hard-delete"
            ]
        );
        assert_eq!(
            Phase::ALL.iter().filter(|p| p.kind() == Kind::Bw).count(),
            4
        );
        assert_eq!(
            Phase::ALL.iter().filter(|p| p.kind() == Kind::Md).count(),
            8
        );
        // every consumer comes after its producer
        for (i, p) in Phase::ALL.iter().enumerate() {
            if let Some(s) = p.source() {
                let j = Phase::ALL.iter().position(|q| *q == s).unwrap();
                assert!(j < i, "{p:?} before its source");
                assert!(s.is_write());
            }
        }
    }

    #[test]
    fn readers_differ_from_writers_and_cover_all() {
        for n in 2..9 {
            for shift in [1, 2, 3, n, 2 * n] {
                let src: HashSet<_> = (0..n).map(|r| source_rank(r, n, shift)).collect();
                assert_eq!(src.len(), n, "a permutation");
                assert!(
                    (0..n).all(|r| source_rank(r, n, shift) != r),
                    "n={n} shift={shift}"
                );
            }
        }
        assert_eq!(source_rank(0, 1, 1), 0);
        // 2 nodes x 4 ranks, shift 4: rank 1 reads rank 5 (the other node)
        assert_eq!(source_rank(1, 8, 4), 5);
        assert_eq!(source_rank(6, 8, 4), 2);
    }

    #[test]
    fn ior_hard_records_interleave_without_overlap() {
        assert_eq!(ior_hard_offset(0, 0, 4, IOR_HARD_XFER), 0);
        assert_eq!(ior_hard_offset(1, 0, 4, IOR_HARD_XFER), 47_008);
        assert_eq!(ior_hard_offset(3, 0, 4, IOR_HARD_XFER), 3 * 47_008);
        assert_eq!(ior_hard_offset(0, 1, 4, IOR_HARD_XFER), 4 * 47_008);
        assert_eq!(
            ior_hard_offset(2, 5, 4, IOR_HARD_XFER),
            (5 * 4 + 2) * 47_008
        );
        // records of 3 ranks x 10 segments tile [0, 30 x xfer) exactly
        let mut offs: Vec<u64> = (0..3)
            .flat_map(|r| (0..10).map(move |s| ior_hard_offset(r, s, 3, IOR_HARD_XFER)))
            .collect();
        offs.sort();
        let tiled: Vec<u64> = (0..30).map(|k| k * IOR_HARD_XFER as u64).collect();
        assert_eq!(offs, tiled);
        assert_eq!(ior_easy_offset(3, 1 << 20), 3 << 20);
    }

    #[test]
    fn mdtest_names() {
        assert_eq!(md_easy_file(3, 17), "mdtest-easy/rank3/file.mdtest.3.17");
        assert_eq!(md_hard_file(0, 5), "mdtest-hard/file.mdtest.0.5");
        assert_eq!(ior_easy_file(2), "ior-easy/file.00000002");
        let d = directories(2);
        assert_eq!(
            d,
            [
                "ior-easy",
                "ior-hard",
                "mdtest-easy",
                "mdtest-hard",
                "mdtest-easy/rank0",
                "mdtest-easy/rank1"
            ]
        );
        // names are unique over ranks and indices
        let names: HashSet<_> = (0..12)
            .flat_map(|r| (0..120).map(move |i| md_hard_file(r, i)))
            .collect();
        assert_eq!(names.len(), 12 * 120);
    }

    #[test]
    fn stamps_round_trip() {
        let mut b = filler(100);
        stamp(&mut b, 7, 123_456);
        assert_eq!(read_stamp(&b), (7, 123_456));
        let mut tiny = [0u8; 4];
        stamp(&mut tiny, 0x0102_0304, 9);
        assert_eq!(read_stamp(&tiny), (0x0102_0304, 0));
        assert!(filler(1000).iter().all(|&x| x != 0));
    }

    #[test]
    fn find_predicate_and_expectation() {
        let s = FindSpec::io500(100);
        assert!(s.matches("file.mdtest.0.101", 101, 3901));
        assert!(!s.matches("file.mdtest.0.101", 100, 3901), "not newer");
        assert!(!s.matches("file.mdtest.0.101", 101, 0), "wrong size");
        assert!(!s.matches("file.mdtest.0.10", 101, 3901), "no 01");
        // rank 0 with 102 files: names containing "01": 101 only (0.1 is "0.1")
        assert_eq!(expected_find(&[102], &s), 1);
        // rank 1 names "file.mdtest.1.<i>": "1.01"? no; i=0..=9 none, 101 yes
        assert_eq!(expected_find(&[0, 102], &s), 1);
        // brute force agrees
        let counts = [250u64, 1200, 3];
        let brute: u64 = counts
            .iter()
            .enumerate()
            .map(|(r, &n)| {
                (0..n)
                    .filter(|i| format!("file.mdtest.{r}.{i}").contains("01"))
                    .count() as u64
            })
            .sum();
        assert_eq!(expected_find(&counts, &s), brute);
    }
}
