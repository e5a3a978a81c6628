//! A link to a server over a libfabric endpoint (a server address
//! `ofi+tcp://IP:PORT`, ...): the fabric side of [`crate::link::Link`].
//!
//! One endpoint per process and protocol is shared by the links to every
//! server ([`endpoint_for`]); a link is a peer and the session token its
//! server gave in the handshake (`chfs_fabric::rpc`). Replies of every
//! server arrive on the one completion queue, and the thread reading it
//! files them by frame id for their waiters (ids are unique per process),
//! as [`crate::conn::Conn`]'s reader does for one socket. A send that
//! fails, or a wait that sees the transport fail (a dead server: ENOTCONN,
//! ECONNRESET), marks the link broken and removes the peer from the
//! address vector, so that the next link to that server (the pool opens one
//! on the next request) starts a new rxm connection and a new session.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use chfs_fabric::rpc::{RpcClient, RpcError, Session};
use chfs_fabric::{Address, Endpoint, Protocol};
use chfs_proto::frame::{Header, FLAG_ERROR};
use chfs_proto::handshake::Credential;
use chfs_proto::msg::decode_error;
use chfs_proto::{Request, Response};
use chfs_sys::lock;

use crate::config::ClientConfig;
use crate::error::{ConnFault, Error, Result};

/// Largest message: must be the server's (chfsd's `fabric::MAX_MESSAGE`),
/// checked by the handshake.
pub(crate) const MAX_MESSAGE: usize = 64 * 1024 + 4096;

/// Is `addr` a fabric address (`ofi+...://`)?
pub(crate) fn is_fabric(addr: &str) -> bool {
    addr.starts_with("ofi+")
}

/// The process's RPC client of `protocol`, its endpoint opened on the
/// first use (bound to the local address that routes to `server`).
///
/// A forked child gets its own: the parent's endpoint (its provider's
/// sockets and queues) is the parent's; the child leaves it alone.
fn endpoint_for(protocol: Protocol, server: &Address) -> Result<Arc<RpcClient>> {
    type Clients = HashMap<(Protocol, u32), Arc<RpcClient>>;
    static CLIENTS: OnceLock<Mutex<Clients>> = OnceLock::new();
    let mut g = lock(CLIENTS.get_or_init(Default::default));
    let key = (protocol, crate::process_id());
    if let Some(c) = g.get(&key) {
        return Ok(c.clone());
    }
    let mut cfg = chfs_fabric::Config::new(protocol);
    cfg.max_message = MAX_MESSAGE;
    cfg.recv_buffers = 64;
    if let Some(ip) = server.socket_addr().and_then(|sa| route_to(&sa)) {
        cfg = cfg.bind(&ip, None);
    }
    let ep = Endpoint::open(&cfg).map_err(|e| {
        Error::new(
            e.errno(),
            format!("cannot open a {protocol} endpoint for server {server}: {e}"),
        )
    })?;
    let c = Arc::new(RpcClient::new(Arc::new(ep)));
    g.insert(key, c.clone());
    Ok(c)
}

/// The local IP address the kernel would use to reach `to` (a UDP socket
/// connected there sends nothing).
fn route_to(to: &std::net::SocketAddr) -> Option<String> {
    let any = if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
    let s = std::net::UdpSocket::bind(any).ok()?;
    s.connect(to).ok()?;
    Some(s.local_addr().ok()?.ip().to_string())
}

/// A session with one server over the fabric.
pub(crate) struct FabricLink {
    addr: String,
    rpc: Arc<RpcClient>,
    session: Session,
    alive: AtomicBool,
    timeout: Duration,
    opened: Instant,
    last_io: AtomicU64,
    /// The process that opened it (a forked child opens its own).
    pid: u32,
}

fn rpc_err(addr: &str, what: &str, e: RpcError) -> Error {
    match e {
        RpcError::Remote(r) => Error::new(r.errno, format!("server {addr}: {}", r.message)),
        e => Error::new(e.errno(), format!("server {addr}: {what}: {e}")),
    }
}

