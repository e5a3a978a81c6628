//! Cross-memory attach: requests whose data stays in a local client's
//! memory ([`chfs_proto::frame::FLAG_CMA`]) and is copied from there with
//! `process_vm_readv(2)`, one copy instead of two through the socket.
//!
//! Only for Unix-socket peers running as the server's own user (the peer's
//! pid comes from `SO_PEERCRED`, never from the request), so a client can
//! only name its own memory, which the kernel lets the server read anyway.

use std::mem::MaybeUninit;

use bytes::{Bytes, BytesMut};
use chfs_proto::frame::{CmaRef, Header};
use chfs_proto::msg::op;
use chfs_proto::{ErrorReply, Request, Response};
use chfs_store::{Fill, StoreError};

use crate::metrics::Counters;
use crate::shm::Window;
use crate::state::Shared;

/// The peer a connection may read from, if any: its pid when it runs as
/// this server's effective user.
pub(crate) fn peer_pid(cred: &tokio::net::unix::UCred) -> Option<libc::pid_t> {
    // SAFETY: geteuid cannot fail and touches no memory.
    let me = unsafe { libc::geteuid() };
    (cred.uid() == me).then(|| cred.pid()).flatten()
}

/// Copies `r` out of process `pid` into `dst` (of `r.len` bytes): from
/// the shared-memory window when it lies there, else with
/// `process_vm_readv`.
fn fetch_into(
    sh: &Shared,
    pid: libc::pid_t,
    window: Option<&Window>,
    r: CmaRef,
    dst: &mut [MaybeUninit<u8>],
) -> Result<(), ErrorReply> {
    // The sender stops waiting at the deadline and may reuse the memory.
    if CmaRef::clock_ns() > r.deadline_ns {
        return Err(ErrorReply::new(
            libc::ETIMEDOUT,
            "the client stopped waiting for this request",
        ));
    }
    let len = dst.len();
    if window.is_some_and(|w| w.copy_into(r.addr, dst)) {
        Counters::inc(&sh.counters.shm_writes);
        return Ok(());
    }
    let local = libc::iovec {
        iov_base: dst.as_mut_ptr().cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: r.addr as usize as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: the local iovec covers the `len` writable bytes of `dst`;
    // the remote one is only dereferenced by the kernel, in the peer's
    // address space, where a bad address gives EFAULT.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return Err(ErrorReply::io("cannot read the client's memory", &e));
    }
    if n as usize != len {
        return Err(ErrorReply::new(
            libc::EFAULT,
            format!("read {n} of {len} bytes from the client's memory"),
        ));
    }
    Ok(())
}

/// [`fetch_into`] a new buffer.
fn fetch(
    sh: &Shared,
    pid: libc::pid_t,
    window: Option<&Window>,
    r: CmaRef,
) -> Result<Bytes, ErrorReply> {
    let len = r.len as usize;
    let mut buf = BytesMut::with_capacity(len);
    fetch_into(sh, pid, window, r, &mut buf.spare_capacity_mut()[..len])?;
    // SAFETY: `fetch_into` wrote all `len` bytes.
    unsafe { buf.set_len(len) };
    Ok(buf.freeze())
}

/// Serves a request flagged `FLAG_CMA` from a peer allowed to use it
/// (`pid`; None: refused) and the connection's shared-memory window. A
/// write's bytes are fetched by the store ([`chfs_store::Src::Fill`]):
/// straight into the chunk where it can, so that they are copied once.
pub(crate) async fn serve(
    sh: &std::sync::Arc<Shared>,
    pid: Option<libc::pid_t>,
    window: Option<&Window>,
    h: Header,
    payload: Bytes,
) -> Result<Response, ErrorReply> {
    let pid = pid.ok_or_else(|| {
        ErrorReply::new(
            libc::EPERM,
            "cross-memory attach is only for local clients of the server's user",
        )
    })?;
    let (rest, r) = CmaRef::split_off(&payload)
        .map_err(|e| ErrorReply::new(e.errno(), format!("malformed request: {e}")))?;
    let head = payload.slice(..rest.len());
    match h.op {
        op::PING if head.is_empty() => Ok(Response::Data(fetch(sh, pid, window, r)?)),
        op::WRITE => {
            let req = Request::decode(op::WRITE, head)
                .map_err(|e| ErrorReply::new(e.errno(), format!("malformed request: {e}")))?;
            if let Request::Write { data, .. } = &req {
                if !data.is_empty() {
                    return Err(ErrorReply::new(
                        libc::EPROTO,
                        "malformed request: data both in the frame and in memory",
                    ));
                }
            }
            Counters::inc(&sh.counters.cma_writes);
            let forwarded = h.flags & chfs_proto::frame::FLAG_FORWARDED != 0;
            let get = |dst: &mut [MaybeUninit<u8>]| {
                fetch_into(sh, pid, window, r, dst)
                    .map_err(|e| StoreError::refused(e.errno, e.message))
            };
            let fill = Fill::new(r.len as usize, &get);
            crate::handler::handle_write_from(sh, req, forwarded, fill).await
        }
        other => Err(ErrorReply::new(
            libc::EINVAL,
            format!("cross-memory attach is not allowed on request {other}"),
        )),
    }
}
