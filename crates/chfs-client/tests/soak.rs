//! Fault-injection soak: a random workload of writes, reads, truncates,
//! renames and unlinks over files spread across every server, checked
//! against an in-memory model while servers are killed and restarted with
//! empty stores, kept down, stopped past the RPC timeout (SIGSTOP) and
//! filled to ENOSPC. The invariant (SEMANTICS.md, "Faults"): every read
//! returns the model's bytes or an error, never other bytes, and every
//! error is one the model allows at that moment.
//!
//! `CHFS_SOAK_SECS` sets the duration (default 20 s; longer soaks:
//! `CHFS_SOAK_SECS=600 cargo test -p chfs-client --test soak -- --nocapture`),
//! `CHFS_SOAK_SEED` repeats a run. A failure prints the seed and the last
//! operations; keep it as a regression test below.

mod common;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use chfs_client::flags::*;
use chfs_client::{Client, Error};
use common::*;

const CS: usize = 4096;
const SERVERS: usize = 3;
const FILES: usize = 10;
const MAX_LEN: usize = 12 * CS;
/// Per server: the files together can hold up to five times what the pool
/// holds (10 files of up to 48 KiB over 3 servers of 32 KiB), so writes
/// run out of space now and then (at 160 KiB none ever did).
const CAPACITY: &str = "32K";
const RPC_TIMEOUT: Duration = Duration::from_millis(700);

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// What a byte of a file may read as: its value, or an alternative a failed
/// write may have stored, or anything after more than one such write.
#[derive(Clone, Copy, Default)]
struct Byte {
    v: u8,
    alt: Option<u8>,
    any: bool,
}

impl Byte {
    fn set(b: u8) -> Self {
        Byte {
            v: b,
            alt: None,
            any: false,
        }
    }
    fn maybe(&mut self, b: u8) {
        if b == self.v || self.alt == Some(b) {
            return;
        }
        match self.alt {
            None => self.alt = Some(b),
            Some(_) => self.any = true,
        }
    }
    fn allows(&self, b: u8) -> bool {
        self.any || b == self.v || self.alt == Some(b)
    }
}

#[derive(Clone)]
enum File {
    Absent,
    /// Bytes (positions at or past `size` are what the file shows if it
    /// grows over them without writing: zeros, or what a failed write may
    /// have stored there), and whether it existed before a server lost
    /// its store (then EIO is allowed).
    Known {
        data: Vec<Byte>,
        size: usize,
        old: bool,
    },
    /// A fault hit an operation whose outcome the model cannot know; no
    /// check until the file is reset.
    Unknown,
}

#[derive(Clone, Copy, PartialEq)]
enum Fault {
    None,
    /// Server `i` is stopped (SIGSTOP).
    Stopped(usize),
    /// Server `i` is killed and not yet restarted.
    Down(usize),
}

struct Soak {
    pool: LocalPool,
    c: Client,
    rng: Rng,
    files: Vec<File>,
    fault: Fault,
    log: VecDeque<String>,
    ops: u64,
    checked_reads: u64,
    errors_seen: u64,
    /// Errors that were ENOSPC.
    enospc: std::cell::Cell<u64>,
}

fn name(i: usize) -> String {
    format!("/s{i}")
}

impl Soak {
    fn note(&mut self, s: String) {
        if self.log.len() == 40 {
            self.log.pop_front();
        }
        self.log.push_back(s);
    }

    fn fail(&self, what: String) -> ! {
        panic!(
            "soak: {what}\nseed {}; last operations:\n  {}",
            seed(),
            self.log.iter().cloned().collect::<Vec<_>>().join("\n  ")
        );
    }

    /// Errors any operation may see while a fault is active.
    fn fault_errno(&self, e: &Error) -> bool {
        self.fault != Fault::None
            && [
                libc::ETIMEDOUT,
                libc::ECONNREFUSED,
                libc::ECONNRESET,
                libc::EIO,
                libc::ENOSPC,
            ]
            .contains(&e.errno())
    }

    /// May file `i` give EIO: it existed before a server lost its store,
    /// or the model does not know its state.
    fn is_old(&self, i: usize) -> bool {
        matches!(self.files[i], File::Known { old: true, .. } | File::Unknown)
    }

