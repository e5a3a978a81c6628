//! Connections from this server to the other servers of the pool
//! (forwarding, membership pushes, rename moves). Many requests share one
//! connection per peer and complete in any order.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use chfs_proto::frame::FLAG_ERROR;
use chfs_proto::handshake::{Credential, Role};
use chfs_proto::msg::decode_error;
use chfs_proto::{ErrorReply, Request, Response};
use chfs_sys::lock;
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::{mpsc, oneshot};

use crate::net::{self, NetError};

type Reply = Result<Response, ErrorReply>;
type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Reply>>>>;

struct Conn {
    tx: mpsc::UnboundedSender<(u64, u16, u16, Vec<u8>)>,
    pending: Pending,
    alive: Arc<AtomicBool>,
}

/// Connections to peers, opened on first use and replaced when broken.
pub struct Peers {
    conns: Mutex<HashMap<String, Arc<Conn>>>,
    /// Sessions with peers known by fabric addresses that run on another
    /// host (those on this one are reached through their local socket).
    fabric: Arc<crate::fabric_ep::Peers>,
    next_id: AtomicU64,
    cred: Credential,
    timeout: Duration,
}

fn fail_all(pending: &Pending, errno: i32, why: &str) {
    for (_, tx) in lock(pending).drain() {
        let _ = tx.send(Err(ErrorReply::new(errno, why.to_string())));
    }
}

impl Peers {
    /// A peer set authenticating as a server with `cred` (the pool
    /// secret), with a per-request `timeout`.
    pub fn new(cred: Credential, timeout: Duration) -> Self {
        Self {
            conns: Default::default(),
            fabric: Default::default(),
            next_id: AtomicU64::new(1),
            cred,
            timeout,
        }
    }

    /// Peers on other hosts known by fabric addresses: chunk data of at
    /// least `rdma_thresh` bytes forwarded to them moves by RMA; with
    /// `all_remote`, every such peer is reached over the fabric, as if on
    /// another host (tests of that path on one machine).
    pub fn fabric(mut self, all_remote: bool, rdma_thresh: usize) -> Self {
        self.fabric = Arc::new(crate::fabric_ep::Peers::new(all_remote, rdma_thresh));
        self
    }

    /// The per-request timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The live connection to `addr`, or a new one. The table is not
    /// locked while connecting, so a peer that does not answer delays only
    /// the requests for it (two callers may then both connect: the first
    /// connection stored is kept, the other dropped).
    async fn conn(&self, addr: &str) -> Result<Arc<Conn>, ErrorReply> {
        if let Some(c) = lock(&self.conns).get(addr) {
            if c.alive.load(Ordering::Acquire) {
                return Ok(c.clone());
            }
        }
        let c = Arc::new(self.connect(addr).await.map_err(|e| {
            let errno = match &e {
                NetError::Refused { errno, .. } => *errno,
                NetError::Timeout => libc::ETIMEDOUT,
                NetError::Io(io) => chfs_proto::error::io_errno(io),
                _ => libc::EIO,
            };
            ErrorReply::new(errno, format!("cannot connect to server {addr}: {e}"))
        })?);
        let mut conns = lock(&self.conns);
        if let Some(old) = conns.get(addr) {
            if old.alive.load(Ordering::Acquire) {
                return Ok(old.clone());
            }
        }
        conns.insert(addr.to_string(), c.clone());
        Ok(c)
    }

    /// Connects to a peer: through its Unix socket when it runs on this
    /// host (see [`chfs_proto::local_socket_name`]), else TCP.
    async fn connect(&self, addr: &str) -> Result<Conn, NetError> {
        if let Some(mut s) = local_stream(addr) {
            net::timeout(
                self.timeout,
                net::connect_handshake(&mut s, Role::Server, &self.cred),
            )
            .await?;
            let (rd, wr) = crate::local_io::split(s)?;
            return Ok(start_io(rd, wr, addr));
        }
        let mut s =
            net::timeout(self.timeout, async { Ok(TcpStream::connect(addr).await?) }).await?;
        s.set_nodelay(true)?;
        net::timeout(
            self.timeout,
            net::connect_handshake(&mut s, Role::Server, &self.cred),
        )
        .await?;
        let (rd, wr) = s.into_split();
        Ok(start_io(rd, wr, addr))
    }

