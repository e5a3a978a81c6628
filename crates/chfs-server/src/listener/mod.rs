//! Accepting connections: the TCP listener and the local (abstract Unix)
//! socket, the handshake and the connections-per-peer limit, and the
//! hand-over of local connections to CPU lanes ([`lanes`]). An admitted
//! connection is served by [`serve_conn`].

mod lanes;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chfs_proto::frame::Header;
use chfs_proto::msg::op;
use chfs_proto::{ErrorReply, Request, Response};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tracing::{debug, info, warn};

use crate::connection::{dup_fd, response_frame, serve_conn, write_all_vectored, Access};
use crate::metrics::Counters;
use crate::net;
use crate::state::Shared;

use lanes::Lanes;

/// The abstract Unix socket for clients on this host
/// ([`chfs_proto::local_socket_name`]); None (TCP only) if it cannot be
/// bound, e.g. another server advertises the same address in this network
/// namespace.
pub(crate) fn bind_local(me: &str) -> Option<UnixListener> {
    use std::os::linux::net::SocketAddrExt;
    let name = chfs_proto::local_socket_name(me);
    let r = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .and_then(|a| std::os::unix::net::UnixListener::bind_addr(&a))
        .and_then(|l| {
            l.set_nonblocking(true)?;
            UnixListener::from_std(l)
        });
    match r {
        Ok(l) => Some(l),
        Err(e) => {
            warn!(%name, "no local socket, clients on this host use TCP: {e}");
            None
        }
    }
}

async fn unix_accept(l: Option<&UnixListener>) -> std::io::Result<UnixStream> {
    match l {
        Some(l) => l.accept().await.map(|(s, _)| s),
        None => std::future::pending().await,
    }
}

/// Accepts TCP and local connections until the server stops, then leaves
/// the store durable.
pub(crate) async fn accept_loop(
    shared: Arc<Shared>,
    listener: TcpListener,
    local: Option<UnixListener>,
) {
    let mut stop = shared.shutdown.subscribe();
    // Threads serving local connections on their clients' CPUs.
    let lanes = Arc::new(Lanes::default());
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, peer)) => {
                    let sh = shared.clone();
                    tokio::spawn(async move { serve_tcp(sh, stream, peer.to_string()).await });
                }
                Err(e) => {
                    warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            r = unix_accept(local.as_ref()) => match r {
                Ok(stream) => {
                    let (sh, lanes) = (shared.clone(), lanes.clone());
                    tokio::spawn(async move { serve_unix(sh, lanes, stream).await });
                }
                Err(e) => {
                    warn!("accept on the local socket failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = stop.changed() => break,
        }
    }
    info!(addr = %shared.me, "chfsd stopped listening");
    // A server that stops leaves its (persistent) store durable.
    let st = shared.store.clone();
    match tokio::task::spawn_blocking(move || st.sync()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => warn!("syncing the store at shutdown failed: {e}"),
        Err(e) => warn!("syncing the store at shutdown failed: {e}"),
    }
}

/// The handshake of a new connection: what it may do ([`Access`]), or
/// None if refused (`refuse`: refused whatever it says).
async fn admitted<S>(
    shared: &Shared,
    stream: &mut S,
    peer: &str,
    refuse: Option<ErrorReply>,
) -> Option<Access>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    match net::timeout(
        Duration::from_secs(10),
        net::accept_handshake(stream, shared.keys.as_ref(), refuse),
    )
    .await
    {
        Ok(role) => {
            debug!(%peer, ?role, "connection accepted");
            Some(Access(role))
        }
        Err(e) => {
            Counters::inc(&shared.counters.refused);
            warn!(%peer, "connection refused: {e}");
            None
        }
    }
}

async fn serve_tcp(shared: Arc<Shared>, mut stream: TcpStream, peer: String) {
    use std::os::fd::AsRawFd;
    let _ = stream.set_nodelay(true);
    crate::limits::keepalive(stream.as_raw_fd());
    let host = stream
        .peer_addr()
        .map_or_else(|_| peer.clone(), |a| a.ip().to_string());
    let (guard, refuse) = enter_peer(&shared, host);
    if let Some(access) = admitted(&shared, &mut stream, &peer, refuse).await {
        let fd = dup_fd(&stream);
        let (rd, wr) = stream.into_split();
        serve_conn(shared, rd, wr, peer, None, None, access, fd).await;
    }
    drop(guard);
}

/// Counts a connection of client host or local user `key`; past
/// `--max-conns-per-peer`, the refusal its handshake gets.
fn enter_peer(
    shared: &Shared,
    key: String,
) -> (Option<crate::limits::PeerGuard>, Option<ErrorReply>) {
    let max = shared.limits.max_conns_per_peer;
    match shared.peers_open.enter(key.clone(), max) {
        Some(g) => (Some(g), None),
        None => {
            Counters::inc(&shared.counters.over_limit);
            (
                None,
                Some(ErrorReply::new(
                    libc::EAGAIN,
                    format!("{key} has {max} connections to this server already (chfsd --max-conns-per-peer)"),
                )),
            )
        }
    }
}