    /// An error the model does not allow fails the soak.
    fn allow(&self, what: &str, e: &Error, ok: bool) {
        if e.errno() == libc::ENOSPC {
            self.enospc.set(self.enospc.get() + 1);
        }
        if !ok && !self.fault_errno(e) {
            self.fail(format!("{what}: unexpected error {e}"));
        }
    }

    fn write(&mut self, i: usize) {
        let off = self.rng.below(MAX_LEN);
        let len = 1 + self.rng.below((3 * CS).min(MAX_LEN - off));
        let buf = self.rng.bytes(len);
        self.note(format!("write {} off {off} len {len}", name(i)));
        let fd = match self.c.open(&name(i), O_RDWR | O_CREAT, 0o644) {
            Ok(fd) => fd,
            Err(e) => {
                self.errors_seen += 1;
                let ok = self.is_old(i) && e.errno() == libc::EIO;
                self.allow("open for writing", &e, ok);
                if matches!(self.files[i], File::Absent) {
                    self.files[i] = File::Unknown;
                }
                return;
            }
        };
        if matches!(self.files[i], File::Absent) {
            self.files[i] = File::Known {
                data: Vec::new(),
                size: 0,
                old: false,
            };
        }
        let r = self.c.pwrite(fd, &buf, off as u64);
        let stored = match &r {
            Ok(n) => *n,
            Err(_) => 0,
        };
        if let Err(e) = &r {
            self.errors_seen += 1;
            let ok = e.errno() == libc::ENOSPC || (self.is_old(i) && e.errno() == libc::EIO);
            self.allow("pwrite", e, ok);
        } else if stored < len {
            self.note(format!("  short write: {stored}"));
        }
        let close = self.c.close(fd);
        let fault = self.fault;
        if let File::Known { data, size, .. } = &mut self.files[i] {
            if data.len() < off + len {
                data.resize(off + len, Byte::default());
            }
            for (k, b) in buf.iter().enumerate() {
                if k < stored {
                    data[off + k] = Byte::set(*b);
                } else {
                    data[off + k].maybe(*b);
                }
            }
            if stored > 0 {
                *size = (*size).max(off + stored);
            }
            // A write into chunk 0 that timed out may still grow the size
            // when the server carries it out.
            if r.is_err() && off < CS && fault != Fault::None {
                self.files[i] = File::Unknown;
            }
        }
        if let Err(e) = close {
            self.errors_seen += 1;
            let ok = self.is_old(i) && e.errno() == libc::EIO;
            self.allow("close", &e, ok);
            self.files[i] = File::Unknown;
        }
    }

    fn read(&mut self, i: usize) {
        let off = self.rng.below(MAX_LEN);
        let len = 1 + self.rng.below(MAX_LEN);
        self.note(format!("read {} off {off} len {len}", name(i)));
        let fd = match self.c.open(&name(i), O_RDONLY, 0) {
            Ok(fd) => fd,
            Err(e) => {
                self.errors_seen += 1;
                let ok = match self.files[i] {
                    File::Absent => e.errno() == libc::ENOENT,
                    File::Unknown => true,
                    File::Known { .. } => false,
                };
                self.allow("open for reading", &e, ok);
                return;
            }
        };
        if matches!(self.files[i], File::Absent) {
            self.fail(format!(
                "{} opened, but the model has no such file",
                name(i)
            ));
        }
        let mut buf = vec![0u8; len];
        let r = self.c.pread(fd, &mut buf, off as u64);
        let _ = self.c.close(fd);
        match (&self.files[i], r) {
            (File::Known { data, size, .. }, Ok(n)) => {
                let want = size.saturating_sub(off).min(len);
                if n != want {
                    self.fail(format!(
                        "read {n} bytes, the model says {want} (size {size})"
                    ));
                }
                for (k, b) in buf[..n].iter().enumerate() {
                    let m = data.get(off + k).copied().unwrap_or_default();
                    if !m.allows(*b) {
                        self.fail(format!(
                            "byte {} of {} is {b}, the model allows {} or {:?}",
                            off + k,
                            name(i),
                            m.v,
                            m.alt
                        ));
                    }
                }
                self.checked_reads += 1;
            }
            (File::Known { old, .. }, Err(e)) => {
                self.errors_seen += 1;
                let ok = *old && e.errno() == libc::EIO;
                self.allow("pread", &e, ok);
            }
            _ => {}
        }
    }

