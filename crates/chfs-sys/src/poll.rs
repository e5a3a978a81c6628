//! Readiness without blocking, for bounded polling before a thread sleeps.

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

/// The longest polling window of the `auto` settings (`CHFS_POLL_USEC`,
/// `chfsd --poll-usec`) on a machine where the process may use 2+ CPUs.
pub const AUTO_MAX: Duration = Duration::from_micros(100);

/// Where a growing polling window starts, ns.
pub const START_NS: u64 = 5_000;

/// The polling window after a wait that polled for `window_ns` in vain
/// and then slept for `slept_ns` (Linux's haltpoll rule, for the client's
/// replies and the server's workers alike): a wake-up that came within the
/// longest window `max_ns` of sleeping doubles it (polling somewhat longer
/// would have caught it), a later one halves it, down to nothing.
pub fn next_window(window_ns: u64, slept_ns: u64, max_ns: u64) -> u64 {
    if slept_ns <= max_ns {
        (window_ns * 2).max(START_NS).min(max_ns)
    } else if window_ns / 2 < START_NS {
        0
    } else {
        window_ns / 2
    }
}

/// The longest window of `auto` here: [`AUTO_MAX`] where the calling
/// thread may run on 2+ CPUs (a poller then leaves a CPU to its peer),
/// else none.
pub fn auto_max() -> Duration {
    match crate::cpu::allowed_count() {
        Ok(n) if n >= 2 => AUTO_MAX,
        _ => Duration::ZERO,
    }
}

/// Is `fd` readable right now (`poll(2)` with a zero timeout)? An epoll
/// descriptor is readable while events wait in its ready list. False on
/// any error (a descriptor that is not open gives POLLNVAL: false).
pub fn readable_now(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd, of the count given; a zero timeout never
    // blocks.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & libc::POLLIN != 0
}

/// The epoll instances this process has open: for each, its lowest
/// descriptor (one whose `/proc/self/fd` link is `anon_inode:[eventpoll]`;
/// descriptors duplicated from one instance count once), in increasing
/// order.
pub fn epoll_fds() -> io::Result<Vec<RawFd>> {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    Ok(epoll_descriptors()?
        .into_iter()
        .filter(|fd| {
            std::fs::metadata(format!("/proc/self/fd/{fd}"))
                .map(|m| seen.insert(m.ino()))
                .unwrap_or(false)
        })
        .collect())
}

fn epoll_descriptors() -> io::Result<Vec<RawFd>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc/self/fd")? {
        let e = e?;
        let Some(fd) = e.file_name().to_str().and_then(|s| s.parse::<RawFd>().ok()) else {
            continue;
        };
        if std::fs::read_link(e.path()).is_ok_and(|l| l.as_os_str() == "anon_inode:[eventpoll]") {
            v.push(fd);
        }
    }
    v.sort_unstable();
    Ok(v)
}

/// CPU time this process has used, user and system, in ns
/// (`CLOCK_PROCESS_CPUTIME_ID`).
pub fn process_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the live timespec above.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn the_window_doubles_for_soon_wakeups_and_halves_to_nothing_for_late_ones() {
        let max = 100_000;
        assert_eq!(next_window(0, 10_000, max), START_NS);
        assert_eq!(next_window(START_NS, 10_000, max), 2 * START_NS);
        assert_eq!(next_window(80_000, 10_000, max), max);
        assert_eq!(next_window(max, 1_000_000, max), max / 2);
        assert_eq!(next_window(START_NS, 1_000_000, max), 0);
    }

    #[test]
    fn readiness_is_seen_without_waiting() {
        let (a, mut b) = UnixStream::pair().unwrap();
        assert!(!readable_now(a.as_raw_fd()));
        b.write_all(b"x").unwrap();
        assert!(readable_now(a.as_raw_fd()));
        assert!(!readable_now(-1));
    }

    #[test]
    fn a_new_epoll_instance_is_listed_and_readable_once_an_event_waits() {
        let before = epoll_fds().unwrap();
        // SAFETY: epoll_create1 returns a new descriptor we own.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(ep >= 0);
        // SAFETY: ep was just created and is closed only by this OwnedFd.
        let ep = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(ep) };
        let after = epoll_fds().unwrap();
        assert!(after.contains(&ep.as_raw_fd()) && !before.contains(&ep.as_raw_fd()));
        // A duplicate is the same instance, listed once (by whichever of
        // the two descriptors is lower: the duplicate may take a lower
        // number another test has just freed).
        let dup = ep.try_clone().unwrap();
        let again = epoll_fds().unwrap();
        assert_eq!(again.len(), after.len(), "{again:?} vs {after:?}");
        assert!(again.contains(&ep.as_raw_fd()) != again.contains(&dup.as_raw_fd()));
        drop(dup);
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 1,
        };
        // SAFETY: both descriptors are live; ev is a live event.
        let rc =
            unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, a.as_raw_fd(), &mut ev) };
        assert_eq!(rc, 0);
        assert!(!readable_now(ep.as_raw_fd()));
        b.write_all(b"x").unwrap();
        assert!(readable_now(ep.as_raw_fd()));
        assert!(process_cpu_ns() > 0);
    }
}
