//! Golden bytes of the persistent engines' on-media formats: the CRC-32C
//! they checksum with, the 128-byte header slot ([`crate::record`]), the
//! pmem superblock, extent words and record ([`crate::pmem`]), and the
//! POSIX superblock file and chunk file ([`crate::posix`]).
//!
//! A store written by one build must open with the next, so each format
//! is pinned here as hex, one piece per field, read back from the files a
//! real store wrote. A change of layout, field order, width, endianness or
//! checksum fails here with a field-by-field diff; a deliberate change
//! updates these literals *and* the format version (`PMEM_VERSION`,
//! `POSIX_VERSION`, pinned below).
//!
//! The one random input is the store's uuid, drawn at creation
//! ([`crate::record::new_uuid`]; no constructor takes one). The tests of a
//! fresh store mask it (and the superblock checksum that covers it, which
//! is then checked to be the CRC-32C of the bytes it covers); the tests of
//! records pin it by writing the golden superblock with a fixed uuid
//! before the store opens, so every byte of their records is fixed.

use std::path::Path;

use chfs_proto::Meta;

use crate::crc::{crc32c, crc32c_append, crc32c_zeros};
use crate::pmem::{PMEM_MAGIC, PMEM_MIN_SIZE, PMEM_VERSION};
use crate::posix::{
    chunk_file, read_posix_super, slot_off, DATA_OFF, PATH_OFF, POSIX_MAGIC, POSIX_SUPER,
    POSIX_VERSION,
};
use crate::record::{Slot, SLOT_LEN};
use crate::tests::shm_dir;
use crate::{PmemStore, PosixStore, Store};

// ---------------------------------------------------------------------------
// Comparing against hex

/// Lower-case hex of `b`, no separators.
fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Collects the mismatches of one test and reports them all at once; the
/// bytes produced are shown cut as the expected pieces, so a wrong field
/// stands out.
#[derive(Default)]
struct Golden {
    failures: Vec<String>,
}

impl Golden {
    /// Checks that `got` is exactly the hex `want` (pieces concatenated,
    /// white space ignored).
    fn bytes(&mut self, name: &str, got: &[u8], want: &[&str]) {
        let got = hex(got);
        let pieces: Vec<String> = want
            .iter()
            .map(|p| p.chars().filter(|c| !c.is_whitespace()).collect())
            .collect();
        if got == pieces.concat() {
            return;
        }
        let mut lines = Vec::new();
        let mut rest = got.as_str();
        for w in &pieces {
            let n = w.len().min(rest.len());
            let mark = if rest[..n] == *w {
                ""
            } else {
                "   <-- differs"
            };
            lines.push(format!("want {w:<20} got {}{mark}", &rest[..n]));
            rest = &rest[n..];
        }
        if !rest.is_empty() {
            lines.push(format!("past the expected end: {rest}"));
        }
        self.failures.push(format!(
            "{name}:\n  want {}\n  got  {got}\n  field by field:\n    {}",
            pieces.concat(),
            lines.join("\n    ")
        ));
    }

    /// Checks a value that is not bytes.
    fn value<T: std::fmt::Debug + PartialEq>(&mut self, name: &str, got: T, want: T) {
        if got != want {
            self.failures
                .push(format!("{name}:\n  want {want:?}\n  got  {got:?}"));
        }
    }

    /// Panics with every mismatch found.
    fn finish(self) {
        if !self.failures.is_empty() {
            panic!(
                "{} golden value(s) changed (an on-media format change must update them and \
                 the format version):\n\n{}",
                self.failures.len(),
                self.failures.join("\n\n")
            );
        }
    }
}

/// 20 zero bytes (the reserved tails of slots and superblocks) as hex.
const RESERVED_20: &str = "0000000000000000000000000000000000000000";

/// `n` zero bytes as hex.
fn zeros(n: usize) -> String {
    "00".repeat(n)
}

// ---------------------------------------------------------------------------
// Fixed inputs

/// The uuid the record tests pin (odd, as [`crate::record::new_uuid`]
/// makes them).
const UUID: u64 = 0x0123_4567_89ab_cdef;