    /// Sends `req` to the server at `addr` with frame `flags` and waits for
    /// the answer (at most the configured timeout).
    pub async fn call(&self, addr: &str, req: &Request, flags: u16) -> Reply {
        if addr.starts_with("ofi+") && !self.fabric.is_local(addr, &self.conns) {
            return self
                .fabric
                .clone()
                .call(addr, &self.cred, req, flags, self.timeout)
                .await;
        }
        let mut payload = Vec::new();
        req.encode(&mut payload);
        self.call_stream(addr, req.op(), flags, payload).await
    }

    /// Sends a request already encoded (`op`, `payload`; no bulk data) to
    /// the server at `addr`: one request sent to many peers is encoded
    /// once (a server list of thousands pushed to every member: encoding
    /// it per member cost the leader O(members²) bytes at each join).
    pub async fn call_encoded(&self, addr: &str, op: u16, payload: &Bytes, flags: u16) -> Reply {
        if addr.starts_with("ofi+") && !self.fabric.is_local(addr, &self.conns) {
            return self
                .fabric
                .clone()
                .call_encoded(addr, &self.cred, op, payload.clone(), flags, self.timeout)
                .await;
        }
        self.call_stream(addr, op, flags, payload.to_vec()).await
    }

    /// A call over the peer's stream connection (its Unix socket or TCP).
    async fn call_stream(&self, addr: &str, op: u16, flags: u16, payload: Vec<u8>) -> Reply {
        let conn = self.conn(addr).await?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&conn.pending).insert(id, tx);
        if conn.tx.send((id, op, flags, payload)).is_err() {
            lock(&conn.pending).remove(&id);
            return Err(ErrorReply::new(
                libc::EIO,
                format!("connection to server {addr} lost"),
            ));
        }
        match tokio::time::timeout(self.timeout, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(ErrorReply::new(
                libc::EIO,
                format!("connection to server {addr} lost"),
            )),
            Err(_) => {
                lock(&conn.pending).remove(&id);
                Err(ErrorReply::new(
                    libc::ETIMEDOUT,
                    format!("server {addr} did not answer within {:?}", self.timeout),
                ))
            }
        }
    }
}

/// Decodes a response frame payload.
pub fn decode_reply(flags: u16, payload: Bytes) -> Reply {
    if flags & FLAG_ERROR != 0 {
        Err(decode_error(payload).unwrap_or_else(|e| ErrorReply::new(e.errno(), e.to_string())))
    } else {
        Response::decode(payload).map_err(|e| ErrorReply::new(e.errno(), e.to_string()))
    }
}

/// The abstract Unix socket of a server on this host, if there is one.
fn local_stream(addr: &str) -> Option<UnixStream> {
    use std::os::linux::net::SocketAddrExt;
    let name = chfs_proto::local_socket_name(addr);
    let a = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).ok()?;
    let s = std::os::unix::net::UnixStream::connect_addr(&a).ok()?;
    s.set_nonblocking(true).ok()?;
    UnixStream::from_std(s).ok()
}

/// Starts the writer and reader tasks of a connected, admitted peer.
fn start_io<R, W>(rd: R, wr: W, addr: &str) -> Conn
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut rd = tokio::io::BufReader::with_capacity(256 << 10, rd);
    let (tx, mut rx) = mpsc::unbounded_channel::<(u64, u16, u16, Vec<u8>)>();
    let pending: Pending = Default::default();
    let alive = Arc::new(AtomicBool::new(true));
    let (p2, a2, peer) = (pending.clone(), alive.clone(), addr.to_string());
    tokio::spawn(async move {
        let mut w = BufWriter::with_capacity(256 << 10, wr);
        while let Some((id, op, flags, payload)) = rx.recv().await {
            if net::write_frame(&mut w, id, op, flags, &payload)
                .await
                .is_err()
            {
                break;
            }
            if rx.is_empty() && w.flush().await.is_err() {
                break;
            }
        }
        a2.store(false, Ordering::Release);
        fail_all(&p2, libc::EIO, &format!("connection to server {peer} lost"));
    });
    let (p3, a3, peer) = (pending.clone(), alive.clone(), addr.to_string());
    tokio::spawn(async move {
        let why = loop {
            match net::read_frame(&mut rd).await {
                Ok(Some((h, payload))) => {
                    let reply = decode_reply(h.flags, payload);
                    if let Some(tx) = lock(&p3).remove(&h.id) {
                        let _ = tx.send(reply);
                    }
                }
                Ok(None) => break "closed".to_string(),
                Err(e) => break e.to_string(),
            }
        };
        a3.store(false, Ordering::Release);
        fail_all(
            &p3,
            libc::EIO,
            &format!("connection to server {peer} lost: {why}"),
        );
    });
    Conn { tx, pending, alive }
}
