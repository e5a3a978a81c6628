//! The `chfs-store-dump` tool on real stores: lists keys and headers,
//! verifies checksums, and reports damage with exit status 1.

use std::os::unix::fs::FileExt;
use std::process::Command;

use chfs_proto::Meta;
use chfs_store::{PmemStore, PosixStore, Store};

fn meta(fid: u32) -> Meta {
    Meta {
        mode: libc::S_IFREG | 0o640,
        chunk_size: 4096,
        fileid: fid,
        ..Default::default()
    }
}

fn fill(s: &dyn Store) {
    s.create(
        "/dir",
        Meta {
            mode: libc::S_IFDIR | 0o755,
            ..meta(1)
        },
        b"",
        true,
    )
    .unwrap();
    s.create("/dir/file", meta(7), b"", true).unwrap();
    s.write("/dir/file", 0, 0, &[0x5A; 3000], &meta(7)).unwrap();
    s.write("/dir/file", 1, 0, &[0xA5; 4096], &meta(7)).unwrap();
    s.sync().unwrap();
}

fn dump(path: &std::path::Path, quiet: bool) -> (i32, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_chfs-store-dump"));
    if quiet {
        cmd.arg("-q");
    }
    let out = cmd.arg(path).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn dump_lists_and_verifies_a_pmem_store() {
    let d = tempfile::tempdir().unwrap();
    fill(&PmemStore::open(d.path(), 1 << 20).unwrap());
    let (code, out) = dump(d.path(), false);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("pmem store"), "{out}");
    assert!(out.contains("/dir/file #1 data=4096 crc=ok"), "{out}");
    assert!(out.contains("/dir #0 data=0 crc=ok dir mode=755"), "{out}");
    assert!(out.contains("3 records"), "{out}");
    // Damage one data byte: reported, exit status 1.
    let f = d.path().join("chfs.pmem");
    let img = std::fs::read(&f).unwrap();
    let pos = img.windows(64).position(|w| w == [0xA5; 64]).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .write_all_at(&[0], pos as u64 + 7)
        .unwrap();
    let (code, out) = dump(d.path(), true);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("BAD") && out.contains("/dir/file #1") && out.contains("MISMATCH"),
        "{out}"
    );
    assert!(
        !out.contains("ok   @"),
        "quiet mode lists only problems: {out}"
    );
    // Not a store at all: exit status 2.
    let junk = d.path().join("junk");
    std::fs::write(&junk, vec![1u8; 8192]).unwrap();
    assert_eq!(dump(&junk, false).0, 2);
}

#[test]
fn dump_lists_and_verifies_a_posix_store() {
    let d = tempfile::tempdir().unwrap();
    fill(&PosixStore::open(d.path(), 0).unwrap());
    let (code, out) = dump(d.path(), false);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("posix store"), "{out}");
    assert!(
        out.contains("/dir/file #0 data=3000 crc=ok file mode=640"),
        "{out}"
    );
    assert!(out.contains("3 records, 7096 bytes"), "{out}");
    // Damage the data of chunk 1.
    let mut hit = false;
    for sub in std::fs::read_dir(d.path()).unwrap().flatten() {
        if !sub.file_type().unwrap().is_dir() {
            continue;
        }
        for f in std::fs::read_dir(sub.path()).unwrap().flatten() {
            if std::fs::metadata(f.path()).unwrap().len() == chfs_store::posix::DATA_OFF + 4096 {
                let h = std::fs::OpenOptions::new()
                    .write(true)
                    .open(f.path())
                    .unwrap();
                h.write_all_at(&[1], chfs_store::posix::DATA_OFF + 5)
                    .unwrap();
                hit = true;
            }
        }
    }
    assert!(hit);
    let (code, out) = dump(d.path(), true);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("BAD") && out.contains("/dir/file #1"), "{out}");
}
