//! Local (Unix-socket) connections, clients' and peers' on this host,
//! registered for readability only.
//!
//! Each time a Unix stream's receiver consumes data, the kernel tells
//! everyone polling the sender's socket that it is writable
//! (`unix_write_space`), whether or not the sender ever found its buffer
//! full. tokio registers its streams for both directions, so every reply a
//! client read woke a parked server worker for nothing: a futile wake-up,
//! often across CPUs, per reply. (TCP only wakes a writer that found its
//! buffer full.) Here the socket is registered for readability only; a
//! write that finds the send buffer full registers a duplicate descriptor
//! for writability until a write goes through again.

use std::io::{self, IoSlice};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

/// The reading half.
pub(crate) struct LocalRead(Arc<AsyncFd<UnixStream>>);

/// The writing half.
pub(crate) struct LocalWrite {
    sock: Arc<AsyncFd<UnixStream>>,
    /// A duplicate of the socket registered for writability, while a write
    /// waits for room in the send buffer.
    waiter: Option<AsyncFd<UnixStream>>,
}

/// Splits a connected stream (the caller is in a tokio runtime).
pub(crate) fn split(s: tokio::net::UnixStream) -> io::Result<(LocalRead, LocalWrite)> {
    // into_std leaves the descriptor non-blocking.
    split_std(s.into_std()?)
}

/// Splits a connected non-blocking stream, registering it with the
/// calling thread's runtime.
pub(crate) fn split_std(s: UnixStream) -> io::Result<(LocalRead, LocalWrite)> {
    let fd = Arc::new(register(s, Interest::READABLE)?);
    Ok((
        LocalRead(fd.clone()),
        LocalWrite {
            sock: fd,
            waiter: None,
        },
    ))
}

fn register(s: UnixStream, interest: Interest) -> io::Result<AsyncFd<UnixStream>> {
    // SAFETY: the stream owns its descriptor and keeps it open, always the
    // same one, until the AsyncFd drops it.
    Ok(unsafe { AsyncFd::register_with_interest(s, interest) }?)
}

fn cvt(n: isize) -> io::Result<usize> {
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

impl AsyncRead for LocalRead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.0.poll_read_ready(cx))?;
            // SAFETY: recv only writes into the unfilled part, and the
            // bytes it reports written are marked initialised below.
            let dst = unsafe { buf.unfilled_mut() };
            let r = guard.try_io(|s| {
                // SAFETY: `dst` is valid for `dst.len()` bytes of writes.
                cvt(unsafe { libc::recv(s.as_raw_fd(), dst.as_mut_ptr().cast(), dst.len(), 0) })
            });
            match r {
                Ok(Ok(n)) => {
                    // Less than asked for: the socket is drained, so the
                    // next read waits for the next edge instead of asking
                    // once more only to hear EAGAIN (tokio's own sockets
                    // do the same; data that arrives meanwhile raises a
                    // newer readiness that this does not clear). One
                    // recv(2) per request instead of two.
                    if n > 0 && n < dst.len() {
                        guard.clear_ready();
                    }
                    // SAFETY: the kernel initialised the first `n` bytes.
                    unsafe { buf.assume_init(n) };
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl LocalWrite {
    /// Sends `bufs` without raising SIGPIPE.
    fn send(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        // SAFETY: a zeroed msghdr is valid (no name, no control data).
        let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
        // IoSlice is ABI-compatible with iovec on Unix; the kernel only
        // reads through it.
        m.msg_iov = bufs.as_ptr() as *mut libc::iovec;
        m.msg_iovlen = bufs.len() as _;
        // SAFETY: `m` points at `bufs`, which live across the call.
        cvt(unsafe { libc::sendmsg(self.sock.as_raw_fd(), &m, libc::MSG_NOSIGNAL) })
    }

    fn poll_send(&mut self, cx: &mut Context<'_>, bufs: &[IoSlice<'_>]) -> Poll<io::Result<usize>> {
        loop {
            match self.send(bufs) {
                Ok(n) => {
                    self.waiter = None;
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
            if self.waiter.is_none() {
                let dup = self.sock.get_ref().try_clone()?;
                self.waiter = Some(register(dup, Interest::WRITABLE)?);
            }
            let Some(w) = &self.waiter else {
                unreachable!("registered above")
            };
            // Readiness seen before this send attempt is cleared; any newer
            // one keeps (the guard clears only what it saw).
            ready!(w.poll_write_ready(cx))?.clear_ready();
        }
    }
}

/// As tokio's write halves do: the peer sees the end of the stream when
/// this half goes, even while the reading half still waits for data.
impl Drop for LocalWrite {
    fn drop(&mut self) {
        let _ = self.sock.get_ref().shutdown(std::net::Shutdown::Write);
    }
}

impl AsyncWrite for LocalWrite {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_send(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().poll_send(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.sock.get_ref().shutdown(std::net::Shutdown::Write))
    }
}
