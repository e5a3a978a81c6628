//! One blocking connection to a server, shared by many threads.
//!
//! Callers write their request frame under a short lock and get a
//! [`Ticket`]; a reader thread per connection matches responses to tickets by
//! request id, so many requests are in flight at once and complete in any
//! order. Sending k requests and then waiting for k tickets is how one call
//! reaches k servers concurrently.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use chfs_proto::frame::{Header, FLAG_ERROR, HEADER_LEN};
use chfs_proto::handshake::{Hello, HelloReply};
use chfs_proto::msg::decode_error;
use chfs_proto::{Request, Response};

use crate::error::{Error, Result};

type Reply = Result<Response>;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct Shared {
    addr: String,
    pending: Mutex<HashMap<u64, SyncSender<Reply>>>,
    alive: AtomicBool,
}

impl Shared {
    fn fail_all(&self, why: &str) {
        self.alive.store(false, Ordering::Release);
        for (_, tx) in lock(&self.pending).drain() {
            let _ = tx.try_send(Err(Error::new(libc::EIO, why.to_string())));
        }
    }
}

/// A connection.
pub(crate) struct Conn {
    shared: Arc<Shared>,
    writer: Mutex<TcpStream>,
    next_id: AtomicU64,
    timeout: Duration,
}

/// A request in flight.
pub(crate) struct Ticket {
    id: u64,
    rx: Receiver<Reply>,
}

fn io_err(addr: &str, what: &str, e: std::io::Error) -> Error {
    let errno = match e.kind() {
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => libc::ETIMEDOUT,
        _ => e.raw_os_error().unwrap_or(libc::EIO),
    };
    Error::new(errno, format!("server {addr}: {what}: {e}")).with_source(e)
}