    fn truncate(&mut self, i: usize) {
        let len = if self.rng.chance(30) {
            0
        } else {
            self.rng.below(MAX_LEN)
        };
        self.note(format!("truncate {} to {len}", name(i)));
        match self.c.truncate(&name(i), len as u64) {
            Ok(()) => match &mut self.files[i] {
                File::Known { data, size, old } => {
                    data.truncate(len);
                    data.resize(len, Byte::default());
                    *size = len;
                    if len == 0 {
                        *old = false;
                    }
                }
                File::Absent => self.fail(format!("truncate of absent {}", name(i))),
                File::Unknown => {}
            },
            Err(e) => {
                self.errors_seen += 1;
                let ok = match self.files[i] {
                    File::Absent => e.errno() == libc::ENOENT,
                    File::Unknown => true,
                    File::Known { .. } => false,
                };
                self.allow("truncate", &e, ok);
                if !matches!(self.files[i], File::Absent) {
                    self.files[i] = File::Unknown;
                }
            }
        }
    }

    fn unlink(&mut self, i: usize) {
        self.note(format!("unlink {}", name(i)));
        match self.c.unlink(&name(i)) {
            Ok(()) => {
                if matches!(self.files[i], File::Absent) {
                    self.fail(format!("unlink of absent {} succeeded", name(i)));
                }
                self.files[i] = File::Absent;
            }
            Err(e) => {
                self.errors_seen += 1;
                let ok = match self.files[i] {
                    File::Absent => e.errno() == libc::ENOENT,
                    File::Unknown => true,
                    File::Known { .. } => false,
                };
                self.allow("unlink", &e, ok);
                if !matches!(self.files[i], File::Absent) {
                    self.files[i] = File::Unknown;
                }
            }
        }
    }

    fn rename(&mut self, a: usize, b: usize) {
        self.note(format!("rename {} {}", name(a), name(b)));
        match self.c.rename(&name(a), &name(b)) {
            Ok(()) => {
                if matches!(self.files[a], File::Absent) {
                    self.fail(format!("rename of absent {} succeeded", name(a)));
                }
                self.files[b] = std::mem::replace(&mut self.files[a], File::Absent);
            }
            Err(e) => {
                self.errors_seen += 1;
                let ok = match self.files[a] {
                    File::Absent => e.errno() == libc::ENOENT,
                    File::Unknown => true,
                    // Moving chunks may run out of space on their new
                    // servers: the rename is then left half done.
                    File::Known { .. } => e.errno() == libc::ENOSPC,
                };
                self.allow("rename", &e, ok);
                if !matches!(self.files[a], File::Absent) {
                    self.files[a] = File::Unknown;
                    self.files[b] = File::Unknown;
                }
            }
        }
    }

    /// Makes a file known again: create it and cut it to zero.
    fn reset(&mut self, i: usize) {
        self.note(format!("reset {}", name(i)));
        let r = self
            .c
            .open(&name(i), O_RDWR | O_CREAT, 0o644)
            .and_then(|fd| self.c.close(fd))
            .and_then(|()| self.c.truncate(&name(i), 0));
        match r {
            Ok(()) => {
                self.files[i] = File::Known {
                    data: Vec::new(),
                    size: 0,
                    old: false,
                }
            }
            Err(e) => {
                self.errors_seen += 1;
                self.allow("reset", &e, false);
                self.files[i] = File::Unknown;
            }
        }
    }

    /// One random operation.
    fn step(&mut self) {
        self.ops += 1;
        let i = self.rng.below(FILES);
        if matches!(self.files[i], File::Unknown) && self.rng.chance(60) {
            return self.reset(i);
        }
        match self.rng.below(100) {
            0..=34 => self.write(i),
            35..=71 => self.read(i),
            72..=81 => self.truncate(i),
            82..=88 => self.unlink(i),
            89..=94 => {
                let b = self.rng.below(FILES);
                if b != i {
                    self.rename(i, b);
                }
            }
            _ => self.reset(i),
        }
    }

