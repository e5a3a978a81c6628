//! FUSE over io_uring (Linux 6.14+, `fuse.enable_uring=1`).
//!
//! With /dev/fuse, a request wakes whichever serving thread sleeps in
//! read(2), usually on another CPU than the process that asked, and the
//! reply wakes that process back: two wake-ups across CPUs per request
//! (~45 us each on a VM). Over io_uring the kernel keeps one queue per
//! CPU and hands a request to a thread waiting on the queue of the CPU the
//! process runs on; the threads here are pinned to their queue's CPU, so
//! the hand-over and the reply stay on one CPU.
//!
//! Each thread owns a small io_uring and one ring entry (a header buffer
//! and a payload buffer registered with `FUSE_IO_URING_CMD_REGISTER`); a
//! completion means a request sits in the entry, and
//! `FUSE_IO_URING_CMD_COMMIT_AND_FETCH` sends the reply and waits for the
//! next one. Once every queue has an entry, the kernel sends all requests
//! here except FORGET and INTERRUPT, which keep arriving through /dev/fuse
//! (served by fuser). Decoding and encoding follow the kernel ABI
//! (`include/uapi/linux/fuse.h`); the operations are the same [`Core`]
//! calls the /dev/fuse transport makes.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::ptr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use chfs_client::SharedBuffer;
use chfs_sys::Mapping;
use tracing::{debug, warn};

use crate::core::op::*;
use crate::core::{Attr, Caller, Core, Error, Fh, Ino, Opened, Result, SetAttr, TimeSet};
use crate::fs::MAX_IO;

// io_uring ABI (include/uapi/linux/io_uring.h).
const IORING_SETUP_SQE128: u32 = 1 << 10;
const IORING_SETUP_SINGLE_ISSUER: u32 = 1 << 12;
const IORING_SETUP_DEFER_TASKRUN: u32 = 1 << 13;
const IORING_FEAT_SINGLE_MMAP: u32 = 1;
const IORING_OFF_SQ_RING: u64 = 0;
const IORING_OFF_CQ_RING: u64 = 0x800_0000;
const IORING_OFF_SQES: u64 = 0x1000_0000;
const IORING_ENTER_GETEVENTS: u32 = 1;
const IORING_OP_URING_CMD: u8 = 46;
const SQE_SIZE: usize = 128;
const CQE_SIZE: usize = 16;

// FUSE over io_uring ABI (include/uapi/linux/fuse.h, 7.42).
const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;
/// `fuse_uring_req_header`: in/out header, op header, ring_ent_in_out.
const HEADER_SIZE: usize = 128 + 128 + 32;
const OP_IN: usize = 128;
const ENT_IN_OUT: usize = 256;
/// Payload buffer: the largest request or reply (1 MiB writes and reads)
/// with room to spare.
const PAYLOAD_SIZE: usize = MAX_IO as usize + (64 << 10);

#[repr(C)]
#[derive(Default)]
struct SqringOffsets {
    head: u32,
    tail: u32,
    ring_mask: u32,
    ring_entries: u32,
    flags: u32,
    dropped: u32,
    array: u32,
    resv1: u32,
    user_addr: u64,
}

#[repr(C)]
#[derive(Default)]
struct CqringOffsets {
    head: u32,
    tail: u32,
    ring_mask: u32,
    ring_entries: u32,
    overflow: u32,
    cqes: u32,
    flags: u32,
    resv1: u32,
    user_addr: u64,
}

#[repr(C)]
#[derive(Default)]
struct Params {
    sq_entries: u32,
    cq_entries: u32,
    flags: u32,
    sq_thread_cpu: u32,
    sq_thread_idle: u32,
    features: u32,
    wq_fd: u32,
    resv: [u32; 3],
    sq_off: SqringOffsets,
    cq_off: CqringOffsets,
}

/// A minimal io_uring with 128-byte submission entries, used by one thread.
struct Ring {
    fd: OwnedFd,
    sq: Mapping,
    cq: Option<Mapping>,
    sqes: Mapping,
    sq_mask: u32,
    sq_entries: u32,
    sq_tail: u32,
    sq_array: u32,
    sq_head_off: u32,
    sq_tail_off: u32,
    cq_mask: u32,
    cq_head_off: u32,
    cq_tail_off: u32,
    cqes_off: u32,
    unsubmitted: u32,
}

