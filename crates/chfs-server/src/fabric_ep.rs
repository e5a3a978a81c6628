//! This server's libfabric endpoints other than the one it serves on:
//! how one is opened (`chfsd -p`), and the sessions with peers at fabric
//! addresses on other hosts that forwarding and membership pushes use
//! ([`Peers`]). Below the serving side ([`crate::fabric`]) and
//! [`crate::peer`], which uses it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chfs_fabric::{Endpoint, Error as FabricError, Protocol};
use chfs_proto::frame::FLAG_ERROR;
use chfs_proto::handshake;
use chfs_proto::msg::decode_error;
use chfs_proto::{ErrorReply, Request, Response};

/// Largest message either side sends: a chunk of the default size (64 KiB)
/// with its request. Clients and servers must agree (the hello says it).
pub const MAX_MESSAGE: usize = 64 * 1024 + 4096;

/// Opens the endpoint of `protocol` on `host` (an IP address or a name
/// resolved to one) and `port` (None: any free one); its progress thread
/// reads the queue without sleeping for `poll` after each completion
/// (`--poll-usec`, as the socket threads poll for the next request).
pub fn open(
    protocol: Protocol,
    host: &str,
    port: Option<u16>,
    poll: std::time::Duration,
) -> Result<Endpoint, FabricError> {
    use std::net::ToSocketAddrs;
    let ip = (host, 0)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .map(|a| a.ip().to_string());
    let mut cfg = chfs_fabric::Config::new(protocol);
    cfg.max_message = MAX_MESSAGE;
    cfg.recv_buffers = 64;
    cfg.poll_usec = poll.as_micros().min(u64::MAX as u128) as u64;
    if protocol.ip_addresses() {
        if let Some(ip) = &ip {
            let port = port.map(|p| p.to_string());
            cfg = cfg.bind(ip, port.as_deref());
        }
    }
    Endpoint::open(&cfg)
}

/// This server's sessions with peers known by fabric addresses on other
/// hosts (forwarding, membership pushes): one client endpoint per
/// protocol, a session per peer opened with the pool secret as a server,
/// calls made on blocking threads (the endpoint's waits block).
pub struct Peers {
    clients: std::sync::Mutex<HashMap<Protocol, Arc<chfs_fabric::rpc::RpcClient>>>,
    sessions: std::sync::Mutex<HashMap<String, chfs_fabric::rpc::Session>>,
    /// Peers found to have no local socket here.
    remote: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Treat every fabric peer as on another host (tests: the cross-host
    /// path on one machine; chfsd's hidden `--test-peers-remote`).
    all_remote: bool,
    /// Chunk data of at least this many bytes moves by RMA (chfsd's
    /// `--rdma-thresh`, `CHFS_RDMA_THRESH`).
    rdma_thresh: usize,
    /// Destinations of reads by RMA, kept for the next ones.
    read_bufs: Arc<ReadBufs>,
}

impl Default for Peers {
    fn default() -> Self {
        Self::new(false, chfs_fabric::rpc::RDMA_THRESH)
    }
}

/// Destinations of forwarded reads whose data the peer writes by RMA: a
/// read's data is handed on as `Response::Data` in the buffer it landed
/// in (no copy), which comes back here when the last holder of that data
/// drops it, for the next read: no allocation, zeroing and first touch of
/// fresh memory per forwarded read (a chunk of 1 MiB is 256 page faults).
/// At most [`READ_BUFS_KEPT`] buffers and [`READ_BUFS_KEPT_BYTES`] are
/// kept.
#[derive(Default)]
struct ReadBufs {
    free: std::sync::Mutex<Vec<Vec<u8>>>,
}

const READ_BUFS_KEPT: usize = 8;
const READ_BUFS_KEPT_BYTES: usize = 16 << 20;

impl ReadBufs {
    /// A buffer of `len` bytes: the smallest kept one that is large enough,
    /// else a new one.
    fn take(&self, len: usize) -> Vec<u8> {
        let mut free = chfs_sys::lock(&self.free);
        let best = free
            .iter()
            .enumerate()
            .filter(|(_, b)| b.len() >= len)
            .min_by_key(|(_, b)| b.len())
            .map(|(i, _)| i);
        match best {
            Some(i) => free.swap_remove(i),
            None => {
                drop(free);
                vec![0u8; len]
            }
        }
    }

