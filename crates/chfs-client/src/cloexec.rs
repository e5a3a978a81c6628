//! Close-on-exec for the descriptors libfabric makes. The provider opens
//! its sockets, socket pairs and epoll sets without `O_CLOEXEC`, so a
//! program using the client over `ofi+*` would pass them on to every
//! program it execs (keeping the client's connections open after it
//! ends). The calls that make them (opening the endpoint, a session's
//! handshake, which opens the connection) are wrapped: descriptors of
//! those kinds that appeared during the call get `FD_CLOEXEC`.

use std::collections::HashMap;
use std::path::PathBuf;

/// Runs `f`, then marks close-on-exec the sockets, pipes and anonymous
/// inodes (epoll sets, eventfds) opened meanwhile. Another thread's
/// descriptor of those kinds opened in the same moments is marked too (it
/// would then not be inherited): the window is one endpoint open or
/// handshake.
pub(crate) fn new_fds_cloexec<T>(f: impl FnOnce() -> T) -> T {
    let before = open_fds();
    let r = f();
    for (fd, target) in open_fds() {
        // A number seen before names a new descriptor only if it names
        // another file now (the listing's own directory descriptor had
        // the lowest free number).
        if before.get(&fd) == Some(&target) || !transport_kind(&target) {
            continue;
        }
        // SAFETY: fcntl(2) on a descriptor number: at worst EBADF.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 && flags & libc::FD_CLOEXEC == 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
    r
}

/// This process's descriptors and what each names.
fn open_fds() -> HashMap<i32, PathBuf> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return HashMap::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let fd = e.file_name().to_str()?.parse().ok()?;
        Some((fd, std::fs::read_link(e.path()).ok()?))
    })
    .collect()
}

/// A socket, a pipe or an anonymous inode (what a provider makes).
fn transport_kind(target: &std::path::Path) -> bool {
    let t = target.to_string_lossy();
    t.starts_with("socket:") || t.starts_with("anon_inode:") || t.starts_with("pipe:")
}