impl Ring {
    fn new(entries: u32) -> io::Result<Ring> {
        let mut flags =
            IORING_SETUP_SQE128 | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
        loop {
            let mut p = Params {
                flags,
                ..Params::default()
            };
            // SAFETY: `p` is a valid io_uring_params the kernel fills in.
            let fd =
                unsafe { libc::syscall(libc::SYS_io_uring_setup, entries, &mut p as *mut Params) };
            if fd < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINVAL) && flags != IORING_SETUP_SQE128 {
                    flags = IORING_SETUP_SQE128;
                    continue;
                }
                return Err(e);
            }
            // SAFETY: the kernel just returned this descriptor to us.
            let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
            let sq_len = p.sq_off.array as usize + p.sq_entries as usize * 4;
            let cq_len = p.cq_off.cqes as usize + p.cq_entries as usize * CQE_SIZE;
            let single = p.features & IORING_FEAT_SINGLE_MMAP != 0;
            let sq = Mapping::shared_populated(
                &fd,
                if single { sq_len.max(cq_len) } else { sq_len },
                IORING_OFF_SQ_RING,
            )?;
            let cq = if single {
                None
            } else {
                Some(Mapping::shared_populated(&fd, cq_len, IORING_OFF_CQ_RING)?)
            };
            let sqes =
                Mapping::shared_populated(&fd, p.sq_entries as usize * SQE_SIZE, IORING_OFF_SQES)?;
            let cqm = cq.as_ref().unwrap_or(&sq);
            let sq_mask = sq
                .atomic_u32(p.sq_off.ring_mask as usize)
                .load(Ordering::Relaxed);
            let cq_mask = cqm
                .atomic_u32(p.cq_off.ring_mask as usize)
                .load(Ordering::Relaxed);
            let sq_tail = sq
                .atomic_u32(p.sq_off.tail as usize)
                .load(Ordering::Relaxed);
            return Ok(Ring {
                fd,
                sq,
                cq,
                sqes,
                sq_mask,
                sq_entries: p.sq_entries,
                sq_tail,
                sq_array: p.sq_off.array,
                sq_head_off: p.sq_off.head,
                sq_tail_off: p.sq_off.tail,
                cq_mask,
                cq_head_off: p.cq_off.head,
                cq_tail_off: p.cq_off.tail,
                cqes_off: p.cq_off.cqes,
                unsubmitted: 0,
            });
        }
    }

    fn cq(&self) -> &Mapping {
        self.cq.as_ref().unwrap_or(&self.sq)
    }

    /// Queues one 128-byte submission entry.
    fn push(&mut self, sqe: &[u8; SQE_SIZE]) -> io::Result<()> {
        let head = self
            .sq
            .atomic_u32(self.sq_head_off as usize)
            .load(Ordering::Acquire);
        if self.sq_tail.wrapping_sub(head) >= self.sq_entries {
            return Err(io::Error::from_raw_os_error(libc::EBUSY));
        }
        let idx = self.sq_tail & self.sq_mask;
        assert!((idx as usize + 1) * SQE_SIZE <= self.sqes.len());
        assert!(self.sq_array as usize + (idx as usize + 1) * 4 <= self.sq.len());
        // SAFETY: slot `idx` is in bounds (checked) and free (tail - head <
        // entries), so the kernel is not reading it.
        unsafe {
            ptr::copy_nonoverlapping(
                sqe.as_ptr(),
                self.sqes.as_ptr().add(idx as usize * SQE_SIZE),
                SQE_SIZE,
            );
            self.sq
                .as_ptr()
                .add(self.sq_array as usize + idx as usize * 4)
                .cast::<u32>()
                .write(idx);
        }
        self.sq_tail = self.sq_tail.wrapping_add(1);
        self.sq
            .atomic_u32(self.sq_tail_off as usize)
            .store(self.sq_tail, Ordering::Release);
        self.unsubmitted += 1;
        Ok(())
    }

    /// Submits what was queued and waits for one completion: its result.
    fn submit_and_wait(&mut self) -> io::Result<i32> {
        loop {
            if self.unsubmitted == 0 {
                if let Some(res) = self.reap() {
                    return Ok(res);
                }
            }
            self.enter(true)?;
        }
    }

    /// Submits what was queued; with `wait`, until a completion is there
    /// (an interrupted wait returns early: callers loop).
    fn enter(&mut self, wait: bool) -> io::Result<()> {
        // SAFETY: plain syscall on our ring descriptor; no pointers.
        let r = unsafe {
            libc::syscall(
                libc::SYS_io_uring_enter,
                self.fd.as_raw_fd(),
                self.unsubmitted,
                u32::from(wait),
                if wait { IORING_ENTER_GETEVENTS } else { 0 },
                ptr::null::<libc::c_void>(),
                0usize,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EINTR) => Ok(()),
                _ => Err(e),
            };
        }
        self.unsubmitted = self.unsubmitted.saturating_sub(r as u32);
        Ok(())
    }

    /// Takes one completion, if any: its result.
    fn reap(&mut self) -> Option<i32> {
        let cq = self.cq();
        let head = cq
            .atomic_u32(self.cq_head_off as usize)
            .load(Ordering::Relaxed);
        let tail = cq
            .atomic_u32(self.cq_tail_off as usize)
            .load(Ordering::Acquire);
        if head == tail {
            return None;
        }
        let off = self.cqes_off as usize + (head & self.cq_mask) as usize * CQE_SIZE;
        assert!(off + CQE_SIZE <= cq.len());
        // SAFETY: in bounds (checked); the entry between head and tail is
        // written by the kernel and not reused until head moves past it.
        let res = unsafe { cq.as_ptr().add(off + 8).cast::<i32>().read() };
        cq.atomic_u32(self.cq_head_off as usize)
            .store(head.wrapping_add(1), Ordering::Release);
        Some(res)
    }
}