/// Send buffer of local connections: read replies carry whole chunks, and
/// a Unix stream queues at most the sender's buffer (208 KiB by default;
/// the kernel caps the request at `net.core.wmem_max`).
const UNIX_SEND_BUFFER: libc::c_int = 4 << 20;

/// A local connection: after the handshake, on the CPU lane its first
/// request asks for ([`lanes`]), else on the shared runtime.
async fn serve_unix(shared: Arc<Shared>, lanes: Arc<Lanes>, mut stream: UnixStream) {
    use std::os::fd::AsRawFd;
    let v = UNIX_SEND_BUFFER;
    let len = std::mem::size_of_val(&v) as libc::socklen_t;
    // SAFETY: setsockopt on the socket this task owns, reading a c_int from
    // a live local; failure leaves the default buffer.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&v as *const libc::c_int).cast(),
            len,
        )
    };
    let (peer, cma, uid) = match stream.peer_cred() {
        Ok(c) => (
            format!("local pid {} uid {}", c.pid().unwrap_or(0), c.uid()),
            crate::connection::cma::peer_pid(&c),
            Some(c.uid()),
        ),
        Err(_) => ("local".to_string(), None, None),
    };
    let (guard, over) = enter_peer(&shared, format!("local user {}", uid.unwrap_or(u32::MAX)));
    let refuse = match uid {
        _ if over.is_some() => over,
        Some(u) if shared.local_users.allows(u) => None,
        Some(u) => Some(ErrorReply::new(
            libc::EACCES,
            format!("user {u} may not use this server's local socket (chfsd --local-users)"),
        )),
        None => Some(ErrorReply::new(
            libc::EACCES,
            "the local peer's credentials are unknown",
        )),
    };
    let Some(access) = admitted(&shared, &mut stream, &peer, refuse).await else {
        return;
    };
    // Counted while the connection lives (a lane's included).
    let peer_guard = guard;
    // The first request may ask for a CPU lane (read on its own: nothing
    // after it is buffered here).
    let (h, payload) = match net::read_frame(&mut stream).await {
        Ok(Some(f)) => f,
        Ok(None) => return,
        Err(e) => {
            warn!(%peer, "closing connection: {e}");
            return;
        }
    };
    if h.op != op::LANE || h.flags != 0 {
        serve_local(shared, stream, peer, cma, Some((h, payload)), access).await;
        drop(peer_guard);
        return;
    }
    let n = lanes::cpus();
    let lane = match Request::decode(op::LANE, payload) {
        // Started before the answer, so an accepted lane is there.
        Ok(Request::Lane { cpu }) if cpu < n => lanes.get(&shared, cpu).map_err(|e| {
            ErrorReply::new(
                e.raw_os_error().unwrap_or(libc::EAGAIN),
                format!("cannot start the lane of CPU {cpu}: {e}"),
            )
        }),
        Ok(_) => Err(ErrorReply::new(
            libc::EINVAL,
            format!("no CPU lane here for that CPU (CPUs 0-{})", n - 1),
        )),
        Err(e) => Err(ErrorReply::new(
            e.errno(),
            format!("malformed request: {e}"),
        )),
    };
    let reply = match &lane {
        Ok(_) => Ok(Response::Ok),
        Err(e) => Err(e.clone()),
    };
    // Neither answer carries a data tail.
    let (rh, head, _, _) = response_frame(h.id, h.op, reply);
    if let Err(e) = write_all_vectored(&mut stream, &rh.encode(), &head).await {
        warn!(%peer, "closing connection: {e}");
        return;
    }
    let Ok(lane) = lane else {
        // Refused: the connection goes on without a lane.
        serve_local(shared, stream, peer, cma, None, access).await;
        drop(peer_guard);
        return;
    };
    let handed = stream.into_std().and_then(|stream| {
        lane.hand_over(lanes::Incoming {
            stream,
            peer: peer.clone(),
            cma,
            access,
            _peer_guard: peer_guard,
        })
    });
    if let Err(e) = handed {
        warn!(%peer, "closing connection: {e}");
    }
}

/// Serves a local connection on the shared runtime.
async fn serve_local(
    shared: Arc<Shared>,
    stream: UnixStream,
    peer: String,
    cma: Option<libc::pid_t>,
    first: Option<(Header, Bytes)>,
    access: Access,
) {
    let fd = dup_fd(&stream);
    match crate::local_io::split(stream) {
        Ok((rd, wr)) => serve_conn(shared, rd, wr, peer, cma, first, access, fd).await,
        Err(e) => warn!(%peer, "closing connection: {e}"),
    }
}