/// The path of the record tests' file.
const PATH: &str = "/dir/f";

/// Its initial data.
const DATA: &[u8] = b"hello, chfs";

/// The entry of [`PATH`], every field fixed.
const META: Meta = Meta {
    flags: 0,
    mode: libc::S_IFREG | 0o644,
    uid: 1000,
    gid: 100,
    size: 11,
    chunk_size: 4096,
    rdev: 3, // the epoch
    mtime: 1_700_000_000_000_000_000,
    ctime: 1_700_000_000_000_000_001,
    atime: 1_700_000_000_000_000_002,
    fileid: 0x0a0b_0c0d,
    crc: 0,
};

/// [`META`] encoded (the layout is pinned field by field in chfs-proto's
/// golden test).
const META_HEX: &str = concat!(
    "0100",             // version
    "0000",             // flags
    "a4810000",         // mode 0o100644
    "e8030000",         // uid 1000
    "64000000",         // gid 100
    "0b00000000000000", // size 11
    "00100000",         // chunk_size 4096
    "03000000",         // rdev (epoch 3)
    "00002a36fe9c9717", // mtime 1_700_000_000_000_000_000
    "01002a36fe9c9717", // ctime
    "02002a36fe9c9717", // atime
    "0d0c0b0a",         // fileid
    "00000000",         // crc
);

/// The entry after appending `!` at offset 11 with a template whose mtime is
/// 1_700_000_000_000_000_009: size 12, mtime and ctime from the template.
const META2_HEX: &str = concat!(
    "0100",             // version
    "0000",             // flags
    "a4810000",         // mode
    "e8030000",         // uid
    "64000000",         // gid
    "0c00000000000000", // size 12
    "00100000",         // chunk_size
    "03000000",         // rdev
    "09002a36fe9c9717", // mtime ...009
    "09002a36fe9c9717", // ctime ...009
    "02002a36fe9c9717", // atime
    "0d0c0b0a",         // fileid
    "00000000",         // crc
);

/// The template of the append.
fn template() -> Meta {
    Meta {
        mtime: 1_700_000_000_000_000_009,
        ..META
    }
}

/// The slot of the entry after the create, in its two engines (only the
/// `seq` rule differs between them, and both start at 1).
fn slot_after_create() -> Vec<&'static str> {
    vec![
        "0100000000000000", // 0   seq u64
        "efcdab8967452301", // 8   uuid u64
        "0000000000000000", // 16  idx u64
        "0b000000",         // 24  data_len u32
        "7e5c5dff",         // 28  data_crc u32 (CRC-32C of "hello, chfs")
        "06000000",         // 32  path_len u32
        "f1a4d669",         // 36  path_crc u32 (CRC-32C of "/dir/f")
        META_HEX,           // 40  meta
        RESERVED_20,        // 104 reserved
        "f5e0b1bc",         // 124 slot_crc u32 (CRC-32C of bytes 0..124)
    ]
}

/// The other slot, written by the append.
fn slot_after_append() -> Vec<&'static str> {
    vec![
        "0200000000000000", // seq 2
        "efcdab8967452301", // uuid
        "0000000000000000", // idx
        "0c000000",         // data_len 12
        "fae8b45d",         // data_crc (of "hello, chfs!")
        "06000000",         // path_len
        "f1a4d669",         // path_crc
        META2_HEX,          // meta
        RESERVED_20,        // reserved
        "e49501be",         // slot_crc
    ]
}

// ---------------------------------------------------------------------------
// CRC-32C

