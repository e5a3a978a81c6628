//! Fault-injecting medium for crash tests: keeps the bytes the running
//! engine sees, the bytes that are durable, and which 8-byte words were
//! stored since they were last made durable. After a chosen number of
//! mutations it "crashes": it freezes an image of what would survive.
//!
//! - [`CrashKind::PowerCut`]: durable bytes plus an arbitrary subset of the
//!   words stored since their last persist (any order, 8-byte atomicity),
//!   the in-flight write torn.
//! - [`CrashKind::Kill`]: a killed process: every completed store survives
//!   (page cache), the in-flight write is torn.
//!
//! [`FaultFiles`] does the same for the POSIX engine's file calls
//! ([`FileOps`]): kill at the chosen call (torn write, nothing after it) or
//! fail that one call.

use std::collections::HashSet;
use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::crc::crc32c_append;
use crate::media::{Media, PersistMode};
use crate::posix::{FileOps, OsFiles};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashKind {
    PowerCut,
    Kill,
}

struct State {
    cur: Vec<u8>,
    durable: Vec<u8>,
    dirty: HashSet<u64>,
    mutations: u64,
    cut_at: u64,
    kind: CrashKind,
    rng: u64,
    image: Option<Vec<u8>>,
}

/// Shared handle to the fault medium's state (the test keeps one).
#[derive(Clone)]
pub struct FaultMedia(Arc<Mutex<State>>);

fn rnd(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

impl FaultMedia {
    /// A zeroed medium that crashes at mutation `cut_at` (0 = never).
    pub fn new(len: usize, cut_at: u64, kind: CrashKind, seed: u64) -> Self {
        Self::from_image(vec![0; len], cut_at, kind, seed)
    }

    /// A medium starting from an image (all of it durable).
    pub fn from_image(img: Vec<u8>, cut_at: u64, kind: CrashKind, seed: u64) -> Self {
        Self(Arc::new(Mutex::new(State {
            durable: img.clone(),
            cur: img,
            dirty: HashSet::new(),
            mutations: 0,
            cut_at,
            kind,
            rng: seed | 1,
            image: None,
        })))
    }

    /// The surviving image, once crashed.
    pub fn crash_image(&self) -> Option<Vec<u8>> {
        self.st().image.clone()
    }

    /// Crashes `n` mutations from now.
    pub fn cut_after(&self, n: u64) {
        let mut s = self.st();
        s.cut_at = s.mutations + n;
    }

    /// Current bytes (as the engine sees them).
    pub fn current(&self) -> Vec<u8> {
        self.st().cur.clone()
    }

    fn st(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies a mutation of `cur[off..off+new.len()]`.
    fn mutate(&self, off: u64, new: &[u8]) {
        let mut s = self.st();
        let s = &mut *s;
        s.mutations += 1;
        let o = off as usize;
        if s.image.is_none() && s.mutations == s.cut_at {
            // Crash in the middle of this write: a random subset of its
            // words lands.
            let mut torn = s.cur.clone();
            let (a, b) = (o / 8 * 8, (o + new.len()).div_ceil(8) * 8);
            let mut w = a;
            while w < b.min(torn.len()) {
                if rnd(&mut s.rng) & 1 == 0 {
                    for i in w..(w + 8).min(torn.len()) {
                        if i >= o && i < o + new.len() {
                            torn[i] = new[i - o];
                        }
                    }
                }
                w += 8;
            }
            let img = match s.kind {
                CrashKind::Kill => torn,
                CrashKind::PowerCut => {
                    let mut img = s.durable.clone();
                    let mut words: Vec<u64> = s.dirty.iter().copied().collect();
                    words.extend((a as u64 / 8)..(b as u64 / 8));
                    for wi in words {
                        if rnd(&mut s.rng) & 1 == 0 {
                            let i = wi as usize * 8;
                            let e = (i + 8).min(img.len());
                            img[i..e].copy_from_slice(&torn[i..e]);
                        }
                    }
                    img
                }
            };
            s.image = Some(img);
        }
        s.cur[o..o + new.len()].copy_from_slice(new);
        for wi in (o as u64 / 8)..((o + new.len()) as u64).div_ceil(8) {
            s.dirty.insert(wi);
        }
    }
}

impl Media for FaultMedia {
    fn len(&self) -> u64 {
        self.st().cur.len() as u64
    }
    fn read(&self, off: u64, buf: &mut [u8]) {
        let s = self.st();
        buf.copy_from_slice(&s.cur[off as usize..off as usize + buf.len()]);
    }
    fn write(&self, off: u64, data: &[u8]) {
        self.mutate(off, data);
    }
    fn zero(&self, off: u64, len: u64) {
        self.mutate(off, &vec![0u8; len as usize]);
    }
    fn copy(&self, src: u64, dst: u64, len: u64) {
        let v = {
            let s = self.st();
            s.cur[src as usize..(src + len) as usize].to_vec()
        };
        self.mutate(dst, &v);
    }
    fn crc(&self, off: u64, len: u64, init: u32) -> u32 {
        let s = self.st();
        crc32c_append(init, &s.cur[off as usize..(off + len) as usize])
    }
    fn load_word(&self, off: u64) -> u64 {
        let s = self.st();
        let mut a = [0u8; 8];
        a.copy_from_slice(&s.cur[off as usize..off as usize + 8]);
        u64::from_le_bytes(a)
    }
    fn store_word(&self, off: u64, v: u64) {
        self.mutate(off, &v.to_le_bytes());
    }
    fn persist(&self, off: u64, len: u64) -> io::Result<()> {
        let mut s = self.st();
        let s = &mut *s;
        if s.image.is_some() {
            return Ok(());
        }
        let (a, b) = (off / 8, (off + len).div_ceil(8));
        for wi in a..b {
            s.dirty.remove(&wi);
        }
        let (a, b) = (a as usize * 8, (b as usize * 8).min(s.cur.len()));
        let (cur, durable) = (&s.cur, &mut s.durable);
        durable[a..b].copy_from_slice(&cur[a..b]);
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        let mut s = self.st();
        let s = &mut *s;
        if s.image.is_none() {
            s.durable.copy_from_slice(&s.cur);
            s.dirty.clear();
        }
        Ok(())
    }
    fn mode(&self) -> PersistMode {
        PersistMode::Dax
    }
}

/// What [`FaultFiles`] does at its chosen mutation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFault {
    /// The process is killed: the call in flight lands partly (a random
    /// prefix of a write; a truncate, an unlink or a create, or not), then
    /// it and every later call fail without reaching the files (what
    /// reached them stays: the page cache survives a kill).
    Kill,
    /// That one call fails (EIO) after a random prefix of a write landed
    /// (a truncate, an unlink or a create does not happen); later calls
    /// work: the engine's error paths run.
    Fail,
}

struct FilesState {
    mutations: u64,
    cut_at: u64,
    kind: FileFault,
    rng: u64,
    dead: bool,
    fired: bool,
}

/// Fault-injecting [`FileOps`] for the POSIX engine, the counterpart of
/// [`FaultMedia`]: counts the engine's file mutations and, at the chosen
/// one, kills the "process" or fails the call. The test keeps a clone.
#[derive(Clone)]
pub struct FaultFiles(Arc<Mutex<FilesState>>);

/// What to do with one call.
enum Step {
    Go,
    /// The call at the fault: land partly (Kill) or not at all (Fail).
    Hit(FileFault),
    /// After a kill.
    Dead,
}

impl FaultFiles {
    /// Real file calls, faulting as `kind` once `cut_after` is set.
    pub fn new(kind: FileFault, seed: u64) -> Self {
        Self(Arc::new(Mutex::new(FilesState {
            mutations: 0,
            cut_at: 0,
            kind,
            rng: seed | 1,
            dead: false,
            fired: false,
        })))
    }

    /// Faults at the `n`-th mutation from now (n >= 1).
    pub fn cut_after(&self, n: u64) {
        let mut s = self.st();
        s.cut_at = s.mutations + n;
    }

    /// Has the fault happened?
    pub fn fired(&self) -> bool {
        self.st().fired
    }

    fn st(&self) -> std::sync::MutexGuard<'_, FilesState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn rnd(&self) -> u64 {
        rnd(&mut self.st().rng)
    }

    fn step(&self) -> Step {
        let mut s = self.st();
        if s.dead {
            return Step::Dead;
        }
        s.mutations += 1;
        if s.mutations != s.cut_at {
            return Step::Go;
        }
        s.fired = true;
        s.dead = s.kind == FileFault::Kill;
        Step::Hit(s.kind)
    }

    /// Lands the call (`f`) with probability 1/2 when killed, never when
    /// failed.
    fn maybe(&self, kind: FileFault, f: impl FnOnce() -> io::Result<()>) -> io::Error {
        if kind == FileFault::Kill && self.rnd() & 1 == 0 {
            if let Err(e) = f() {
                return e;
            }
        }
        injected(kind)
    }
}