impl Conn {
    /// Connects and performs the handshake.
    pub fn connect(addr: &str, secret: &[u8], timeout: Duration) -> Result<Conn> {
        let addrs: Vec<_> = addr
            .to_socket_addrs()
            .map_err(|e| io_err(addr, "cannot resolve address", e))?
            .collect();
        let mut last = None;
        let mut stream = None;
        for a in addrs {
            match TcpStream::connect_timeout(&a, timeout.min(Duration::from_secs(10))) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let mut s = match stream {
            Some(s) => s,
            None => {
                let e = last.unwrap_or_else(|| std::io::Error::other("no address"));
                return Err(io_err(addr, "cannot connect", e));
            }
        };
        let _ = s.set_nodelay(true);
        s.set_read_timeout(Some(timeout))
            .map_err(|e| io_err(addr, "socket", e))?;
        s.write_all(&Hello::new(secret).encode())
            .map_err(|e| io_err(addr, "handshake", e))?;
        let mut fixed = [0u8; HelloReply::FIXED_LEN];
        s.read_exact(&mut fixed)
            .map_err(|e| io_err(addr, "handshake", e))?;
        let (_, status, n) = HelloReply::decode_fixed(&fixed)
            .map_err(|e| Error::new(libc::EPROTO, format!("server {addr}: handshake: {e}")))?;
        let mut msg = vec![0u8; n];
        s.read_exact(&mut msg)
            .map_err(|e| io_err(addr, "handshake", e))?;
        if status != 0 {
            return Err(Error::new(
                status,
                format!(
                    "server {addr} refused the connection: {}",
                    String::from_utf8_lossy(&msg)
                ),
            ));
        }
        s.set_read_timeout(None)
            .map_err(|e| io_err(addr, "socket", e))?;
        let reader = s.try_clone().map_err(|e| io_err(addr, "socket", e))?;
        let shared = Arc::new(Shared {
            addr: addr.to_string(),
            pending: Mutex::new(HashMap::new()),
            alive: AtomicBool::new(true),
        });
        let sh = shared.clone();
        std::thread::Builder::new()
            .name(format!("chfs-rx-{addr}"))
            .spawn(move || read_loop(reader, sh))
            .map_err(|e| io_err(addr, "cannot start reader thread", e))?;
        Ok(Conn {
            shared,
            writer: Mutex::new(s),
            next_id: AtomicU64::new(1),
            timeout,
        })
    }

    /// Is the connection still usable?
    pub fn alive(&self) -> bool {
        self.shared.alive.load(Ordering::Acquire)
    }

    /// Sends a request whose payload is `head` followed by `tail`.
    pub fn send_raw(&self, op: u16, head: &[u8], tail: &[u8]) -> Result<Ticket> {
        let addr = &self.shared.addr;
        if !self.alive() {
            return Err(Error::new(
                libc::EIO,
                format!("connection to server {addr} is broken"),
            ));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = sync_channel(1);
        lock(&self.shared.pending).insert(id, tx);
        let h = Header {
            len: (head.len() + tail.len()) as u32,
            id,
            op,
            flags: 0,
        };
        let r = {
            let mut w = lock(&self.writer);
            if tail.len() < 16 * 1024 {
                let mut buf = Vec::with_capacity(HEADER_LEN + head.len() + tail.len());
                buf.extend_from_slice(&h.encode());
                buf.extend_from_slice(head);
                buf.extend_from_slice(tail);
                w.write_all(&buf)
            } else {
                let mut buf = Vec::with_capacity(HEADER_LEN + head.len());
                buf.extend_from_slice(&h.encode());
                buf.extend_from_slice(head);
                w.write_all(&buf).and_then(|_| w.write_all(tail))
            }
        };
        if let Err(e) = r {
            lock(&self.shared.pending).remove(&id);
            self.shared
                .fail_all(&format!("connection to server {addr} lost: {e}"));
            let _ = lock(&self.writer).shutdown(std::net::Shutdown::Both);
            return Err(io_err(addr, "send failed", e));
        }
        Ok(Ticket { id, rx })
    }

    /// Sends a request.
    pub fn send(&self, req: &Request) -> Result<Ticket> {
        let mut head = Vec::with_capacity(64);
        req.encode(&mut head);
        self.send_raw(req.op(), &head, &[])
    }

    /// Waits for the answer to a ticket, at most the request timeout.
    pub fn wait(&self, t: Ticket) -> Reply {
        match t.rx.recv_timeout(self.timeout) {
            Ok(r) => r,
            Err(RecvTimeoutError::Timeout) => {
                lock(&self.shared.pending).remove(&t.id);
                Err(Error::new(
                    libc::ETIMEDOUT,
                    format!(
                        "server {} did not answer within {} ms",
                        self.shared.addr,
                        self.timeout.as_millis()
                    ),
                ))
            }
            Err(RecvTimeoutError::Disconnected) => Err(Error::new(
                libc::EIO,
                format!("connection to server {} lost", self.shared.addr),
            )),
        }
    }

    /// Sends a request and waits for its answer.
    pub fn call(&self, req: &Request) -> Reply {
        let t = self.send(req)?;
        self.wait(t)
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // Wakes the reader thread, which then exits.
        let _ = lock(&self.writer).shutdown(std::net::Shutdown::Both);
    }
}

fn read_frame(s: &mut impl Read) -> std::io::Result<(Header, Bytes)> {
    let mut hb = [0u8; HEADER_LEN];
    s.read_exact(&mut hb)?;
    let h = Header::decode(&hb).map_err(std::io::Error::other)?;
    // Read into spare capacity: no zeroing of a buffer about to be
    // overwritten (chunk replies are up to the chunk size).
    let len = h.len as usize;
    let mut buf = Vec::with_capacity(len);
    s.take(len as u64).read_to_end(&mut buf)?;
    if buf.len() != len {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok((h, Bytes::from(buf)))
}

fn read_loop(s: TcpStream, sh: Arc<Shared>) {
    // Buffered: several small replies arriving together cost one read(2).
    let mut s = std::io::BufReader::with_capacity(256 << 10, s);
    let why = loop {
        match read_frame(&mut s) {
            Ok((h, payload)) => {
                let reply = if h.flags & FLAG_ERROR != 0 {
                    match decode_error(payload) {
                        Ok(e) => Err(Error::from(e)),
                        Err(e) => Err(Error::new(
                            libc::EPROTO,
                            format!("server {}: bad error reply: {e}", sh.addr),
                        )),
                    }
                } else {
                    Response::decode(payload).map_err(|e| {
                        Error::new(libc::EPROTO, format!("server {}: bad reply: {e}", sh.addr))
                    })
                };
                if let Some(tx) = lock(&sh.pending).remove(&h.id) {
                    let _ = tx.try_send(reply);
                }
            }
            Err(e) => break format!("connection to server {} lost: {e}", sh.addr),
        }
    };
    sh.fail_all(&why);
}
