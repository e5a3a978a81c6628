//! chfs-store-dump — lists and verifies a persistent chfs store, read-only.
//!
//! ```text
//! chfs-store-dump [-q] PATH
//! ```
//!
//! PATH is a pmem store (file, DAX device, or a directory holding
//! `chfs.pmem`) or a POSIX store directory. Prints the superblock, then one
//! line per record (key, header, which slot is current, data checksum), and
//! a summary. `-q` prints only problems and the summary. Exit status: 0 when
//! every checksum matches, 1 when something is damaged, 2 when the store
//! cannot be read.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use chfs_proto::Meta;
use chfs_store::pmem::{inspect_pmem, pmem_file};
use chfs_store::posix::{read_chunk_file, read_posix_super, POSIX_SUPER};
use chfs_store::record::Slot;

fn describe(m: &Meta) -> String {
    let kind = match m.file_type() {
        libc::S_IFDIR => "dir",
        libc::S_IFREG => "file",
        libc::S_IFLNK => "symlink",
        _ => "special",
    };
    format!(
        "{kind} mode={:o} uid={} gid={} size={} chunk_size={} fileid={} mtime={}",
        m.mode & 0o7777,
        m.uid,
        m.gid,
        m.size,
        m.chunk_size,
        m.fileid,
        m.mtime
    )
}

fn slots(s: &[(u8, Slot)]) -> String {
    s.iter()
        .map(|(n, s)| format!("slot{n}:seq={},len={}", s.seq, s.data_len))
        .collect::<Vec<_>>()
        .join(" ")
}

#[derive(Default)]
struct Summary {
    records: u64,
    bad: u64,
    data_bytes: u64,
    duplicates: u64,
}

fn dump_pmem(path: &Path, quiet: bool) -> Result<Summary, String> {
    let ins = inspect_pmem(path).map_err(|e| format!("{}: {e}", pmem_file(path).display()))?;
    let sb = ins.superblock;
    println!(
        "pmem store {}: format v{}, size {} bytes, uuid {:016x}",
        pmem_file(path).display(),
        sb.version,
        sb.size,
        sb.uuid
    );
    let mut sum = Summary::default();
    let mut seen: HashMap<(String, u64), u64> = HashMap::new();
    let (mut free, mut free_bytes) = (0u64, 0u64);
    for e in &ins.extents {
        if !e.used {
            free += 1;
            free_bytes += e.len;
            continue;
        }
        sum.records += 1;
        let Some((_, top)) = e.slots.first() else {
            sum.bad += 1;
            println!("BAD  @{} len={}: no valid header slot", e.offset, e.len);
            continue;
        };
        let cur = e
            .good_slot
            .and_then(|g| e.slots.iter().find(|(n, _)| *n == g));
        let (ok, s) = match cur {
            Some((_, s)) => (e.path.is_some(), s),
            None => (false, top),
        };
        let key = e
            .path
            .clone()
            .unwrap_or_else(|| "<path checksum mismatch>".into());
        if !ok {
            sum.bad += 1;
        } else {
            sum.data_bytes += s.data_len as u64;
            *seen.entry((key.clone(), s.idx)).or_default() += 1;
        }
        if !ok || !quiet {
            println!(
                "{} @{} len={} {key} #{} data={} crc={} {} [{}]",
                if ok { "ok  " } else { "BAD " },
                e.offset,
                e.len,
                s.idx,
                s.data_len,
                if ok { "ok" } else { "MISMATCH" },
                describe(&s.meta),
                slots(&e.slots)
            );
        }
    }
    sum.duplicates = seen.values().filter(|&&n| n > 1).count() as u64;
    println!("free: {free} extents, {free_bytes} bytes");
    if let Some((at, why)) = &ins.broken_at {
        sum.bad += 1;
        println!("BAD  extent chain broken at {at}: {why}");
    }
    Ok(sum)
}

fn dump_posix(root: &Path, quiet: bool) -> Result<Summary, String> {
    let uuid = read_posix_super(root).map_err(|e| format!("{}: {e}", root.display()))?;
    println!("posix store {}: uuid {uuid:016x}", root.display());
    let mut files: Vec<PathBuf> = Vec::new();
    let rd = std::fs::read_dir(root).map_err(|e| e.to_string())?;
    for d in rd.flatten() {
        if d.file_type().is_ok_and(|t| t.is_dir()) {
            if let Ok(rd) = std::fs::read_dir(d.path()) {
                files.extend(rd.flatten().map(|e| e.path()));
            }
        }
    }
    files.sort();
    let mut sum = Summary::default();
    let mut seen: HashMap<(String, u64), u64> = HashMap::new();
    for p in files {
        sum.records += 1;
        let f = match std::fs::File::open(&p) {
            Ok(f) => f,
            Err(e) => {
                sum.bad += 1;
                println!("BAD  {}: {e}", p.display());
                continue;
            }
        };
        let cf = match read_chunk_file(&f, uuid) {
            Ok(c) => c,
            Err(e) => {
                sum.bad += 1;
                println!("BAD  {}: {e}", p.display());
                continue;
            }
        };
        let Some((_, top)) = cf.slots.first() else {
            sum.bad += 1;
            println!(
                "BAD  {}: no valid header slot (unpublished or damaged)",
                p.display()
            );
            continue;
        };
        let cur = cf
            .good_slot
            .and_then(|g| cf.slots.iter().find(|(n, _)| *n == g));
        let (ok, s) = match cur {
            Some((_, s)) => (cf.path.is_some(), s),
            None => (false, top),
        };
        let key = cf
            .path
            .clone()
            .unwrap_or_else(|| "<path checksum mismatch>".into());
        if ok {
            sum.data_bytes += s.data_len as u64;
            *seen.entry((key.clone(), s.idx)).or_default() += 1;
        } else {
            sum.bad += 1;
        }
        if !ok || !quiet {
            println!(
                "{} {} {key} #{} data={} crc={} {} [{}]",
                if ok { "ok  " } else { "BAD " },
                p.file_name().and_then(|n| n.to_str()).unwrap_or("?"),
                s.idx,
                s.data_len,
                if ok { "ok" } else { "MISMATCH" },
                describe(&s.meta),
                slots(&cf.slots)
            );
        }
    }
    sum.duplicates = seen.values().filter(|&&n| n > 1).count() as u64;
    Ok(sum)
}

fn main() -> ExitCode {
    let mut quiet = false;
    let mut path = None;
    for a in std::env::args_os().skip(1) {
        match a.to_str() {
            Some("-q" | "--quiet") => quiet = true,
            Some("-h" | "--help") => {
                println!("usage: chfs-store-dump [-q] PATH   (a pmem store file/device/directory or a posix store directory)");
                return ExitCode::SUCCESS;
            }
            _ if path.is_none() => path = Some(PathBuf::from(a)),
            _ => {
                eprintln!("chfs-store-dump: one PATH expected (try --help)");
                return ExitCode::from(2);
            }
        }
    }
    let Some(path) = path else {
        eprintln!("usage: chfs-store-dump [-q] PATH");
        return ExitCode::from(2);
    };
    let r = if path.join(POSIX_SUPER).exists() {
        dump_posix(&path, quiet)
    } else {
        dump_pmem(&path, quiet)
    };
    match r {
        Ok(s) => {
            println!(
                "{} records, {} bytes of data, {} damaged, {} keys with more than one version",
                s.records, s.data_bytes, s.bad, s.duplicates
            );
            if s.bad > 0 {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("chfs-store-dump: {e}");
            ExitCode::from(2)
        }
    }
}