    /// The model after server `s` came back with an empty store: files
    /// whose entry it held are gone, the others may read EIO.
    fn lost_store(&mut self, s: usize) {
        let list = self.c.servers();
        for i in 0..FILES {
            let entry = list.len() as u64;
            let o = (chfs_proto::ring::path_hash(&name(i)) % entry) as usize;
            let on_s = self.pool.addrs()[s] == list[o];
            match &mut self.files[i] {
                File::Known { .. } if on_s => self.files[i] = File::Absent,
                File::Known { old, .. } => *old = true,
                _ => {}
            }
        }
    }

    /// Injects a fault, or ends the one in progress.
    fn fault_step(&mut self) {
        match self.fault {
            Fault::Stopped(s) => {
                self.note(format!("SIGCONT server {s}"));
                self.pool.signal(s, libc::SIGCONT).unwrap();
                // Requests it queued while stopped are carried out now.
                std::thread::sleep(Duration::from_millis(300));
                self.fault = Fault::None;
            }
            Fault::Down(s) => {
                self.note(format!("start server {s} again, empty"));
                self.pool.restart(s).unwrap();
                self.lost_store(s);
                self.fault = Fault::None;
            }
            Fault::None => {
                let s = self.rng.below(SERVERS);
                match self.rng.below(3) {
                    0 => {
                        self.note(format!("restart server {s} empty"));
                        self.pool.restart(s).unwrap();
                        self.lost_store(s);
                    }
                    1 => {
                        self.note(format!("kill server {s}"));
                        self.pool.kill(s);
                        self.fault = Fault::Down(s);
                    }
                    _ => {
                        self.note(format!("SIGSTOP server {s}"));
                        self.pool.signal(s, libc::SIGSTOP).unwrap();
                        self.fault = Fault::Stopped(s);
                    }
                }
            }
        }
    }
}

fn seed() -> u64 {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SEED.get_or_init(|| {
        std::env::var("CHFS_SOAK_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| chfs_proto::meta::now_ns() as u64 | 1)
    })
}

#[test]
fn soak_with_faults_never_returns_wrong_bytes() {
    let secs = std::env::var("CHFS_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    // The DRAM engine's, whatever `CHFS_TEST_STORE` says: servers
    // restart empty.
    let pool = LocalPool::start_with(PoolOptions {
        servers: SERVERS,
        args: vec!["--size".into(), CAPACITY.into()],
        store: Some("mem".into()),
        ..Default::default()
    })
    .unwrap();
    let c = client(&pool, |c| {
        c.chunk_size = CS as u32;
        c.rpc_timeout = RPC_TIMEOUT;
    });
    let mut s = Soak {
        pool,
        c,
        rng: Rng(seed()),
        files: vec![File::Absent; FILES],
        fault: Fault::None,
        log: VecDeque::new(),
        ops: 0,
        checked_reads: 0,
        errors_seen: 0,
        enospc: Default::default(),
    };
    eprintln!("soak: seed {}, {secs} s", seed());
    let end = Instant::now() + Duration::from_secs(secs);
    let mut faults = 0;
    while Instant::now() < end {
        // (operations on a stopped server each wait for the RPC timeout)
        let n = if matches!(s.fault, Fault::Stopped(_)) {
            4
        } else {
            30
        };
        for _ in 0..n {
            s.step();
        }
        s.fault_step();
        faults += 1;
    }
    if s.fault != Fault::None {
        s.fault_step();
    }
    // Everything the model knows reads back as it says.
    for i in 0..FILES {
        for _ in 0..3 {
            s.read(i);
        }
    }
    eprintln!(
        "soak: {} operations, {faults} fault steps, {} reads checked, {} errors (all allowed; {} ENOSPC)",
        s.ops,
        s.checked_reads,
        s.errors_seen,
        s.enospc.get()
    );
    assert!(s.checked_reads > 50, "the soak checked too few reads");
    assert!(s.enospc.get() > 0, "the soak never filled a server");
}