#[test]
fn crc32c_values() {
    let mut g = Golden::default();
    // RFC 3720 (iSCSI) B.4 test vectors.
    let inc: Vec<u8> = (0..32).collect();
    let dec: Vec<u8> = (0..32).rev().collect();
    g.value("crc32c(32 x 00)", crc32c(&[0; 32]), 0x8A91_36AA);
    g.value("crc32c(32 x ff)", crc32c(&[0xff; 32]), 0x62A8_AB43);
    g.value("crc32c(00..1f)", crc32c(&inc), 0x46DD_794E);
    g.value("crc32c(1f..00)", crc32c(&dec), 0x113F_DB5C);
    // More lengths (the hardware path takes 8 bytes at a time, then bytes).
    g.value("crc32c(empty)", crc32c(b""), 0);
    g.value("crc32c(\"a\")", crc32c(b"a"), 0xC1D0_4330);
    g.value("crc32c(\"hello, chfs\")", crc32c(DATA), 0xFF5D_5C7E);
    g.value("crc32c(\"/dir/f\")", crc32c(PATH.as_bytes()), 0x69D6_A4F1);
    let pattern: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
    g.value("crc32c(1000-byte pattern)", crc32c(&pattern), 0xDD2E_DFF7);
    g.value(
        "crc32c_append(crc32c(\"hello, \"), \"chfs\")",
        crc32c_append(crc32c(b"hello, "), b"chfs"),
        crc32c(DATA),
    );
    g.value("crc32c_zeros(0, 32)", crc32c_zeros(0, 32), 0x8A91_36AA);
    g.value(
        "crc32c_zeros(0, 10000)",
        crc32c_zeros(0, 10_000),
        0x9FF0_EB1D,
    );
    g.finish();
}

// ---------------------------------------------------------------------------
// Header slot

#[test]
fn slot_encoding() {
    let mut g = Golden::default();
    let s = Slot {
        seq: 0x0102_0304_0506_0708,
        uuid: UUID,
        idx: 0x1112_1314_1516_1718,
        data_len: 0x2122_2324,
        data_crc: 0x3132_3334,
        path_len: 0x4142_4344,
        path_crc: 0x5152_5354,
        meta: META,
    };
    let b = s.encode();
    assert_eq!(SLOT_LEN, 128);
    g.bytes(
        "slot",
        &b,
        &[
            "0807060504030201", // 0   seq u64
            "efcdab8967452301", // 8   uuid u64
            "1817161514131211", // 16  idx u64
            "24232221",         // 24  data_len u32
            "34333231",         // 28  data_crc u32
            "44434241",         // 32  path_len u32
            "54535251",         // 36  path_crc u32
            META_HEX,           // 40  meta
            RESERVED_20,        // 104 reserved
            "e838a029",         // 124 slot_crc u32
        ],
    );
    assert_eq!(Slot::decode(&b), Some(s));
    g.finish();
}

// ---------------------------------------------------------------------------
// pmem

/// The superblock of a 64 KiB pmem store whose uuid is [`UUID`].
const PMEM_SUPER_PINNED: &str = concat!(
    "43484653504d454d",                         // magic
    "01000000",                                 // version
    "40000000",                                 // unit
    "0000010000000000",                         // size 65536
    "efcdab8967452301",                         // uuid (pinned)
    "0010000000000000",                         // data start
    "37e16327",                                 // crc
    "0000000000000000000000000000000000000000", // reserved
);

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

#[test]
fn pmem_fresh_store() {
    let mut g = Golden::default();
    assert_eq!(PMEM_MAGIC, b"CHFSPMEM");
    assert_eq!(PMEM_VERSION, 1);
    assert_eq!(PMEM_MIN_SIZE, 64 << 10);
    let d = shm_dir();
    let file = d.path().join("s.pmem");
    let s = PmemStore::open(&file, PMEM_MIN_SIZE).unwrap();
    assert!(s.recovery().created);
    drop(s);
    let mut b = read(&file);
    g.value("file length", b.len(), 65536);
    // The uuid is random: masked, and the checksum that covers it checked
    // to be the CRC-32C of bytes 0..40.
    let crc = u32::from_le_bytes(b[40..44].try_into().unwrap());
    g.value("superblock crc", crc, crc32c(&b[..40]));
    b[24..32].fill(0xee);
    b[40..44].fill(0xee);
    g.bytes(
        "superblock",
        &b[..64],
        &[
            "43484653504d454d", // 0  magic "CHFSPMEM"
            "01000000",         // 8  version u32
            "40000000",         // 12 unit u32 (64)
            "0000010000000000", // 16 size u64
            "eeeeeeeeeeeeeeee", // 24 uuid u64 (masked)
            "0010000000000000", // 32 data start u64 (4096)
            "eeeeeeee",         // 40 crc u32 (masked)
            &zeros(20),         // 44 reserved
        ],
    );
    g.bytes("rest of the superblock area", &b[64..4096], &[&zeros(4032)]);
    // One free extent covers the whole data area.
    // The word is a native-endian u64 (an atomic store):
    // magic 0xc4f5 << 48 | FREE (1) << 40 | length 61440.
    g.bytes("first extent word", &b[4096..4104], &["00f0000000 01 f5c4"]);
    g.bytes("rest of the data area", &b[4104..], &[&zeros(65536 - 4104)]);
    g.finish();
}