impl FabricLink {
    /// Opens a session with the server at `addr` (the handshake with the
    /// pool's secret as `cfg.role`).
    pub fn connect(addr: &str, cfg: &ClientConfig) -> Result<FabricLink> {
        let a: Address = addr
            .parse()
            .map_err(|e| Error::new(libc::EINVAL, format!("server {addr}: {e}")))?;
        let cred = Credential::parse(&cfg.secret)
            .map_err(|e| Error::new(libc::EINVAL, format!("CHFS_SECRET(_FILE): {e}")))?;
        let rpc = endpoint_for(a.protocol, &a)?;
        let timeout = cfg.rpc_timeout;
        let session = match rpc.handshake(&a, cfg.role, &cred, timeout) {
            Ok(s) => s,
            Err(e) => {
                // A broken rxm connection to that server is not reused.
                if let Ok(p) = rpc.endpoint().connect(&a) {
                    let _ = rpc.endpoint().disconnect(p);
                }
                return Err(rpc_err(addr, "handshake", e));
            }
        };
        Ok(FabricLink {
            addr: addr.to_string(),
            rpc,
            session,
            alive: AtomicBool::new(true),
            timeout,
            opened: Instant::now(),
            last_io: AtomicU64::new(0),
            pid: crate::process_id(),
        })
    }

    /// Is the link still usable?
    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire) && self.pid == crate::process_id()
    }

    /// How long since the link last sent or received.
    pub fn idle_for(&self) -> Duration {
        let last = self.last_io.load(Ordering::Relaxed);
        Duration::from_nanos((self.opened.elapsed().as_nanos() as u64).saturating_sub(last))
    }

    fn note_io(&self) {
        self.last_io
            .store(self.opened.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// Marks the link broken and forgets the peer (its rxm connection may
    /// be broken for good: a new link inserts it again).
    fn fail(&self) {
        if self.alive.swap(false, Ordering::AcqRel) && self.pid == crate::process_id() {
            let _ = self.rpc.endpoint().disconnect(self.session.peer);
        }
    }

    /// Sends a request whose payload is `head` followed by `tail`; returns
    /// its frame id.
    pub fn send_raw(&self, op: u16, head: &[u8], tail: &[u8]) -> Result<(u64, Instant)> {
        let addr = &self.addr;
        if !self.alive() {
            return Err(
                Error::new(libc::EIO, format!("link to server {addr} is broken"))
                    .with_conn_fault(ConnFault::NotSent),
            );
        }
        let mut payload = Vec::with_capacity(head.len() + tail.len());
        payload.extend_from_slice(head);
        payload.extend_from_slice(tail);
        if payload.len() + 32 > MAX_MESSAGE {
            return Err(Error::new(
                libc::EMSGSIZE,
                format!(
                    "server {addr}: a request of {} bytes does not fit a fabric message ({MAX_MESSAGE} bytes)",
                    payload.len()
                ),
            ));
        }
        match self.rpc.post(&self.session, op, 0, &payload, self.timeout) {
            Ok(id) => {
                self.note_io();
                Ok((id, Instant::now()))
            }
            Err(e) => {
                self.fail();
                Err(rpc_err(addr, "send failed", e).with_conn_fault(ConnFault::NotSent))
            }
        }
    }

    /// Sends a request.
    pub fn send(&self, req: &Request) -> Result<(u64, Instant)> {
        let mut head = Vec::with_capacity(64);
        req.encode(&mut head);
        self.send_raw(req.op(), &head, &[])
    }

    /// Waits for the answer to request `id` sent at `sent`, at most the
    /// request timeout after it was sent (the requests of a pipeline to a
    /// server that died all fail about one timeout after they left, not
    /// one timeout after another). A timeout also marks the link broken:
    /// rxm may accept a small message for a peer that is gone and lose it,
    /// so the next request opens a new session, which finds out.
    pub fn wait(&self, id: u64, sent: Instant) -> Result<Response> {
        let left = self
            .timeout
            .saturating_sub(sent.elapsed())
            .max(Duration::from_millis(1));
        match self.rpc.wait(id, left) {
            Ok((h, payload)) => {
                self.note_io();
                self.decode(h, payload)
            }
            Err(RpcError::Fabric(chfs_fabric::Error::Timeout { .. })) => {
                self.fail();
                Err(Error::new(
                    libc::ETIMEDOUT,
                    format!(
                        "server {} did not answer within {} ms",
                        self.addr,
                        self.timeout.as_millis()
                    ),
                ))
            }
            Err(e) => {
                self.fail();
                Err(rpc_err(&self.addr, "lost", e).with_conn_fault(ConnFault::Lost))
            }
        }
    }

    fn decode(&self, h: Header, payload: Bytes) -> Result<Response> {
        if h.flags & FLAG_ERROR != 0 {
            match decode_error(payload) {
                Ok(e) => Err(Error::from(e)),
                Err(e) => Err(Error::new(
                    libc::EPROTO,
                    format!("server {}: bad error reply: {e}", self.addr),
                )),
            }
        } else {
            Response::decode(payload).map_err(|e| {
                Error::new(
                    libc::EPROTO,
                    format!("server {}: bad reply: {e}", self.addr),
                )
            })
        }
    }
}