    fn give_back(&self, buf: Vec<u8>) {
        let mut free = chfs_sys::lock(&self.free);
        let held: usize = free.iter().map(Vec::len).sum();
        if free.len() < READ_BUFS_KEPT && held + buf.len() <= READ_BUFS_KEPT_BYTES {
            free.push(buf);
        }
    }
}

/// A read's data in a buffer of [`ReadBufs`], which it goes back to when
/// dropped (the owner of a `Bytes`).
struct Landed {
    buf: Vec<u8>,
    len: usize,
    home: Arc<ReadBufs>,
}

impl AsRef<[u8]> for Landed {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for Landed {
    fn drop(&mut self) {
        self.home.give_back(std::mem::take(&mut self.buf));
    }
}

/// The bulk part of a peer request that moves by RMA (as a client's
/// does): a write's (or a moved chunk's: `AdoptChunk`, `PutChunk`) data the peer reads from memory
/// lent for the call, or a read's destination the peer writes.
enum Bulk {
    None,
    Out(bytes::Bytes),
    In(usize),
}

/// Margin for a request's or reply's own bytes in a message beside its
/// data (as the client's).
const INLINE_MARGIN: usize = 512;

/// Takes the bulk data out of `req` when it moves by RMA: at least
/// `rdma_thresh` bytes, or more than fits a message with the request (or
/// reply).
fn bulk_of(req: &Request, rdma_thresh: usize) -> (Bulk, Option<Request>) {
    let big = |n: usize| n >= rdma_thresh || n + INLINE_MARGIN > MAX_MESSAGE;
    match req {
        Request::Write { data, .. }
        | Request::WriteSpans { data, .. }
        | Request::AdoptChunk { data, .. }
        | Request::PutChunk { data, .. }
            if big(data.len()) =>
        {
            let mut r = req.clone();
            let out = match &mut r {
                Request::Write { data, .. }
                | Request::WriteSpans { data, .. }
                | Request::AdoptChunk { data, .. }
                | Request::PutChunk { data, .. } => std::mem::take(data),
                _ => unreachable!("matched above"),
            };
            (Bulk::Out(out), Some(r))
        }
        Request::Read { len, .. } if big(*len as usize) => (Bulk::In(*len as usize), None),
        _ => (Bulk::None, None),
    }
}

impl Peers {
    /// Peers (every one taken to be on another host when `all_remote`) to
    /// which chunk data of at least `rdma_thresh` bytes moves by RMA.
    pub fn new(all_remote: bool, rdma_thresh: usize) -> Self {
        Self {
            clients: Default::default(),
            sessions: Default::default(),
            remote: Default::default(),
            all_remote,
            rdma_thresh: rdma_thresh.max(1),
            read_bufs: Default::default(),
        }
    }

    /// Is the peer at `addr` reached through its local socket (it runs on
    /// this host: a connection is open, or its socket answers)?
    pub fn is_local<C>(&self, addr: &str, conns: &std::sync::Mutex<HashMap<String, C>>) -> bool {
        if self.all_remote {
            return false;
        }
        if chfs_sys::lock(conns).contains_key(addr) {
            return true;
        }
        if chfs_sys::lock(&self.remote).contains(addr) {
            return false;
        }
        use std::os::linux::net::SocketAddrExt;
        let name = chfs_proto::local_socket_name(addr);
        let here = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
            .and_then(|a| std::os::unix::net::UnixStream::connect_addr(&a))
            .is_ok();
        if !here {
            chfs_sys::lock(&self.remote).insert(addr.to_string());
        }
        here
    }

    /// Sends `req` to the peer at `addr` over the fabric and waits for its
    /// answer (at most `timeout`).
    pub async fn call(
        self: Arc<Self>,
        addr: &str,
        cred: &handshake::Credential,
        req: &Request,
        flags: u16,
        timeout: Duration,
    ) -> Result<Response, ErrorReply> {
        let (bulk, stripped) = bulk_of(req, self.rdma_thresh);
        let mut payload = Vec::new();
        stripped.as_ref().unwrap_or(req).encode(&mut payload);
        let (op, addr, cred) = (req.op(), addr.to_string(), cred.clone());
        tokio::task::spawn_blocking(move || {
            self.call_blocking(&addr, &cred, op, flags, &payload, &bulk, timeout)
        })
        .await
        .unwrap_or_else(|e| {
            Err(ErrorReply::new(
                libc::EIO,
                format!("fabric call failed: {e}"),
            ))
        })
    }