/// Number of queues the kernel keeps: one per possible CPU.
fn possible_cpus() -> usize {
    let parse = |s: &str| -> Option<usize> {
        let mut max = 0;
        for part in s.trim().split(',') {
            let last = part.rsplit('-').next()?;
            max = max.max(last.parse::<usize>().ok()?);
        }
        Some(max + 1)
    };
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| parse(&s))
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

fn pin_to(cpu: usize) {
    if chfs_sys::cpu::pin_current_thread(cpu).is_err() {
        debug!(cpu, "cannot pin a ring thread (CPU offline?)");
    }
}

/// Puts the calling ring thread in `SCHED_BATCH`: a woken batch thread
/// does not preempt the task running on its CPU (it runs at the next
/// scheduling point instead), otherwise it is scheduled as a normal one.
/// A ring thread shares its CPU with the processes it serves, and the
/// kernel sends some requests without waiting for them: the RELEASE of
/// close(2) woke the ring thread, which preempted the closing process
/// (two context switches) only for that process to send its next request a
/// few microseconds later. Now the process runs on until it waits for that
/// next request, and the thread serves both in one wake-up (a create
/// through the mount, open(O_CREAT) + close, took 10 context switches,
/// now 8). A process waiting for a reply sleeps anyway, so requests that
/// are waited for lose nothing. The /dev/fuse threads get it too while the
/// rings serve (`mount::serve`): they then read only FORGET, which the
/// kernel sends without waiting after every unlink.
pub(crate) fn batch_policy() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: plain syscall on the calling thread (pid 0), valid param.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) } != 0 {
        debug!(
            error = %io::Error::last_os_error(),
            "ring thread keeps the normal scheduling policy"
        );
    }
}

/// Starts the ring threads: `per_queue` per CPU queue, each pinned to its
/// CPU. `fuse` is the session's /dev/fuse descriptor (after INIT). Returns
/// once every thread registered its entry, so the kernel has switched to
/// the rings; an error means /dev/fuse stays in use.
pub(crate) fn start(core: Arc<Core>, fuse: OwnedFd, per_queue: usize) -> io::Result<usize> {
    let queues = possible_cpus();
    let per_queue = per_queue.max(1);
    let fuse = Arc::new(fuse);
    // The payload buffers, in memory the local servers map too: the data
    // of a WRITE the kernel copied there reaches a chunk with one cheap
    // copy by the server.
    let shared = match core
        .client()
        .shared_buffer(queues * per_queue * PAYLOAD_SIZE)
    {
        Ok(b) => Some(b),
        Err(e) => {
            debug!("ring buffers in private memory: {e}");
            None
        }
    };
    let (tx, rx) = std::sync::mpsc::channel::<io::Result<()>>();
    let mut n = 0;
    for qid in 0..queues {
        for t in 0..per_queue {
            let core = core.clone();
            let fuse = fuse.clone();
            let tx = tx.clone();
            let slice = shared.clone().map(|b| (b, n * PAYLOAD_SIZE));
            std::thread::Builder::new()
                .name(format!("chfuse-q{qid}.{t}"))
                .spawn(move || serve_queue(core, fuse, qid as u16, slice, tx))?;
            n += 1;
        }
    }
    drop(tx);
    for _ in 0..n {
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(io::Error::other("a ring thread ended during start")),
        }
    }
    Ok(n)
}

