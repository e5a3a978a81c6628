//! Readiness without blocking, for bounded polling before a thread sleeps.

use std::io;
use std::os::fd::RawFd;

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
