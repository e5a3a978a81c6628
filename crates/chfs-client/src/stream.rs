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

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