/// A ring entry's buffers. The kernel writes them while a command is in
/// flight, so they are only read or written between a completion and the
/// next submission.
struct Entry {
    header: Vec<u64>,
    payload: Payload,
    iov: [libc::iovec; 2],
}

/// Where an entry's payload buffer (PAYLOAD_SIZE bytes) lives.
enum Payload {
    /// At this offset of the client's shared buffer, which the local
    /// servers map too (one slice per entry).
    Shared(SharedBuffer, usize),
    /// In a private mapping.
    Own(Mapping),
}

impl Payload {
    fn ptr(&self) -> *mut u8 {
        match self {
            Payload::Shared(b, off) => {
                assert!(off + PAYLOAD_SIZE <= b.len());
                // SAFETY: in bounds (asserted).
                unsafe { b.as_ptr().add(*off) }
            }
            Payload::Own(m) => m.as_ptr(),
        }
    }
}

impl Entry {
    fn new(payload: Option<Payload>) -> io::Result<Entry> {
        let mut header = vec![0u64; HEADER_SIZE / 8];
        let payload = match payload {
            Some(p) => p,
            None => Payload::Own(Mapping::private_anonymous(PAYLOAD_SIZE)?),
        };
        let iov = [
            libc::iovec {
                iov_base: header.as_mut_ptr().cast(),
                iov_len: HEADER_SIZE,
            },
            libc::iovec {
                iov_base: payload.ptr().cast(),
                iov_len: PAYLOAD_SIZE,
            },
        ];
        Ok(Entry {
            header,
            payload,
            iov,
        })
    }

    fn header(&mut self) -> &mut [u8] {
        // SAFETY: the Vec<u64> holds HEADER_SIZE bytes; u8 has no alignment
        // needs; no command is in flight while this borrow lives.
        unsafe { std::slice::from_raw_parts_mut(self.header.as_mut_ptr().cast(), HEADER_SIZE) }
    }

    fn payload(&mut self) -> &mut [u8] {
        // SAFETY: the buffer is PAYLOAD_SIZE bytes, this entry's alone
        // (each has its own slice of a shared buffer) while no command is
        // in flight.
        unsafe { std::slice::from_raw_parts_mut(self.payload.ptr(), PAYLOAD_SIZE) }
    }

    fn sqe(&self, fuse: RawFd, cmd: u32, commit_id: u64, qid: u16) -> [u8; SQE_SIZE] {
        let mut s = [0u8; SQE_SIZE];
        s[0] = IORING_OP_URING_CMD;
        s[4..8].copy_from_slice(&fuse.to_ne_bytes());
        s[8..12].copy_from_slice(&cmd.to_ne_bytes());
        if cmd == FUSE_IO_URING_CMD_REGISTER {
            s[16..24].copy_from_slice(&(self.iov.as_ptr() as u64).to_ne_bytes());
            s[24..28].copy_from_slice(&2u32.to_ne_bytes());
        }
        // struct fuse_uring_cmd_req in the command area (offset 48).
        s[56..64].copy_from_slice(&commit_id.to_ne_bytes());
        s[64..66].copy_from_slice(&qid.to_ne_bytes());
        s
    }
}

