//! The socket of a connection: TCP, or a Unix socket when the server runs
//! on this host.
//!
//! Every `chfsd` also listens on the abstract Unix socket
//! [`chfs_proto::local_socket_name`] of its advertised address. A client
//! first tries that name; it exists only in this host's network namespace,
//! so the connect fails at once (`ECONNREFUSED`) for a server elsewhere and
//! the client uses TCP. A Unix socket skips the TCP/IP stack (no segments,
//! checksums or loopback softirqs), which is most of the cost of moving
//! chunk data to a local server.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::time::Duration;

/// Send buffer asked for on Unix sockets (the kernel caps it at
/// `net.core.wmem_max`). A Unix stream queues at most the sender's buffer,
/// 208 KiB by default: a 1 MiB chunk would cross in five wake-ups.
pub const UNIX_SEND_BUFFER: libc::c_int = 4 << 20;

fn set_send_buffer(s: &impl AsRawFd) {
    let v = UNIX_SEND_BUFFER;
    // SAFETY: setsockopt on a socket we own with a c_int option value
    // read from a live local; failure only leaves the default.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// A connected socket.
pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    /// Connects to the local server advertised as `addr`, if there is one.
    pub fn local(addr: &str) -> Option<Stream> {
        let name = chfs_proto::local_socket_name(addr);
        let sa = SocketAddr::from_abstract_name(name.as_bytes()).ok()?;
        let s = UnixStream::connect_addr(&sa).ok()?;
        set_send_buffer(&s);
        Some(Stream::Unix(s))
    }

    /// Whether this is a Unix socket to a local server.
    pub fn is_local(&self) -> bool {
        matches!(self, Stream::Unix(_))
    }

    pub fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
        }
    }

    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(t),
            Stream::Unix(s) => s.set_write_timeout(t),
        }
    }

    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.shutdown(how),
            Stream::Unix(s) => s.shutdown(how),
        }
    }
}

impl std::os::fd::AsRawFd for Stream {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            // std sends on TCP with MSG_NOSIGNAL.
            Stream::Tcp(s) => s.write(buf),
            // std writes Unix sockets with write(2), which raises SIGPIPE
            // when the server is gone; a C program using the library would
            // die of it. send(2) with MSG_NOSIGNAL gives EPIPE instead.
            Stream::Unix(s) => {
                // SAFETY: send(2) on a socket we own, reading at most
                // buf.len() bytes from a live slice.
                let n = unsafe {
                    libc::send(
                        s.as_raw_fd(),
                        buf.as_ptr().cast(),
                        buf.len(),
                        libc::MSG_NOSIGNAL,
                    )
                };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            }
        }
    }

    /// One sendmsg(2) with MSG_NOSIGNAL for all of `bufs` (std's writev
    /// would raise SIGPIPE when the server is gone).
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let fd = self.as_raw_fd();
        // SAFETY: a zeroed msghdr is valid (no name, no control data).
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        // IoSlice is ABI-compatible with iovec; sendmsg only reads them.
        msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = bufs.len().min(1024) as _;
        // SAFETY: sendmsg(2) on a socket we own, reading at most the
        // lengths of the live slices `bufs` names.
        let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Writes all of `bufs` with as few sendmsg(2)s as the socket takes
/// (`Write::write_all_vectored` is not stable).
pub(crate) fn write_all_vectored(
    w: &mut impl Write,
    mut bufs: &mut [io::IoSlice<'_>],
) -> io::Result<()> {
    io::IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match w.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => io::IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame's head and data go in one sendmsg(2) that, to a peer that
    /// is gone, fails with EPIPE instead of raising SIGPIPE (which would
    /// kill a C program using the library): checked in a child process
    /// with SIGPIPE's default action (the test harness ignores it).
    #[test]
    fn vectored_writes_to_a_closed_peer_give_epipe_not_sigpipe() {
        let (a, b) = UnixStream::pair().unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let t = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        drop(l.accept().unwrap());
        drop(l);
        drop(b);
        let head = [1u8; 24];
        let data = vec![2u8; 1 << 20];
        for mut s in [Stream::Unix(a), Stream::Tcp(t)] {
            // SAFETY: the child only resets a signal's action, makes
            // system calls on memory prepared before the fork and exits.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork");
            if pid == 0 {
                // SAFETY: see above.
                unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
                let mut bufs = [io::IoSlice::new(&head), io::IoSlice::new(&data)];
                // (A TCP peer that closed first answers with a reset:
                // the first send may go, a later one fails.)
                let mut code = 1;
                for _ in 0..4 {
                    if let Err(e) = write_all_vectored(&mut s, &mut bufs) {
                        code = if e.raw_os_error() == Some(libc::EPIPE)
                            || e.raw_os_error() == Some(libc::ECONNRESET)
                        {
                            0
                        } else {
                            2
                        };
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                // SAFETY: leaves the child at once, running no destructors.
                unsafe { libc::_exit(code) };
            }
            let mut status = 0;
            // SAFETY: waits for the child forked above.
            assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "{:?}: child status {status:#x} (signal {})",
                matches!(s, Stream::Tcp(_)),
                libc::WTERMSIG(status)
            );
        }
    }
}