#[test]
fn pmem_record() {
    let mut g = Golden::default();
    let d = shm_dir();
    let file = d.path().join("s.pmem");
    drop(PmemStore::open(&file, PMEM_MIN_SIZE).unwrap());
    // Pin the uuid: the golden superblock with a fixed one (which the
    // store must accept as its own).
    let mut b = read(&file);
    b[..64].copy_from_slice(&unhex(PMEM_SUPER_PINNED));
    std::fs::write(&file, &b).unwrap();
    let s = PmemStore::open(&file, 0).unwrap();
    assert!(!s.recovery().created);
    assert_eq!(s.create(PATH, META, DATA, true).unwrap(), (META, true));
    let after_create = read(&file);
    s.write(PATH, 0, 11, b"!", &template()).unwrap();
    drop(s);
    let after_append = read(&file);
    g.bytes("superblock", &after_append[..64], &[PMEM_SUPER_PINNED]);
    // The record: an extent at the start of the data area.
    let r = &after_create[4096..];
    // USED (2), length 448: 320 bytes of word and slots, the path padded to
    // 384, the data's 11 bytes padded to the unit.
    g.bytes("record word", &r[..8], &["c001000000 02 f5c4"]);
    g.bytes("record line 0 after the word", &r[8..64], &[&zeros(56)]);
    g.bytes("slot 0 after create", &r[64..192], &slot_after_create());
    g.bytes("slot 1 after create", &r[192..320], &[&zeros(128)]);
    g.bytes("path", &r[320..384], &["2f6469722f66", &zeros(58)]);
    g.bytes(
        "data",
        &r[384..448],
        &["68656c6c6f2c2063686673", &zeros(53)],
    );
    // The rest of the data area, free: 61440 - 448 bytes.
    g.bytes(
        "free extent word after the record",
        &r[448..456],
        &["40ee000000 01 f5c4"],
    );
    // The append fits the record's spare room: in place, then slot 1.
    let r = &after_append[4096..];
    g.bytes("slot 0 after append", &r[64..192], &slot_after_create());
    g.bytes("slot 1 after append", &r[192..320], &slot_after_append());
    g.bytes(
        "data after append",
        &r[384..448],
        &["68656c6c6f2c206368667321", &zeros(52)],
    );
    // And the store reads its own record back.
    let s = PmemStore::open(&file, 0).unwrap();
    g.value(
        "read back",
        s.read(PATH, 0, META.fileid, 0, 100).unwrap(),
        Some(b"hello, chfs!".to_vec()),
    );
    g.finish();
}

fn unhex(h: &str) -> Vec<u8> {
    let h: String = h.chars().filter(|c| !c.is_whitespace()).collect();
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
        .collect()
}

// ---------------------------------------------------------------------------
// posix

/// A POSIX superblock with the pinned uuid.
const POSIX_SUPER_PINNED: &str = concat!(
    "43484653504f5358",                         // magic "CHFSPOSX"
    "01000000",                                 // version
    "00000000",                                 // reserved
    "efcdab8967452301",                         // uuid (pinned)
    "00000000000000000000000000000000",         // reserved
    "375725af",                                 // crc
    "0000000000000000000000000000000000000000", // reserved
);