    /// Sends a request already encoded (no bulk data) to the peer at
    /// `addr` over the fabric ([`crate::peer::Peers::call_encoded`]).
    pub async fn call_encoded(
        self: Arc<Self>,
        addr: &str,
        cred: &handshake::Credential,
        op: u16,
        payload: bytes::Bytes,
        flags: u16,
        timeout: Duration,
    ) -> Result<Response, ErrorReply> {
        let (addr, cred) = (addr.to_string(), cred.clone());
        tokio::task::spawn_blocking(move || {
            self.call_blocking(&addr, &cred, op, flags, &payload, &Bulk::None, timeout)
        })
        .await
        .unwrap_or_else(|e| {
            Err(ErrorReply::new(
                libc::EIO,
                format!("fabric call failed: {e}"),
            ))
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn call_blocking(
        &self,
        addr: &str,
        cred: &handshake::Credential,
        op: u16,
        flags: u16,
        payload: &[u8],
        bulk: &Bulk,
        timeout: Duration,
    ) -> Result<Response, ErrorReply> {
        use chfs_fabric::rpc::RpcError;
        let err = |e: RpcError| match e {
            RpcError::Remote(r) => {
                ErrorReply::new(r.errno, format!("server {addr}: {}", r.message))
            }
            e => ErrorReply::new(e.errno(), format!("server {addr}: {e}")),
        };
        let a: chfs_fabric::Address = addr
            .parse()
            .map_err(|e| ErrorReply::new(libc::EINVAL, format!("server {addr}: {e}")))?;
        let rpc = self
            .client(&a)
            .map_err(|e| ErrorReply::new(e.errno(), format!("no {} endpoint: {e}", a.protocol)))?;
        for _ in 0..2 {
            match self.call_once(&rpc, &a, addr, cred, op, flags, payload, bulk, timeout) {
                // The peer restarted or expired the session: it did not
                // serve the request; once more in a new session.
                Err(None) => continue,
                Err(Some(e)) => return Err(err(e)),
                Ok(r) => return r,
            }
        }
        Err(ErrorReply::new(
            libc::ENOTCONN,
            format!("server {addr}: no session"),
        ))
    }

    /// One attempt: Err(None) when the peer did not know the session (it
    /// is forgotten here too).
    #[allow(clippy::too_many_arguments)]
    fn call_once(
        &self,
        rpc: &chfs_fabric::rpc::RpcClient,
        a: &chfs_fabric::Address,
        addr: &str,
        cred: &handshake::Credential,
        op: u16,
        flags: u16,
        payload: &[u8],
        bulk: &Bulk,
        timeout: Duration,
    ) -> Result<Result<Response, ErrorReply>, Option<chfs_fabric::rpc::RpcError>> {
        use chfs_fabric::rpc::RpcError;
        let known = chfs_sys::lock(&self.sessions).get(addr).copied();
        let s = match known {
            Some(s) => s,
            None => {
                let s = rpc
                    .handshake(a, handshake::Role::Server, cred, timeout)
                    .map_err(Some)?;
                chfs_sys::lock(&self.sessions).insert(addr.to_string(), s);
                s
            }
        };
        let exchange = |flags: u16, payload: &[u8]| {
            rpc.post(&s, op, flags, payload, timeout)
                .and_then(|id| rpc.wait(&s, id, timeout))
        };
        let with_key = |key: chfs_fabric::RemoteKey| {
            let mut p = payload.to_vec();
            p.extend_from_slice(&key.encode());
            exchange(flags | chfs_fabric::rpc::FLAG_RMA, &p)
        };
        let ep = rpc.endpoint();
        // Over ofi+shm a closed registration does not revoke the peer's
        // access: memory lent to a call that did not end well is never
        // freed (a late RMA reaches only it).
        let keep = ep.address().protocol == chfs_fabric::Protocol::Shm;
        let mut landed = None;
        let r = match bulk {
            Bulk::None => exchange(flags, payload),
            Bulk::Out(data) => {
                let r = ep
                    .expose(data, with_key)
                    .map_err(RpcError::Fabric)
                    .and_then(|r| r);
                if keep && r.is_err() {
                    std::mem::forget(data.clone());
                }
                r
            }
            Bulk::In(len) => {
                let mut dst = self.read_bufs.take(*len);
                let r = ep
                    .expose_mut(&mut dst[..*len], with_key)
                    .map_err(RpcError::Fabric)
                    .and_then(|r| r);
                if keep && r.is_err() {
                    std::mem::forget(dst);
                } else if r.is_ok() {
                    landed = Some(dst);
                }
                // (after another failure the buffer is dropped: over tcp
                // the key was revoked when the exposure ended)
                r
            }
        };
        match r {
            Ok((h, _)) if h.op == chfs_fabric::rpc::OP_NO_SESSION => {
                chfs_sys::lock(&self.sessions).remove(addr);
                let _ = rpc.endpoint().disconnect(s.peer);
                Err(None)
            }
            Ok((h, payload)) => Ok(if h.flags & FLAG_ERROR != 0 {
                let e = decode_error(payload)
                    .unwrap_or_else(|e| ErrorReply::new(e.errno(), e.to_string()));
                // ETIMEDOUT: the peer may have given up on an RMA of this
                // call still queued with its provider (its own 30 s RMA
                // timeout, shorter than this server's RPC timeout): over
                // shm that RMA can still reach the memory, which is then
                // never freed. (Other errors come before the RMA, or after
                // the provider ended it.)
                if keep && e.errno == libc::ETIMEDOUT {
                    match bulk {
                        Bulk::Out(data) => std::mem::forget(data.clone()),
                        Bulk::In(_) => std::mem::forget(landed),
                        Bulk::None => {}
                    }
                }
                Err(e)
            } else {
                match (
                    Response::decode(payload)
                        .map_err(|e| ErrorReply::new(e.errno(), e.to_string())),
                    landed,
                ) {
                    // A read whose data the peer wrote into `dst`.
                    (Ok(Response::Written(n)), Some(dst)) => {
                        let asked = match bulk {
                            Bulk::In(len) => *len,
                            _ => 0,
                        };
                        if n as usize > asked {
                            Err(ErrorReply::new(
                                libc::EPROTO,
                                format!("server {addr}: more data than asked for"),
                            ))
                        } else {
                            Ok(Response::Data(bytes::Bytes::from_owner(Landed {
                                buf: dst,
                                len: n as usize,
                                home: self.read_bufs.clone(),
                            })))
                        }
                    }
                    (Ok(Response::Data(_)), Some(_)) => Err(ErrorReply::new(
                        libc::EPROTO,
                        format!("server {addr}: data inline for a read by RMA"),
                    )),
                    (r, _) => r,
                }
            }),
            Err(e) => {
                if !matches!(
                    &e,
                    chfs_fabric::rpc::RpcError::Fabric(FabricError::Timeout { .. })
                ) {
                    // A broken pair: a new session (and rxm connection)
                    // next time.
                    chfs_sys::lock(&self.sessions).remove(addr);
                    let _ = rpc.endpoint().disconnect(s.peer);
                }
                Err(Some(e))
            }
        }
    }

    fn client(
        &self,
        a: &chfs_fabric::Address,
    ) -> Result<Arc<chfs_fabric::rpc::RpcClient>, FabricError> {
        let mut g = chfs_sys::lock(&self.clients);
        if let Some(c) = g.get(&a.protocol) {
            return Ok(c.clone());
        }
        let host = a.socket_addr().map(|sa| route_to(&sa));
        // (Calls on blocking threads: they sleep at once.)
        let host = host.flatten();
        let ep = open(
            a.protocol,
            host.as_deref().unwrap_or(""),
            None,
            std::time::Duration::ZERO,
        )?;
        let c = Arc::new(chfs_fabric::rpc::RpcClient::new(Arc::new(ep)));
        g.insert(a.protocol, c.clone());
        Ok(c)
    }
}

/// The local IP address that routes to `to`.
fn route_to(to: &std::net::SocketAddr) -> Option<String> {
    let any = if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
    let s = std::net::UdpSocket::bind(any).ok()?;
    s.connect(to).ok()?;
    Some(s.local_addr().ok()?.ip().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// chfsd's endpoint polls for `--poll-usec` after each completion
    /// (its progress thread, as its socket threads poll for requests).
    #[test]
    fn the_endpoint_polls_for_the_servers_window() {
        let test = "the_endpoint_polls_for_the_servers_window";
        if !chfs_fabric::BUILT_WITH_LIBFABRIC {
            chfs_localpool::skip("fabric", test, "built without libfabric");
            return;
        }
        for usec in [0, 100, 250] {
            let ep = open(
                Protocol::Tcp,
                "127.0.0.1",
                None,
                Duration::from_micros(usec),
            )
            .unwrap();
            assert_eq!(ep.poll_window(), Duration::from_micros(usec));
        }
    }

    /// A forwarded read's data, handed on without a copy, gives its buffer
    /// back when dropped, and the next read lands in it (no new memory).
    #[test]
    fn read_buffers_are_reused() {
        let bufs = Arc::new(ReadBufs::default());
        let mut b = bufs.take(100 << 10);
        b[..5].copy_from_slice(b"hello");
        let at = b.as_ptr();
        let data = bytes::Bytes::from_owner(Landed {
            buf: b,
            len: 5,
            home: bufs.clone(),
        });
        assert_eq!(&data[..], b"hello");
        let held = data.clone();
        drop(data);
        // Still held by a clone: not given back yet.
        let other = bufs.take(64 << 10);
        assert_ne!(other.as_ptr(), at);
        drop(other);
        drop(held);
        // (the length too: a fresh allocation may get the same address)
        let again = bufs.take(64 << 10);
        assert_eq!((again.as_ptr(), again.len()), (at, 100 << 10));
        // More than is kept goes back to the allocator.
        for _ in 0..READ_BUFS_KEPT + 1 {
            bufs.give_back(vec![0u8; READ_BUFS_KEPT_BYTES / READ_BUFS_KEPT]);
        }
        assert_eq!(chfs_sys::lock(&bufs.free).len(), READ_BUFS_KEPT);
        bufs.give_back(vec![0u8; 1]);
        assert_eq!(chfs_sys::lock(&bufs.free).len(), READ_BUFS_KEPT);
    }
}