fn serve_queue(
    core: Arc<Core>,
    fuse: Arc<OwnedFd>,
    qid: u16,
    slice: Option<(SharedBuffer, usize)>,
    started: std::sync::mpsc::Sender<io::Result<()>>,
) {
    pin_to(qid as usize);
    batch_policy();
    let payload = slice.map(|(b, off)| Payload::Shared(b, off));
    let setup = Ring::new(4).and_then(|ring| Ok((ring, Entry::new(payload)?)));
    let (mut ring, mut ent) = match setup {
        Ok(x) => x,
        Err(e) => {
            let _ = started.send(Err(e));
            return;
        }
    };
    let fd = fuse.as_raw_fd();
    // Submit the registration without waiting: the completion only comes
    // with the first request, and an immediate failure (EOPNOTSUPP,
    // EINVAL) is already in the queue.
    let registered = ring
        .push(&ent.sqe(fd, FUSE_IO_URING_CMD_REGISTER, 0, qid))
        .and_then(|()| ring.enter(false))
        .and_then(|()| match ring.reap() {
            Some(res) if res < 0 => Err(io::Error::from_raw_os_error(-res)),
            Some(_) => Err(io::Error::other("unexpected ring completion")),
            None if ring.unsubmitted > 0 => Err(io::Error::other("registration not submitted")),
            None => Ok(()),
        });
    let ok = registered.is_ok();
    let _ = started.send(registered);
    if !ok {
        return;
    }
    loop {
        match ring.submit_and_wait() {
            Ok(0) => {}
            Ok(e) if matches!(-e, libc::ENOTCONN | libc::ECANCELED | libc::ENODEV) => return,
            Ok(e) => {
                // The kernel refused a commit (say, its request was gone):
                // the entry is lost to the queue, so register a fresh one
                // or requests from this CPU would wait forever. The old
                // buffers stay allocated: the kernel may still name them.
                warn!(
                    qid,
                    errno = -e,
                    "FUSE ring entry failed; registering a new one"
                );
                match Entry::new(None) {
                    Ok(fresh) => std::mem::forget(std::mem::replace(&mut ent, fresh)),
                    Err(e) => {
                        warn!(qid, error = %e, "cannot allocate a FUSE ring entry");
                        return;
                    }
                }
                if let Err(e) = ring.push(&ent.sqe(fd, FUSE_IO_URING_CMD_REGISTER, 0, qid)) {
                    warn!(qid, error = %e, "FUSE ring failed");
                    return;
                }
                continue;
            }
            Err(e) => {
                warn!(qid, error = %e, "FUSE ring failed");
                return;
            }
        }
        let (unique, out_len, err) = handle(&core, &mut ent);
        let h = ent.header();
        h[0..4].copy_from_slice(&(16 + out_len as u32).to_ne_bytes());
        h[4..8].copy_from_slice(&(-err).to_ne_bytes());
        h[8..16].copy_from_slice(&unique.to_ne_bytes());
        h[ENT_IN_OUT + 16..ENT_IN_OUT + 20].copy_from_slice(&(out_len as u32).to_ne_bytes());
        let commit = ent.sqe(fd, FUSE_IO_URING_CMD_COMMIT_AND_FETCH, unique, qid);
        if let Err(e) = ring.push(&commit) {
            warn!(qid, error = %e, "FUSE ring failed");
            return;
        }
    }
}

// fuse_open_out.open_flags bits.
const FOPEN_DIRECT_IO: u32 = 1 << 0;
const FOPEN_NOFLUSH: u32 = 1 << 5;

// fuse_setattr_in.valid bits.
const FATTR_MODE: u32 = 1 << 0;
const FATTR_UID: u32 = 1 << 1;
const FATTR_GID: u32 = 1 << 2;
const FATTR_SIZE: u32 = 1 << 3;
const FATTR_ATIME: u32 = 1 << 4;
const FATTR_MTIME: u32 = 1 << 5;
const FATTR_FH: u32 = 1 << 6;
const FATTR_ATIME_NOW: u32 = 1 << 7;
const FATTR_MTIME_NOW: u32 = 1 << 8;

const ENTRY_OUT: usize = 40 + ATTR_SIZE;
const ATTR_SIZE: usize = 88;

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_ne_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

fn put32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_ne_bytes());
}

fn put64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_ne_bytes());
}

/// The NUL-terminated names at the start of a request payload.
fn names(p: &[u8]) -> impl Iterator<Item = &OsStr> {
    p.split(|&c| c == 0).map(OsStr::from_bytes)
}