#[test]
fn posix_fresh_store() {
    let mut g = Golden::default();
    assert_eq!(POSIX_MAGIC, b"CHFSPOSX");
    assert_eq!(POSIX_VERSION, 1);
    assert_eq!(POSIX_SUPER, "chfs-posix.sb");
    let d = shm_dir();
    let s = PosixStore::open(d.path(), 0).unwrap();
    assert!(s.recovery().created);
    drop(s);
    let mut b = read(&d.path().join(POSIX_SUPER));
    let uuid = read_posix_super(d.path()).unwrap();
    g.value("uuid field", &b[16..24], &uuid.to_le_bytes()[..]);
    let crc = u32::from_le_bytes(b[40..44].try_into().unwrap());
    g.value("superblock crc", crc, crc32c(&b[..40]));
    // The uuid is random: masked (and the checksum covering it).
    b[16..24].fill(0xee);
    b[40..44].fill(0xee);
    g.bytes(
        "superblock file",
        &b,
        &[
            "43484653504f5358", // 0  magic "CHFSPOSX"
            "01000000",         // 8  version u32
            "00000000",         // 12 reserved
            "eeeeeeeeeeeeeeee", // 16 uuid u64 (masked)
            &zeros(16),         // 24 reserved
            "eeeeeeee",         // 40 crc u32 (masked, CRC-32C of bytes 0..40)
            &zeros(20),         // 44 reserved
        ],
    );
    g.finish();
}

#[test]
fn posix_chunk_file() {
    let mut g = Golden::default();
    assert_eq!(
        (slot_off(0), slot_off(1), PATH_OFF, DATA_OFF),
        (0, 512, 1024, 8192)
    );
    let d = shm_dir();
    // Pin the uuid: the golden superblock with a fixed one.
    std::fs::write(d.path().join(POSIX_SUPER), unhex(POSIX_SUPER_PINNED)).unwrap();
    g.value("pinned uuid", read_posix_super(d.path()).unwrap(), UUID);
    let s = PosixStore::open(d.path(), 0).unwrap();
    assert!(!s.recovery().created);
    s.create(PATH, META, DATA, true).unwrap();
    // The first chunk file of a store: id 1, in directory 01.
    let f = chunk_file(d.path(), 1);
    g.value(
        "chunk file name",
        f.strip_prefix(d.path()).unwrap().to_str().unwrap(),
        "01/0000000000000001",
    );
    let after_create = read(&f);
    s.write(PATH, 0, 11, b"!", &template()).unwrap();
    drop(s);
    let after_append = read(&f);
    g.value("file length after create", after_create.len(), 8192 + 11);
    g.bytes(
        "slot 0 after create",
        &after_create[..128],
        &slot_after_create(),
    );
    g.bytes("up to slot 1", &after_create[128..512], &[&zeros(384)]);
    g.bytes(
        "slot 1 after create",
        &after_create[512..640],
        &[&zeros(128)],
    );
    g.bytes("up to the path", &after_create[640..1024], &[&zeros(384)]);
    g.bytes("path", &after_create[1024..1030], &["2f6469722f66"]);
    g.bytes(
        "up to the data",
        &after_create[1030..8192],
        &[&zeros(8192 - 1030)],
    );
    g.bytes("data", &after_create[8192..], &["68656c6c6f2c2063686673"]);
    // The append: the bytes past the end, then the other slot.
    g.value("file length after append", after_append.len(), 8192 + 12);
    g.bytes(
        "slot 0 after append",
        &after_append[..128],
        &slot_after_create(),
    );
    g.bytes(
        "slot 1 after append",
        &after_append[512..640],
        &slot_after_append(),
    );
    g.bytes(
        "data after append",
        &after_append[8192..],
        &["68656c6c6f2c206368667321"],
    );
    let s = PosixStore::open(d.path(), 0).unwrap();
    g.value(
        "read back",
        s.read(PATH, 0, META.fileid, 0, 100).unwrap(),
        Some(b"hello, chfs!".to_vec()),
    );
    g.finish();
}