fn injected(kind: FileFault) -> io::Error {
    match kind {
        FileFault::Kill => io::Error::other("injected crash"),
        FileFault::Fail => io::Error::from_raw_os_error(libc::EIO),
    }
}

impl FileOps for FaultFiles {
    fn create_new(&self, path: &Path) -> io::Result<File> {
        match self.step() {
            Step::Go => OsFiles.create_new(path),
            Step::Hit(k) => Err(self.maybe(k, || OsFiles.create_new(path).map(drop))),
            Step::Dead => Err(injected(FileFault::Kill)),
        }
    }

    fn write_at(&self, f: &File, buf: &[u8], off: u64) -> io::Result<()> {
        match self.step() {
            Step::Go => OsFiles.write_at(f, buf, off),
            Step::Hit(k) => {
                if !buf.is_empty() {
                    let n = (self.rnd() % buf.len() as u64) as usize;
                    OsFiles.write_at(f, &buf[..n], off)?;
                }
                Err(injected(k))
            }
            Step::Dead => Err(injected(FileFault::Kill)),
        }
    }

    fn set_len(&self, f: &File, len: u64) -> io::Result<()> {
        match self.step() {
            Step::Go => OsFiles.set_len(f, len),
            Step::Hit(k) => Err(self.maybe(k, || OsFiles.set_len(f, len))),
            Step::Dead => Err(injected(FileFault::Kill)),
        }
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        match self.step() {
            Step::Go => OsFiles.remove(path),
            Step::Hit(k) => Err(self.maybe(k, || OsFiles.remove(path))),
            Step::Dead => Err(injected(FileFault::Kill)),
        }
    }
}