/// A time in ns since the epoch as `fuse_attr` seconds and nanoseconds
/// (before the epoch: negative seconds, nanoseconds counted forward).
fn secs_nsecs(ns: i64) -> (u64, u32) {
    const NS: i64 = 1_000_000_000;
    (ns.div_euclid(NS) as u64, ns.rem_euclid(NS) as u32)
}

/// `fuse_open_out.open_flags` of an open.
fn fopen_bits(o: &Opened) -> u32 {
    let mut f = 0;
    if o.direct_io {
        f |= FOPEN_DIRECT_IO;
    }
    if o.noflush {
        f |= FOPEN_NOFLUSH;
    }
    f
}

/// `struct fuse_attr`.
fn put_attr(b: &mut [u8], a: &Attr) {
    let (at, atn) = secs_nsecs(a.atime);
    let (mt, mtn) = secs_nsecs(a.mtime);
    let (ct, ctn) = secs_nsecs(a.ctime);
    put64(b, 0, a.ino.0);
    put64(b, 8, a.size);
    put64(b, 16, a.blocks);
    put64(b, 24, at);
    put64(b, 32, mt);
    put64(b, 40, ct);
    put32(b, 48, atn);
    put32(b, 52, mtn);
    put32(b, 56, ctn);
    put32(b, 60, a.mode());
    put32(b, 64, a.nlink);
    put32(b, 68, a.uid);
    put32(b, 72, a.gid);
    put32(b, 76, a.rdev);
    put32(b, 80, a.blksize);
    put32(b, 84, 0);
}

/// `struct fuse_entry_out`.
fn put_entry(b: &mut [u8], a: &Attr, entry_ttl: Duration, attr_ttl: Duration) -> usize {
    put64(b, 0, a.ino.0);
    put64(b, 8, 0);
    put64(b, 16, entry_ttl.as_secs());
    put64(b, 24, attr_ttl.as_secs());
    put32(b, 32, entry_ttl.subsec_nanos());
    put32(b, 36, attr_ttl.subsec_nanos());
    put_attr(&mut b[40..40 + ATTR_SIZE], a);
    ENTRY_OUT
}

/// A `struct fuse_entry_out` for a name that does not exist: node id 0,
/// which the kernel keeps as a negative entry for `ttl` (an ENOENT error
/// reply would be forgotten at once).
fn put_negative_entry(b: &mut [u8], ttl: Duration) -> usize {
    b[..ENTRY_OUT].fill(0);
    put64(b, 16, ttl.as_secs());
    put32(b, 32, ttl.subsec_nanos());
    ENTRY_OUT
}

/// `struct fuse_attr_out`.
fn put_attr_out(b: &mut [u8], a: &Attr, ttl: Duration) -> usize {
    put64(b, 0, ttl.as_secs());
    put32(b, 8, ttl.subsec_nanos());
    put32(b, 12, 0);
    put_attr(&mut b[16..16 + ATTR_SIZE], a);
    16 + ATTR_SIZE
}

/// `struct fuse_open_out`.
fn put_open(b: &mut [u8], fh: u64, flags: u32) -> usize {
    put64(b, 0, fh);
    put32(b, 8, flags);
    put32(b, 12, 0);
    16
}

fn time_set(now: bool, set: bool, secs: u64, nsecs: u32) -> TimeSet {
    if now {
        TimeSet::Now
    } else if set {
        TimeSet::At((secs as i64).saturating_mul(1_000_000_000) + i64::from(nsecs))
    } else {
        TimeSet::Omit
    }
}

/// Serves the request in `ent`: (unique, reply payload length, errno).
fn handle(core: &Core, ent: &mut Entry) -> (u64, usize, i32) {
    let mut h = [0u8; HEADER_SIZE];
    h.copy_from_slice(ent.header());
    let opcode = u32_at(&h, 4);
    let unique = u64_at(&h, 8);
    let nodeid = u64_at(&h, 16);
    let who = Caller {
        uid: u32_at(&h, 24),
        gid: u32_at(&h, 28),
        pid: u32_at(&h, 32),
    };
    let in_len = (u32_at(&h, ENT_IN_OUT + 16) as usize).min(PAYLOAD_SIZE);
    let op = &h[OP_IN..OP_IN + 128];
    let payload = ent.payload();
    core.requests().count(opcode);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        dispatch(core, opcode, nodeid, who, op, payload, in_len)
    }));
    match r {
        Ok(Ok(n)) => (unique, n, 0),
        Ok(Err(e)) => (unique, 0, e.errno()),
        Err(_) => {
            warn!(opcode, "request handler panicked");
            (unique, 0, libc::EIO)
        }
    }
}

