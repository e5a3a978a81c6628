//! Bounded adaptive polling before a runtime worker sleeps
//! (`--poll-usec`).
//!
//! A worker with nothing to do sleeps in `epoll_wait(2)` (or on a condition
//! variable), and the next request must wake it: on many machines (virtual
//! ones especially, whose idle CPUs halt) that wake-up costs more than
//! serving the request. So before it sleeps, a worker polls the runtime's
//! epoll instance for a bounded window (`poll(2)` with a zero timeout,
//! yielding the CPU between tries to anything else that wants it); when an
//! event arrives meanwhile it goes on to `epoll_wait`, which then returns
//! at once. The window adapts as Linux's haltpoll governor does (and as the
//! client's, `chfs_client::poll`): a wake-up soon after the worker went to
//! sleep doubles it, a late one halves it down to nothing, so an idle
//! server stops polling after a few sleeps and stays asleep.
//!
//! A task woken by a thread outside the runtime (the fabric's progress
//! thread, a blocking or flush thread) goes to the runtime's global queue,
//! and the runtime unparks a worker for it only if one is parked: a worker
//! polling here is not yet, so such a task waited for the window to end.
//! The poll watches the global queue too and stops when a task is there.
//!
//! CPU lanes never poll: a lane's clients run on its CPU.

use std::cell::Cell;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chfs_sys::poll::START_NS;

/// Process-wide counts (one server per process): wake-ups that polling
/// caught, and polls that ended in sleep.
pub static HITS: AtomicU64 = AtomicU64::new(0);
pub static MISSES: AtomicU64 = AtomicU64::new(0);

/// Polling for a runtime whose epoll descriptor is set once it is known.
#[derive(Debug)]
pub struct ParkPoll {
    /// The runtime's epoll instance (-1: unknown, no polling).
    epfd: AtomicI32,
    max_ns: u64,
}

thread_local! {
    /// This worker's window, ns (None: not started).
    static WINDOW: Cell<Option<u64>> = const { Cell::new(None) };
    /// When this worker went to sleep after polling for how long.
    static SLEPT: Cell<Option<(Instant, bool)>> = const { Cell::new(None) };
}

impl ParkPoll {
    /// Polling of at most `max` per sleep (zero: never).
    pub fn new(max: Duration) -> ParkPoll {
        ParkPoll {
            epfd: AtomicI32::new(-1),
            max_ns: max.as_nanos().min(u64::MAX as u128) as u64,
        }
    }

    /// Polls `fd` (the runtime's epoll instance) from now on.
    pub fn set_epoll_fd(&self, fd: RawFd) {
        self.epfd.store(fd, Ordering::Relaxed);
    }

    /// Called by a worker about to sleep: polls for its window.
    pub fn before_park(&self) {
        let fd = self.epfd.load(Ordering::Relaxed);
        if fd < 0 || self.max_ns == 0 {
            return;
        }
        let w = WINDOW.get().unwrap_or(START_NS.min(self.max_ns));
        WINDOW.set(Some(w));
        if w > 0 {
            // The runtime of the worker calling (none in unit tests that
            // call this directly: only the descriptor is watched).
            let rt = tokio::runtime::Handle::try_current().ok();
            let queued = || {
                rt.as_ref()
                    .is_some_and(|h| h.metrics().global_queue_depth() > 0)
            };
            let start = Instant::now();
            loop {
                if chfs_sys::poll::readable_now(fd) || queued() {
                    HITS.fetch_add(1, Ordering::Relaxed);
                    SLEPT.set(None);
                    return;
                }
                if start.elapsed().as_nanos() as u64 >= w {
                    break;
                }
                std::thread::yield_now();
            }
        }
        SLEPT.set(Some((Instant::now(), w > 0)));
    }

    /// Called by a worker that woke up: adapts its window to how long it
    /// slept.
    pub fn after_unpark(&self) {
        let Some((at, polled)) = SLEPT.take() else {
            return;
        };
        if polled {
            MISSES.fetch_add(1, Ordering::Relaxed);
        }
        let w = WINDOW.get().unwrap_or(0);
        let slept = at.elapsed().as_nanos() as u64;
        WINDOW.set(Some(chfs_sys::poll::next_window(w, slept, self.max_ns)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    /// A new epoll instance.
    fn epoll() -> std::os::fd::OwnedFd {
        // SAFETY: epoll_create1 returns a new descriptor, owned below.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(ep >= 0);
        // SAFETY: ep is ours and closed only by this OwnedFd.
        unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(ep) }
    }

    #[test]
    fn a_task_queued_from_outside_the_runtime_ends_the_poll() {
        std::thread::spawn(|| {
            let ep = epoll();
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .build()
                .unwrap();
            // The one worker busy: a task spawned from this thread (as the
            // fabric's progress thread wakes one) waits in the global
            // queue, and nothing makes the runtime's descriptor readable.
            let (started, busy) = std::sync::mpsc::channel();
            let (release, done) = std::sync::mpsc::channel::<()>();
            rt.spawn(async move {
                started.send(()).unwrap();
                done.recv().unwrap();
            });
            busy.recv().unwrap();
            rt.spawn(async {});
            let p = ParkPoll::new(Duration::from_secs(20));
            p.set_epoll_fd(ep.as_raw_fd());
            WINDOW.set(Some(20_000_000_000));
            let hits = HITS.load(Ordering::Relaxed);
            let t = Instant::now();
            {
                let _in = rt.enter();
                p.before_park();
            }
            assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
            assert!(HITS.load(Ordering::Relaxed) > hits);
            assert!(SLEPT.get().is_none());
            release.send(()).unwrap();
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_worker_polls_until_an_event_waits_and_stops_polling_when_idle() {
        std::thread::spawn(|| {
            let ep = epoll();
            let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: 1,
            };
            // SAFETY: live descriptors and event.
            let rc = unsafe {
                libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, a.as_raw_fd(), &mut ev)
            };
            assert_eq!(rc, 0);
            let p = ParkPoll::new(Duration::from_micros(200));
            // Unknown descriptor: no polling at all.
            p.before_park();
            assert!(SLEPT.get().is_none());
            p.set_epoll_fd(ep.as_raw_fd());
            // An event waiting: caught by polling, no sleep.
            b.write_all(b"x").unwrap();
            let hits = HITS.load(Ordering::Relaxed);
            p.before_park();
            assert_eq!(HITS.load(Ordering::Relaxed), hits + 1);
            assert!(SLEPT.get().is_none());
            // Nothing comes: polled in vain, then long sleeps shrink the
            // window to nothing.
            let mut c = [0u8; 1];
            std::io::Read::read_exact(&mut &a, &mut c).unwrap();
            for _ in 0..12 {
                p.before_park();
                std::thread::sleep(Duration::from_micros(400));
                p.after_unpark();
            }
            assert_eq!(WINDOW.get(), Some(0));
            // Quick wake-ups bring it back.
            p.before_park();
            p.after_unpark();
            assert_eq!(WINDOW.get(), Some(START_NS));
        })
        .join()
        .unwrap();
    }
}