/// The first NUL-terminated name of the request payload.
fn first_name(p: &[u8], in_len: usize) -> Result<&OsStr> {
    names(&p[..in_len]).next().ok_or(Error::EINVAL)
}

/// Decodes one request, calls [`Core`], encodes the reply into `p`.
fn dispatch(
    core: &Core,
    opcode: u32,
    nodeid: u64,
    who: Caller,
    op: &[u8],
    p: &mut [u8],
    in_len: usize,
) -> Result<usize> {
    let o = core.options();
    let ino = Ino(nodeid);
    let entry = |p: &mut [u8], a: Result<Attr>| -> Result<usize> {
        Ok(put_entry(p, &a?, o.entry_timeout, o.attr_timeout))
    };
    match opcode {
        LOOKUP => match core.lookup(ino, first_name(p, in_len)?) {
            Err(Error::ENOENT) if !o.negative_timeout.is_zero() => {
                Ok(put_negative_entry(p, o.negative_timeout))
            }
            a => entry(p, a),
        },
        GETATTR => {
            let (ttl, a) = core.getattr(ino)?;
            Ok(put_attr_out(p, &a, ttl))
        }
        SETATTR => {
            let valid = u32_at(op, 0);
            let has = |bit: u32| valid & bit != 0;
            let a = SetAttr {
                size: has(FATTR_SIZE).then(|| u64_at(op, 16)),
                mode: has(FATTR_MODE).then(|| u32_at(op, 68)),
                uid: has(FATTR_UID).then(|| u32_at(op, 76)),
                gid: has(FATTR_GID).then(|| u32_at(op, 80)),
                atime: time_set(
                    has(FATTR_ATIME_NOW),
                    has(FATTR_ATIME),
                    u64_at(op, 32),
                    u32_at(op, 56),
                ),
                mtime: time_set(
                    has(FATTR_MTIME_NOW),
                    has(FATTR_MTIME),
                    u64_at(op, 40),
                    u32_at(op, 60),
                ),
                fh: has(FATTR_FH).then(|| Fh(u64_at(op, 8))),
            };
            let a = core.setattr(ino, a)?;
            Ok(put_attr_out(p, &a, o.attr_timeout))
        }
        READLINK => {
            let t = core.readlink(ino)?;
            let t = t.as_bytes();
            if t.len() > p.len() {
                return Err(Error::ENAMETOOLONG);
            }
            p[..t.len()].copy_from_slice(t);
            Ok(t.len())
        }
        SYMLINK => {
            let a = {
                let mut n = names(&p[..in_len]);
                let (Some(link), Some(target)) = (n.next(), n.next()) else {
                    return Err(Error::EINVAL);
                };
                core.symlink(who, ino, link, target)
            };
            entry(p, a)
        }
        MKNOD => {
            let n = first_name(p, in_len)?;
            let a = core.mknod(who, ino, n, u32_at(op, 0), u32_at(op, 4));
            entry(p, a)
        }
        MKDIR => {
            let n = first_name(p, in_len)?;
            let a = core.mkdir(who, ino, n, u32_at(op, 0));
            entry(p, a)
        }
        UNLINK => core.unlink(ino, first_name(p, in_len)?).map(|()| 0),
        RMDIR => core.rmdir(ino, first_name(p, in_len)?).map(|()| 0),
        RENAME | RENAME2 => {
            let newdir = u64_at(op, 0);
            let flags = if opcode == RENAME2 { u32_at(op, 8) } else { 0 };
            let mut n = names(&p[..in_len]);
            let (Some(old), Some(new)) = (n.next(), n.next()) else {
                return Err(Error::EINVAL);
            };
            core.rename(ino, old, Ino(newdir), new, flags).map(|()| 0)
        }
        LINK => {
            // fuse_link_in: the inode linked; the new name follows.
            let a = core.link(Ino(u64_at(op, 0)), ino, first_name(p, in_len)?);
            entry(p, a)
        }
        OPEN => {
            let o = core.open(ino, u32_at(op, 0) as i32)?;
            Ok(put_open(p, o.fh.0, fopen_bits(&o)))
        }
        READ => {
            let (fh, off, size) = (u64_at(op, 0), u64_at(op, 8), u32_at(op, 16) as usize);
            core.read(Fh(fh), off, &mut p[..size.min(PAYLOAD_SIZE)])
        }
        WRITE => {
            let (fh, off, size) = (u64_at(op, 0), u64_at(op, 8), u32_at(op, 16) as usize);
            if size > in_len {
                return Err(Error::EINVAL);
            }
            let n = core.write(Fh(fh), off, &p[..size])?;
            put32(p, 0, n as u32);
            put32(p, 4, 0);
            Ok(8)
        }
        STATFS => {
            let s = core.statfs()?;
            p[..80].fill(0);
            for (i, v) in [s.blocks, s.free, s.free, s.files, s.free]
                .into_iter()
                .enumerate()
            {
                put64(p, i * 8, v);
            }
            put32(p, 40, s.bsize);
            put32(p, 44, s.namelen);
            put32(p, 48, s.bsize);
            Ok(80)
        }
        RELEASE => core.release(Fh(u64_at(op, 0))).map(|()| 0),
        FSYNC => core.fsync(Fh(u64_at(op, 0))).map(|()| 0),
        FLUSH => core.flush(Fh(u64_at(op, 0))).map(|()| 0),
        SETXATTR | GETXATTR | LISTXATTR | REMOVEXATTR => Err(Error::EOPNOTSUPP),
        OPENDIR => Ok(put_open(p, core.opendir().0, 0)),
        READDIR => {
            let (fh, off, size) = (u64_at(op, 0), u64_at(op, 8), u32_at(op, 16) as usize);
            let size = size.min(PAYLOAD_SIZE);
            let mut used = 0;
            core.readdir(ino, Fh(fh), off, |eino, next, kind, name| {
                // struct fuse_dirent, padded to 8 bytes.
                let len = 24 + name.len();
                let padded = (len + 7) & !7;
                if used + padded > size {
                    return true;
                }
                let d = &mut p[used..used + padded];
                put64(d, 0, eino.0);
                put64(d, 8, next);
                put32(d, 16, name.len() as u32);
                put32(d, 20, kind.mode_bits() >> 12);
                d[24..len].copy_from_slice(name.as_bytes());
                d[len..].fill(0);
                used += padded;
                false
            })?;
            Ok(used)
        }
        RELEASEDIR => {
            core.releasedir(Fh(u64_at(op, 0)));
            Ok(0)
        }
        FSYNCDIR => Ok(0),
        ACCESS => core.access(who, ino, u32_at(op, 0) as i32).map(|()| 0),
        CREATE => {
            let (flags, mode) = (u32_at(op, 0) as i32, u32_at(op, 4));
            let n = first_name(p, in_len)?;
            let (a, opened) = core.create(who, ino, n, mode, flags)?;
            let len = put_entry(p, &a, o.entry_timeout, o.attr_timeout);
            Ok(len + put_open(&mut p[len..], opened.fh.0, fopen_bits(&opened)))
        }
        DESTROY => {
            core.destroy();
            Ok(0)
        }
        _ => Err(Error::ENOSYS),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn possible_cpu_lists_parse() {
        assert!(possible_cpus() >= 1);
    }

    #[test]
    fn names_split_at_nul() {
        let v: Vec<&OsStr> = names(b"old\0new\0").collect();
        assert_eq!(v[0], "old");
        assert_eq!(v[1], "new");
    }

    #[test]
    fn times_before_the_epoch_borrow_a_second() {
        assert_eq!(secs_nsecs(-1_500_000_000), ((-2i64) as u64, 500_000_000));
        assert_eq!(secs_nsecs(-2_000_000_000), ((-2i64) as u64, 0));
        assert_eq!(secs_nsecs(3_000_000_007), (3, 7));
        assert_eq!(secs_nsecs(0), (0, 0));
    }

    #[test]
    fn open_flags_are_the_kernel_bits() {
        let o = Opened {
            fh: Fh(1),
            direct_io: true,
            noflush: true,
        };
        assert_eq!(fopen_bits(&o), 1 | 1 << 5);
    }
}
