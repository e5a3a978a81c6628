//! chfs-proto frames over a fabric endpoint: the sessions, handshake and
//! RMA keys of the transport doc/fabric.md describes.
//!
//! One message is one frame behind an 8-byte session token:
//!
//! ```text
//! | token u64 | len u32 | id u64 | op u16 | flags u16 | payload (len) |
//! ```
//!
//! (all little-endian; the frame is chfs-proto's, unchanged). Reliable
//! datagram messages name no sender the receiver can trust (rxm reports
//! none), so a server knows its sessions by token: a client's `HELLO`
//! (token 0) carries the client's address, and the `WELCOME` answer the
//! token the server drew for it. Replies are routed to their callers by
//! frame id: one thread at a time reads the endpoint and files the
//! replies of the others (the client's leader/follower pattern).
//!
//! Bulk data of at least `CHFS_RDMA_THRESH` bytes (32 KiB, CHFS's
//! default) moves by RMA that the server initiates, as Mercury's bulk
//! transfers do: the client exposes its memory for the call
//! ([`Endpoint::expose`]) and the request carries [`FLAG_RMA`] and the
//! [`RemoteKey`] at the end of its payload; for a `Write` the server reads
//! the data from the client, for a `Read` it writes the data into the
//! client's buffer and answers `Written(n)`.
//!
//! The real client and chfsd (`chfs-client`'s `fabric_link`, chfsd's
//! `fabric`) open sessions with the challenge-response handshake of
//! `chfs_proto::handshake` over messages ([`RpcClient::handshake`]:
//! [`OP_AUTH_HELLO`], [`OP_AUTH_REPLY`], [`OP_PROOF`], [`OP_VERDICT`])
//! and pipeline requests with [`RpcClient::post`] / [`RpcClient::wait`];
//! the unauthenticated `HELLO`/`WELCOME` and [`RpcServer`] stay as the
//! prototype `fabric_bw` measures.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use chfs_proto::frame::{Header, FLAG_ERROR, HEADER_LEN, MAX_PAYLOAD};
use chfs_proto::msg::{decode_error, encode_error, op};
use chfs_proto::{ErrorReply, ProtoError, Request, Response};

use crate::addr::Address;
use crate::endpoint::{Endpoint, Peer};
use crate::error::Error;
use crate::ffi::{Buffer, Local, RemoteKey, Window};

/// Length of the session token in front of each frame.
pub const TOKEN_LEN: usize = 8;
/// Control op of a client's first message (token 0): its address.
pub const OP_HELLO: u16 = 0xff00;
/// Control op of the server's answer: the session's token.
pub const OP_WELCOME: u16 = 0xff01;
/// Control op of an authenticated session's first message (token 0):
/// [`encode_hello`]: the client's address, its largest message and the
/// hello of `chfs_proto::handshake`. chfsd speaks only this one.
pub const OP_AUTH_HELLO: u16 = 0xff02;
/// The server's answer to [`OP_AUTH_HELLO`]: [`encode_welcome`], the
/// session's token (0: refused) and the handshake's `HelloReply`.
pub const OP_AUTH_REPLY: u16 = 0xff03;
/// The client's proof (32 bytes) in the session the token names.
pub const OP_PROOF: u16 = 0xff04;
/// The server's `Verdict` on the proof.
pub const OP_VERDICT: u16 = 0xff05;
/// The client ends the session the token names (no answer).
pub const OP_BYE: u16 = 0xff06;
/// The server's answer to a message whose token names no session it
/// knows (it restarted, or the session expired idle): sent to the
/// message's reply-to address ([`encode_message_from`]), with the
/// request's frame id, `FLAG_ERROR` and an error reply (ENOTCONN). The
/// request was not served: the client opens a new session and sends it
/// again.
pub const OP_NO_SESSION: u16 = 0xff07;

/// How long [`RpcClient::wait_probing`] waits for an answer before it
/// probes the session with a `Ping`.
pub const PROBE_AFTER: Duration = Duration::from_millis(250);
/// Request flag (fabric only; to join chfs-proto's `FLAG_*` when the
/// transport is integrated): the bulk data is not in the frame; the
/// payload ends with a [`RemoteKey`] naming the client's memory.
pub const FLAG_RMA: u16 = 8;
/// Frame flag (fabric only), on a request or a reply: the frame's payload
/// is larger than a message holds ([`fits_message`]), so the message
/// carries only a [`RemoteKey`] naming it in the sender's memory (its
/// `len` the payload's length, at most chfs-proto's `MAX_PAYLOAD`), and
/// the receiver pulls it by RMA before it decodes the frame as usual.
/// One rule for every request and reply whose encoding grows with the
/// pool (server lists: `GetServers`, `Join`, `UpdateServers`) or with its
/// arguments. A lent request's memory is the client's until its answer
/// comes (the server pulls before serving); a lent reply's is the
/// server's until the client says [`OP_RELEASE`] (or a deadline passes).
pub const FLAG_LENT: u16 = 16;
/// The client has pulled the lent reply ([`FLAG_LENT`]) of the frame id
/// it names, in the session the token names: the server frees it. No
/// answer.
pub const OP_RELEASE: u16 = 0xff08;

/// Does a frame of `payload` bytes fit one message of `max_message`
/// bytes, with `trailer` bytes after it (the sender's address of
/// [`encode_message_from`])? A frame that does not is lent
/// ([`FLAG_LENT`]).
pub fn fits_message(max_message: usize, payload: usize, trailer: usize) -> bool {
    TOKEN_LEN + HEADER_LEN + payload + trailer <= max_message
}

/// The key of a lent frame's payload ([`FLAG_LENT`]): the message's whole
/// payload, its length at most chfs-proto's largest payload.
pub fn lent_key(payload: &[u8]) -> Result<RemoteKey, ProtoError> {
    let bad = |why: String| ProtoError::Malformed(format!("lent frame: {why}"));
    if payload.len() != RemoteKey::LEN {
        return Err(bad(format!(
            "{} bytes, not a remote key of {}",
            payload.len(),
            RemoteKey::LEN
        )));
    }
    let key = RemoteKey::decode(payload).map_err(|e| bad(e.to_string()))?;
    if key.len == 0 || key.len > MAX_PAYLOAD as u64 {
        return Err(ProtoError::FrameTooLarge {
            len: key.len,
            max: MAX_PAYLOAD as u64,
        });
    }
    Ok(key)
}
/// `CHFS_RDMA_THRESH`'s default, as CHFS: transfers of at least this many
/// bytes use RMA.
pub const RDMA_THRESH: usize = 32 * 1024;

/// What an RPC over the fabric can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RpcError {
    /// The transport failed (timeout, dead peer, bad address).
    #[error(transparent)]
    Fabric(#[from] Error),
    /// A message that is not a well-formed frame.
    #[error("malformed message: {0}")]
    Proto(#[from] ProtoError),
    /// The server answered with an error.
    #[error("server: {}", .0.message)]
    Remote(ErrorReply),
}

impl RpcError {
    /// The errno a caller sees.
    pub fn errno(&self) -> i32 {
        match self {
            RpcError::Fabric(e) => e.errno(),
            RpcError::Proto(_) => libc::EPROTO,
            RpcError::Remote(r) => r.errno,
        }
    }
}

/// One message: token, frame header, payload.
pub fn encode_message(token: u64, id: u64, op: u16, flags: u16, payload: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(TOKEN_LEN + HEADER_LEN + payload.len());
    m.extend_from_slice(&token.to_le_bytes());
    let header = Header {
        len: u32::try_from(payload.len()).unwrap_or(u32::MAX),
        id,
        op,
        flags,
    };
    m.extend_from_slice(&header.encode());
    m.extend_from_slice(payload);
    m
}

/// A message in a session with the sender's address after the frame, so
/// that a server that does not know the session (restarted, expired) can
/// still answer [`OP_NO_SESSION`]:
///
/// ```text
/// | token u64 | frame (header, payload) | from_len u16 | from (utf-8, `ofi+tcp://IP:PORT`) |
/// ```
pub fn encode_message_from(
    token: u64,
    id: u64,
    op: u16,
    flags: u16,
    payload: &[u8],
    from: &[u8],
) -> Vec<u8> {
    let mut m = Vec::with_capacity(TOKEN_LEN + HEADER_LEN + payload.len() + 2 + from.len());
    m.extend_from_slice(&token.to_le_bytes());
    let header = Header {
        len: u32::try_from(payload.len()).unwrap_or(u32::MAX),
        id,
        op,
        flags,
    };
    m.extend_from_slice(&header.encode());
    m.extend_from_slice(payload);
    m.extend_from_slice(&(from.len() as u16).to_le_bytes());
    m.extend_from_slice(from);
    m
}

/// Splits a message into token, header, payload and the sender's address
/// if it gave one ([`encode_message_from`]).
pub fn decode_message_from(m: &[u8]) -> Result<(u64, Header, Bytes, Option<Address>), ProtoError> {
    if m.len() < TOKEN_LEN + HEADER_LEN {
        return Err(ProtoError::Truncated {
            needed: TOKEN_LEN + HEADER_LEN - m.len(),
        });
    }
    let head: &[u8; HEADER_LEN] = m[TOKEN_LEN..TOKEN_LEN + HEADER_LEN]
        .try_into()
        .expect("header bytes");
    let header = Header::decode(head)?;
    let end = (TOKEN_LEN + HEADER_LEN).saturating_add(header.len as usize);
    if m.len() <= end {
        let (t, h, p) = decode_message(m)?;
        return Ok((t, h, p, None));
    }
    let rest = &m[end..];
    let bad = |why: &str| ProtoError::Malformed(format!("fabric message: {why}"));
    if rest.len() < 2 {
        return Err(bad("truncated sender address"));
    }
    let n = u16::from_le_bytes([rest[0], rest[1]]) as usize;
    if rest.len() != 2 + n {
        return Err(bad("sender address of the wrong length"));
    }
    let from = std::str::from_utf8(&rest[2..])
        .map_err(|_| bad("sender address not utf-8"))?
        .parse::<Address>()
        .map_err(|e| bad(&e.to_string()))?;
    let (t, h, p) = decode_message(&m[..end])?;
    Ok((t, h, p, Some(from)))
}

/// Splits a message into token, header and payload, checking the
/// frame's length against the message's.
pub fn decode_message(m: &[u8]) -> Result<(u64, Header, Bytes), ProtoError> {
    if m.len() < TOKEN_LEN + HEADER_LEN {
        return Err(ProtoError::Truncated {
            needed: TOKEN_LEN + HEADER_LEN - m.len(),
        });
    }
    let token = u64::from_le_bytes(m[..TOKEN_LEN].try_into().expect("8 bytes"));
    let head: &[u8; HEADER_LEN] = m[TOKEN_LEN..TOKEN_LEN + HEADER_LEN]
        .try_into()
        .expect("header bytes");
    let header = Header::decode(head)?;
    let payload = &m[TOKEN_LEN + HEADER_LEN..];
    if payload.len() != header.len as usize {
        return Err(if payload.len() < header.len as usize {
            ProtoError::Truncated {
                needed: header.len as usize - payload.len(),
            }
        } else {
            ProtoError::FrameTooLarge {
                len: payload.len() as u64,
                max: header.len as u64,
            }
        });
    }
    Ok((token, header, Bytes::copy_from_slice(payload)))
}

/// The payload of an [`OP_AUTH_HELLO`]:
///
/// ```text
/// | addr_len u16 | addr (utf-8, `ofi+tcp://IP:PORT`) | max_message u32 | handshake hello |
/// ```
pub fn encode_hello(addr: &str, max_message: u32, hello: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(6 + addr.len() + hello.len());
    m.extend_from_slice(&(addr.len() as u16).to_le_bytes());
    m.extend_from_slice(addr.as_bytes());
    m.extend_from_slice(&max_message.to_le_bytes());
    m.extend_from_slice(hello);
    m
}

/// Splits an [`OP_AUTH_HELLO`]'s payload: the client's address, its
/// largest message and the handshake's hello.
pub fn decode_hello(p: &[u8]) -> Result<(Address, u32, &[u8]), ProtoError> {
    let bad = |why: &str| ProtoError::Malformed(format!("fabric hello: {why}"));
    if p.len() < 2 {
        return Err(bad("too short"));
    }
    let n = u16::from_le_bytes([p[0], p[1]]) as usize;
    if p.len() < 2 + n + 4 {
        return Err(bad("too short"));
    }
    let addr = std::str::from_utf8(&p[2..2 + n])
        .map_err(|_| bad("address not utf-8"))?
        .parse::<Address>()
        .map_err(|e| bad(&e.to_string()))?;
    let max = u32::from_le_bytes(p[2 + n..2 + n + 4].try_into().expect("4 bytes"));
    Ok((addr, max, &p[2 + n + 4..]))
}

/// The payload of an [`OP_AUTH_REPLY`]: `| token u64 | HelloReply |`.
pub fn encode_welcome(token: u64, reply: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(TOKEN_LEN + reply.len());
    m.extend_from_slice(&token.to_le_bytes());
    m.extend_from_slice(reply);
    m
}

/// Reads a `HelloReply` laid out as on a stream: its version, status,
/// message and what the server offers (open, or a challenge).
fn decode_hello_reply(
    b: &[u8],
) -> Result<(u16, i32, String, chfs_proto::handshake::Auth), ProtoError> {
    use chfs_proto::handshake::{Auth, HelloReply};
    let short = || ProtoError::Malformed("fabric hello reply: too short".into());
    let fixed = b.get(..HelloReply::FIXED_LEN).ok_or_else(short)?;
    let (version, status, n) = HelloReply::decode_fixed(fixed.try_into().expect("fixed"))?;
    let rest = &b[HelloReply::FIXED_LEN..];
    let msg = String::from_utf8_lossy(rest.get(..n).ok_or_else(short)?).into_owned();
    let rest = &rest[n..];
    let mut auth = Auth::Open;
    if status == 0 && HelloReply::decode_auth(*rest.first().ok_or_else(short)?)? {
        let ch = rest
            .get(1..1 + HelloReply::CHALLENGE_LEN)
            .ok_or_else(short)?;
        auth = HelloReply::decode_challenge(ch.try_into().expect("challenge"));
    }
    Ok((version, status, msg, auth))
}

/// Fails at once with ECONNREFUSED, as a TCP client would, where the
/// server can be seen to be gone before anything is sent to it:
/// - providers whose addresses are a TCP listener (`ofi+tcp`,
///   `ofi+sockets`): nothing listens there (a server that stopped). rxm
///   does not report a refused connection: the hello would wait out the
///   timeout.
/// - `ofi+shm`: the server's queue file (`/dev/shm/NAME` of its address
///   `fi_shm://NAME`) is gone: its process exited (and unlinked it), or
///   was killed and a later shm process removed the file nobody used.
///   libfabric 1.17's shm cannot map such a peer and answers every send
///   "try again": the hello would spin until the timeout (and sending to
///   a vanished endpoint can crash the provider).
fn refused_at_once(server: &Address, timeout: Duration) -> Result<(), Error> {
    use crate::addr::Protocol;
    let refused = |message: String| {
        Err(Error::Call {
            call: "connect",
            code: libc::ECONNREFUSED,
            message,
        })
    };
    match server.protocol {
        Protocol::Tcp | Protocol::Sockets => {
            let Some(sa) = server.socket_addr() else {
                return Ok(());
            };
            let probe = timeout.min(Duration::from_secs(2));
            match std::net::TcpStream::connect_timeout(&sa, probe) {
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    refused(format!("nothing listens at {server}"))
                }
                _ => Ok(()),
            }
        }
        Protocol::Shm => {
            // (an address of another form, or no /dev/shm here: not known)
            let Some(name) = crate::endpoint::shm_queue_name(&server.raw) else {
                return Ok(());
            };
            let dir = std::path::Path::new("/dev/shm");
            match std::fs::symlink_metadata(dir.join(&name)) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && dir.is_dir() => {
                    refused(format!(
                        "{server}: its queue file {} is gone (the endpoint's process has exited)",
                        dir.join(&name).display()
                    ))
                }
                _ => Ok(()),
            }
        }
        _ => Ok(()),
    }
}

/// A session with one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session {
    /// The server.
    pub peer: Peer,
    /// The token the server gave.
    pub token: u64,
}

#[derive(Default)]
struct Inbox {
    /// A thread is reading the endpoint.
    reading: bool,
    /// Threads asleep on `RpcClient::cv`: signalled only when there are
    /// some (a notification is a system call even with nobody to wake).
    sleepers: usize,
    replies: HashMap<u64, (Header, Bytes)>,
    /// Calls whose caller gave up: their replies are dropped.
    abandoned: HashSet<u64>,
    /// Messages that were no reply to anyone here.
    strays: u64,
    /// Windows holding the payloads of lent requests ([`FLAG_LENT`]) until
    /// their answers come.
    lent: HashMap<u64, Arc<Window>>,
}

/// Windows of lent requests never answered over a provider that does not
/// revoke registrations (shm): the server may still read them, so their
/// memory is never given back (as the client's chunk windows).
static UNANSWERED: Mutex<Vec<Arc<Window>>> = Mutex::new(Vec::new());

/// The client side: calls to any number of servers over one endpoint,
/// from any number of threads.
pub struct RpcClient {
    ep: Arc<Endpoint>,
    /// Its address, the reply-to of every message in a session.
    from: Vec<u8>,
    rdma_thresh: usize,
    next_id: AtomicU64,
    inbox: Mutex<Inbox>,
    cv: Condvar,
}

impl RpcClient {
    /// A client on `ep` (which it then reads: nothing else should).
    pub fn new(ep: Arc<Endpoint>) -> RpcClient {
        RpcClient {
            from: ep.address().to_string().into_bytes(),
            ep,
            rdma_thresh: RDMA_THRESH,
            next_id: AtomicU64::new(1),
            inbox: Mutex::new(Inbox::default()),
            cv: Condvar::new(),
        }
    }

    /// Sets the size from which bulk data moves by RMA.
    pub fn with_rdma_thresh(mut self, bytes: usize) -> RpcClient {
        self.rdma_thresh = bytes.max(1);
        self
    }

    /// Its endpoint.
    pub fn endpoint(&self) -> &Arc<Endpoint> {
        &self.ep
    }

    /// Messages received that answered no call waiting here.
    pub fn strays(&self) -> u64 {
        self.lock().strays
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens a session with the server at `server`. A server seen to be
    /// gone before anything is sent (nothing listens at its TCP port; its
    /// `ofi+shm` queue file is gone) fails at once with ECONNREFUSED, as
    /// [`RpcClient::handshake`] does.
    pub fn connect(&self, server: &Address, timeout: Duration) -> Result<Session, RpcError> {
        refused_at_once(server, timeout)?;
        let peer = self.ep.connect(server)?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let hello = self.ep.address().to_string();
        let m = encode_message(0, id, OP_HELLO, 0, hello.as_bytes());
        self.ep.send(peer, &m, timeout)?;
        let (h, payload) = self.reply(id, Instant::now() + timeout, timeout)?;
        if h.op != OP_WELCOME || payload.len() != TOKEN_LEN {
            return Err(RpcError::Proto(ProtoError::Malformed(
                "the server's answer to HELLO is not a WELCOME with a token".into(),
            )));
        }
        let token = u64::from_le_bytes(payload[..].try_into().expect("8 bytes"));
        Ok(Session { peer, token })
    }

    /// Opens an authenticated session with the server at `server`: the
    /// challenge-response of `chfs_proto::handshake` as `role` with
    /// `cred`, over messages ([`OP_AUTH_HELLO`], [`OP_PROOF`]). A refusal
    /// is [`RpcError::Remote`] with the server's errno (EACCES for a wrong
    /// secret). A server seen to be gone before anything is sent fails at
    /// once with ECONNREFUSED ([`Error::Call`]): nothing listens at its
    /// TCP port (`ofi+tcp`, `ofi+sockets`), or its `ofi+shm` queue file
    /// is gone.
    pub fn handshake(
        &self,
        server: &Address,
        role: chfs_proto::handshake::Role,
        cred: &chfs_proto::handshake::Credential,
        timeout: Duration,
    ) -> Result<Session, RpcError> {
        use chfs_proto::handshake::{Connector, Verdict};
        let deadline = Instant::now() + timeout;
        // Every step takes what is left of the one timeout (a probe or a
        // send that waits, to a host that is gone, does not add to it).
        let left = || {
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1))
        };
        let (c, hello) = Connector::start(role, cred).map_err(RpcError::Remote)?;
        refused_at_once(server, left())?;
        let peer = self.ep.connect(server)?;
        let payload = encode_hello(
            &self.ep.address().to_string(),
            self.ep.max_message() as u32,
            &hello,
        );
        let id = self.post(
            &Session { peer, token: 0 },
            OP_AUTH_HELLO,
            0,
            &payload,
            left(),
        )?;
        let (h, p) = self.reply(id, deadline, timeout)?;
        let malformed = |why: &str| {
            RpcError::Proto(ProtoError::Malformed(format!(
                "the server's answer to a hello: {why}"
            )))
        };
        if h.op != OP_AUTH_REPLY || p.len() < TOKEN_LEN {
            return Err(malformed("not a welcome"));
        }
        let token = u64::from_le_bytes(p[..TOKEN_LEN].try_into().expect("8 bytes"));
        let (version, status, msg, auth) = decode_hello_reply(&p[TOKEN_LEN..])?;
        let s = Session { peer, token };
        let proof = c
            .on_reply(version, status, &msg, &auth)
            .map_err(RpcError::Remote)?;
        if token == 0 {
            return Err(malformed("no session token"));
        }
        let Some(proof) = proof else {
            return Ok(s);
        };
        let id = self.post(&s, OP_PROOF, 0, &proof, left())?;
        let (h, p) = self.reply(id, deadline, timeout)?;
        let fixed = p.get(..Verdict::FIXED_LEN);
        let (Some(fixed), OP_VERDICT) = (fixed, h.op) else {
            return Err(malformed("not a verdict"));
        };
        let (status, n) = Verdict::decode_fixed(fixed.try_into().expect("fixed"))?;
        let msg = String::from_utf8_lossy(
            p.get(Verdict::FIXED_LEN..Verdict::FIXED_LEN + n)
                .unwrap_or(&[]),
        );
        Connector::on_verdict(status, &msg).map_err(RpcError::Remote)?;
        Ok(s)
    }

    /// Sends one frame in session `s` without waiting for its answer;
    /// returns its id, for [`RpcClient::wait`]. A frame in a session
    /// carries this endpoint's address ([`encode_message_from`]): a server
    /// that does not know the session answers [`OP_NO_SESSION`] there.
    pub fn post(
        &self,
        s: &Session,
        op: u16,
        flags: u16,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<u64, RpcError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let m = if s.token == 0 || op == OP_BYE {
            encode_message(s.token, id, op, flags, payload)
        } else if fits_message(self.ep.max_message(), payload.len(), 2 + self.from.len()) {
            encode_message_from(s.token, id, op, flags, payload, &self.from)
        } else {
            // Larger than a message: lent until the answer comes.
            if payload.len() > MAX_PAYLOAD as usize {
                return Err(RpcError::Proto(ProtoError::FrameTooLarge {
                    len: payload.len() as u64,
                    max: MAX_PAYLOAD as u64,
                }));
            }
            let w = self.ep.window(payload.len())?;
            w.copy_in(0, payload)?;
            let key = RemoteKey {
                len: payload.len() as u64,
                ..w.remote_key()
            };
            self.lock().lent.insert(id, w);
            encode_message_from(
                s.token,
                id,
                op,
                flags | FLAG_LENT,
                &key.encode(),
                &self.from,
            )
        };
        if let Err(e) = self.ep.send(s.peer, &m, timeout) {
            self.settle_lent(id, false);
            return Err(e.into());
        }
        Ok(id)
    }

    /// The window of lent request `id` once it is settled: freed when
    /// `answered` (the server pulled it before it answered) or where the
    /// provider revokes a closed registration; else (shm) never freed.
    fn settle_lent(&self, id: u64, answered: bool) {
        let Some(w) = self.lock().lent.remove(&id) else {
            return;
        };
        if !answered && self.ep.address().protocol == crate::addr::Protocol::Shm {
            UNANSWERED.lock().unwrap_or_else(|e| e.into_inner()).push(w);
        }
    }

    /// A lent reply ([`FLAG_LENT`]) of session `s`: its payload pulled
    /// from the server's memory by `deadline`, then released
    /// ([`OP_RELEASE`], whether the pull worked or not).
    fn pull_lent(
        &self,
        s: &Session,
        h: Header,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<(Header, Bytes), RpcError> {
        let key = lent_key(payload)?;
        let len = key.len as usize;
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        let pulled = self
            .ep
            .buffer(len)
            .and_then(|b| self.ep.read(s.peer, Local::Buffer(b), 0, len, key, 0, left));
        let release = encode_message(s.token, h.id, OP_RELEASE, 0, &[]);
        let _ = self.ep.send(s.peer, &release, Duration::from_millis(100));
        let b = pulled?.expect("a buffer posted comes back");
        let h = Header {
            len: len as u32,
            flags: h.flags & !FLAG_LENT,
            ..h
        };
        Ok((h, Bytes::copy_from_slice(&b[..len])))
    }

    /// Waits for the answer to frame `id` ([`RpcClient::post`]) in session
    /// `s`: its header and payload (an error reply is returned as such,
    /// with `FLAG_ERROR`; a lent reply, [`FLAG_LENT`], pulled from the
    /// server first). After a timeout the answer is dropped when it comes.
    pub fn wait(
        &self,
        s: &Session,
        id: u64,
        timeout: Duration,
    ) -> Result<(Header, Bytes), RpcError> {
        let deadline = Instant::now() + timeout;
        let r = self.reply(id, deadline, timeout);
        self.answered(s, id, r, deadline)
    }

    /// What [`Self::wait`] and [`Self::wait_within`] do with call `id`'s
    /// answer (or failure) `r`: the call's lent request released, a lent
    /// reply pulled by `deadline`.
    fn answered(
        &self,
        s: &Session,
        id: u64,
        r: Result<(Header, Bytes), RpcError>,
        deadline: Instant,
    ) -> Result<(Header, Bytes), RpcError> {
        self.settle_lent(id, r.is_ok());
        match r {
            Ok((h, p)) if h.flags & FLAG_LENT != 0 => self.pull_lent(s, h, &p, deadline),
            r => r,
        }
    }

    /// Waits at most `within` for the answer to call `id` without giving
    /// up on it: None if none came by then (wait for it again later, with
    /// [`Self::wait`] or this; or [`Self::abandon`] it). A lent answer is
    /// pulled within `timeout` from now.
    pub fn wait_within(
        &self,
        s: &Session,
        id: u64,
        within: Duration,
        timeout: Duration,
    ) -> Result<Option<(Header, Bytes)>, RpcError> {
        let t0 = Instant::now();
        match self.reply_or_keep(id, t0 + within, within, false) {
            Err(RpcError::Fabric(Error::Timeout { .. })) => Ok(None),
            r => self.answered(s, id, r, t0 + timeout.max(within)).map(Some),
        }
    }

    /// Waits at most `timeout` for the answer to call `id`, the first of
    /// session `s` after it was idle: unanswered after [`PROBE_AFTER`],
    /// it is followed by a `Ping` in the same session. rxm may take a
    /// message into a connection that ended while nobody read (a
    /// restarted server) and lose it, even after [`Self::progress`]: 1 to
    /// 4 of 200 clients of a restarted server lost their request in half
    /// the runs of chfs-client's
    /// `many_clients_of_a_restarted_server_are_told_at_once`. A ping
    /// answered [`OP_NO_SESSION`] means no server knows the session any
    /// more, so the request (which named it) was not and will not be
    /// served: that answer is returned for it (the caller opens a new
    /// session and sends again, instead of waiting out its timeout). A
    /// ping answered otherwise: the server has the session, and the
    /// request is waited for as by [`Self::wait`]. A ping not answered
    /// either: another.
    pub fn wait_probing(
        &self,
        s: &Session,
        id: u64,
        timeout: Duration,
    ) -> Result<(Header, Bytes), RpcError> {
        let deadline = Instant::now() + timeout;
        let mut ping = Vec::with_capacity(8);
        Request::Ping.encode(&mut ping);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left <= PROBE_AFTER * 2 {
                return self.wait(s, id, left);
            }
            if let Some(r) = self.wait_within(s, id, PROBE_AFTER, left)? {
                return Ok(r);
            }
            // (A send may wait, for rxm's connection to a restarted
            // server: up to the request's time left, not the interval.)
            let left = deadline.saturating_duration_since(Instant::now());
            let p = match self.post(s, op::PING, 0, &ping, left) {
                Ok(p) => p,
                Err(e) => {
                    self.abandon(id);
                    return Err(e);
                }
            };
            match self.wait_within(s, p, PROBE_AFTER, PROBE_AFTER)? {
                Some(r) if r.0.op == OP_NO_SESSION => {
                    self.abandon(id);
                    return Ok(r);
                }
                Some(_) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    return self.wait(s, id, left);
                }
                None => self.abandon(p),
            }
        }
    }

    /// Gives up on call `id` (its answer, if it comes, is dropped).
    pub fn abandon(&self, id: u64) {
        let mut inbox = self.lock();
        if inbox.replies.remove(&id).is_none() {
            inbox.abandoned.insert(id);
        }
        drop(inbox);
        self.settle_lent(id, false);
    }

    /// Sends `req` in session `s` and waits for its response.
    pub fn call(
        &self,
        s: &Session,
        req: &Request,
        timeout: Duration,
    ) -> Result<Response, RpcError> {
        let mut payload = Vec::new();
        req.encode(&mut payload);
        self.exchange(s, req.op(), 0, &payload, timeout)
    }

    /// Sends a `Write` whose data is `data` (the request's own `data`
    /// left empty): in the frame below the RDMA threshold, else exposed
    /// for the server to read.
    pub fn write(
        &self,
        s: &Session,
        req: &Request,
        data: &[u8],
        timeout: Duration,
    ) -> Result<Response, RpcError> {
        if !matches!(req, Request::Write { data, .. } if data.is_empty()) {
            return Err(Error::InvalidInput("write() takes a Write without data".into()).into());
        }
        let mut payload = Vec::new();
        req.encode(&mut payload);
        if data.len() < self.rdma_thresh {
            // The data is the payload's tail.
            payload.extend_from_slice(data);
            return self.exchange(s, req.op(), 0, &payload, timeout);
        }
        self.ep.expose(data, |key| {
            payload.extend_from_slice(&key.encode());
            self.exchange(s, req.op(), FLAG_RMA, &payload, timeout)
        })?
    }

    /// Sends a `Read` and puts its data into `dst` (at least the `len`
    /// asked for): from the reply below the RDMA threshold, else written
    /// by the server into `dst`, exposed for the call. Returns the bytes
    /// placed.
    pub fn read(
        &self,
        s: &Session,
        req: &Request,
        dst: &mut [u8],
        timeout: Duration,
    ) -> Result<usize, RpcError> {
        let want = match req {
            Request::Read { len, .. } if *len as usize <= dst.len() => *len as usize,
            _ => {
                return Err(Error::InvalidInput(
                    "read() takes a Read of at most the destination's length".into(),
                )
                .into())
            }
        };
        let mut payload = Vec::new();
        req.encode(&mut payload);
        if want < self.rdma_thresh {
            return match self.exchange(s, req.op(), 0, &payload, timeout)? {
                Response::Data(d) if d.len() <= want => {
                    dst[..d.len()].copy_from_slice(&d);
                    Ok(d.len())
                }
                other => Err(unexpected(&other)),
            };
        }
        let r = self.ep.expose_mut(&mut dst[..want], |key| {
            payload.extend_from_slice(&key.encode());
            self.exchange(s, req.op(), FLAG_RMA, &payload, timeout)
        })??;
        match r {
            Response::Written(n) if n as usize <= want => Ok(n as usize),
            other => Err(unexpected(&other)),
        }
    }

    fn exchange(
        &self,
        s: &Session,
        op: u16,
        flags: u16,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<Response, RpcError> {
        let deadline = Instant::now() + timeout;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let m = encode_message(s.token, id, op, flags, payload);
        self.ep.send(s.peer, &m, timeout)?;
        let (h, payload) = self.reply(id, deadline, timeout)?;
        if h.flags & FLAG_ERROR != 0 {
            return Err(RpcError::Remote(decode_error(payload)?));
        }
        Ok(Response::decode(payload)?)
    }

    /// Reads what the endpoint has now if no other thread is reading it,
    /// filing replies for their callers. With manual progress (tcp under
    /// rxm) this is also when the provider learns of connections that
    /// ended while nobody read: a link unused for a while calls this
    /// before it sends, so that a message to a server that restarted goes
    /// over a new connection (and is answered [`OP_NO_SESSION`]) instead
    /// of being lost on the dead one.
    pub fn progress(&self) {
        let mut inbox = self.lock();
        if inbox.reading {
            return;
        }
        inbox.reading = true;
        drop(inbox);
        let mut got = Vec::new();
        // A few reads: the provider may learn of the ended connection in
        // one and tear it down in the next.
        for _ in 0..4 {
            match self.ep.recv(Duration::from_micros(1)) {
                Ok(m) => got.push(decode_message(&m)),
                Err(Error::Timeout { .. }) => {}
                Err(_) => break,
            }
        }
        let mut inbox = self.lock();
        inbox.reading = false;
        for g in got {
            match g {
                Ok((_, h, payload))
                    if !inbox.abandoned.remove(&h.id)
                        && h.id < self.next_id.load(Ordering::Relaxed) =>
                {
                    inbox.replies.insert(h.id, (h, payload));
                }
                _ => inbox.strays += 1,
            }
        }
        if inbox.sleepers > 0 {
            self.cv.notify_all();
        }
    }

    /// Waits for the reply to call `id`: reads the endpoint if no other
    /// thread does, filing other calls' replies; else waits to be handed
    /// it.
    fn reply(
        &self,
        id: u64,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<(Header, Bytes), RpcError> {
        self.reply_or_keep(id, deadline, timeout, true)
    }

    /// [`Self::reply`], which gives up on the call at the deadline only
    /// if `abandon` (else its answer, if it comes, is filed for a later
    /// wait).
    fn reply_or_keep(
        &self,
        id: u64,
        deadline: Instant,
        timeout: Duration,
        abandon: bool,
    ) -> Result<(Header, Bytes), RpcError> {
        let mut inbox = self.lock();
        loop {
            if let Some(r) = inbox.replies.remove(&id) {
                return Ok(r);
            }
            let now = Instant::now();
            if now >= deadline {
                if abandon {
                    inbox.abandoned.insert(id);
                }
                return Err(Error::Timeout {
                    op: "rpc",
                    after: timeout,
                    posted: true,
                }
                .into());
            }
            if inbox.reading {
                inbox.sleepers += 1;
                inbox = self
                    .cv
                    .wait_timeout(inbox, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                inbox.sleepers -= 1;
                continue;
            }
            inbox.reading = true;
            drop(inbox);
            let got = self.ep.recv(deadline - now).map(|m| decode_message(&m));
            inbox = self.lock();
            inbox.reading = false;
            if inbox.sleepers > 0 {
                self.cv.notify_all();
            }
            match got {
                Ok(Ok((_, h, payload))) => {
                    if h.id == id {
                        return Ok((h, payload));
                    }
                    if !inbox.abandoned.remove(&h.id) && h.id < self.next_id.load(Ordering::Relaxed)
                    {
                        inbox.replies.insert(h.id, (h, payload));
                    } else {
                        inbox.strays += 1;
                    }
                }
                Ok(Err(_)) => inbox.strays += 1,
                Err(Error::Timeout { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// Buffers the pool may keep for reuse.
const POOL_MAX: usize = 64;

/// A registered buffer lent out as a chunk's memory; back to its pool
/// when dropped (reused memory is faulted in and registered already:
/// a fresh buffer per write measured slower than a copy).
struct Pooled {
    buf: Option<Buffer>,
    len: usize,
    pool: std::sync::Weak<Mutex<Vec<Buffer>>>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf.as_ref().expect("held until drop")[..self.len]
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let (Some(b), Some(pool)) = (self.buf.take(), self.pool.upgrade()) {
            let mut pool = pool.lock().unwrap_or_else(|e| e.into_inner());
            if pool.len() < POOL_MAX {
                pool.push(b);
            }
        }
    }
}

fn unexpected(r: &Response) -> RpcError {
    RpcError::Proto(ProtoError::Malformed(format!("unexpected response {r:?}")))
}

/// Counters of a server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Sessions opened.
    pub sessions: u64,
    /// Requests answered (with a response or an error).
    pub served: u64,
    /// Messages dropped: not a frame, or of no session.
    pub dropped: u64,
    /// Write data read from clients by RMA.
    pub rma_pulls: u64,
    /// Read data written into clients by RMA.
    pub rma_pushes: u64,
}

/// The server side: sessions and the request loop over one endpoint.
pub struct RpcServer {
    ep: Endpoint,
    sessions: HashMap<u64, Peer>,
    stats: ServerStats,
    /// Registered buffers for RMA reads of clients' data.
    pull_buffers: Arc<Mutex<Vec<Buffer>>>,
}

impl RpcServer {
    /// A server on `ep`.
    pub fn new(ep: Endpoint) -> RpcServer {
        RpcServer {
            ep,
            sessions: HashMap::new(),
            stats: ServerStats::default(),
            pull_buffers: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Its endpoint.
    pub fn endpoint(&self) -> &Endpoint {
        &self.ep
    }

    /// Counters.
    pub fn stats(&self) -> ServerStats {
        self.stats
    }

    /// Waits up to `timeout` for one message and serves it: a HELLO opens
    /// a session, a request of a session goes to `handler` and its result
    /// back to the session's peer (an undecodable request gets EPROTO, as
    /// over TCP). Returns false when nothing came in time.
    pub fn serve_one(
        &mut self,
        timeout: Duration,
        handler: &mut impl FnMut(Request) -> Result<Response, ErrorReply>,
    ) -> Result<bool, RpcError> {
        let m = match self.ep.recv(timeout) {
            Ok(m) => m,
            Err(Error::Timeout { .. }) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        let decoded = decode_message_from(&m);
        drop(m);
        let Ok((token, h, payload, _)) = decoded else {
            self.stats.dropped += 1;
            return Ok(true);
        };
        let send_timeout = Duration::from_secs(5);
        if token == 0 {
            if h.op != OP_HELLO {
                self.stats.dropped += 1;
                return Ok(true);
            }
            let addr = std::str::from_utf8(&payload)
                .ok()
                .and_then(|s| s.parse::<Address>().ok());
            let Some(addr) = addr else {
                self.stats.dropped += 1;
                return Ok(true);
            };
            let peer = self.ep.connect(&addr)?;
            let token = loop {
                let t = crate::ffi::random_u64()?;
                if t != 0 && !self.sessions.contains_key(&t) {
                    break t;
                }
            };
            self.sessions.insert(token, peer);
            self.stats.sessions += 1;
            let welcome = encode_message(0, h.id, OP_WELCOME, 0, &token.to_le_bytes());
            self.ep.send(peer, &welcome, send_timeout)?;
            return Ok(true);
        }
        let Some(&peer) = self.sessions.get(&token) else {
            self.stats.dropped += 1;
            return Ok(true);
        };
        let result = if h.flags & FLAG_RMA != 0 {
            self.serve_rma(peer, h.op, payload, handler)
        } else {
            match Request::decode(h.op, payload) {
                Ok(req) => handler(req),
                Err(e) => Err(ErrorReply::new(
                    libc::EPROTO,
                    format!("undecodable request: {e}"),
                )),
            }
        };
        let mut out = Vec::new();
        let flags = match &result {
            Ok(resp) => {
                resp.encode(&mut out);
                0
            }
            Err(e) => {
                encode_error(&mut out, e);
                FLAG_ERROR
            }
        };
        if out.len() > MAX_PAYLOAD as usize {
            out.clear();
            encode_error(
                &mut out,
                &ErrorReply::new(libc::EMSGSIZE, "response too large"),
            );
        }
        let reply = encode_message(0, h.id, h.op, flags, &out);
        self.ep.send(peer, &reply, send_timeout)?;
        self.stats.served += 1;
        Ok(true)
    }

    /// A request whose bulk data is in the client's memory (`FLAG_RMA`):
    /// a `Write`'s data is read from there first; a `Read`'s answer is
    /// written there, and `Written(n)` goes back instead.
    fn serve_rma(
        &mut self,
        peer: Peer,
        op: u16,
        payload: Bytes,
        handler: &mut impl FnMut(Request) -> Result<Response, ErrorReply>,
    ) -> Result<Response, ErrorReply> {
        let timeout = Duration::from_secs(30);
        let fabric = |e: Error| ErrorReply::new(e.errno(), e.to_string());
        let proto = |why: String| ErrorReply::new(libc::EPROTO, why);
        let at = payload
            .len()
            .checked_sub(RemoteKey::LEN)
            .ok_or_else(|| proto("FLAG_RMA without a remote key".into()))?;
        let key = RemoteKey::decode(&payload[at..]).map_err(fabric)?;
        let req = Request::decode(op, payload.slice(..at))
            .map_err(|e| proto(format!("undecodable request: {e}")))?;
        let len = usize::try_from(key.len).unwrap_or(usize::MAX);
        if len > MAX_PAYLOAD as usize {
            return Err(ErrorReply::new(
                libc::EMSGSIZE,
                format!("{len} bytes of bulk data"),
            ));
        }
        match req {
            Request::Write {
                path,
                fileid,
                chunk_size,
                mode,
                idx,
                off,
                flags,
                epoch,
                data,
            } if data.is_empty() => {
                let pooled = {
                    let mut pool = self.pull_buffers.lock().unwrap_or_else(|e| e.into_inner());
                    pool.iter()
                        .position(|b| b.len() >= len)
                        .map(|i| pool.swap_remove(i))
                };
                let buf = match pooled {
                    Some(b) => b,
                    None => self.ep.buffer(len.max(64 * 1024)).map_err(fabric)?,
                };
                let buf = self
                    .ep
                    .read(peer, Local::Buffer(buf), 0, len, key, 0, timeout)
                    .map_err(fabric)?
                    .expect("a buffer posted comes back");
                // The registered buffer becomes the chunk's memory (no
                // copy) and returns to the pool when the chunk lets go.
                let data = Bytes::from_owner(Pooled {
                    buf: Some(buf),
                    len,
                    pool: Arc::downgrade(&self.pull_buffers),
                });
                self.stats.rma_pulls += 1;
                handler(Request::Write {
                    path,
                    fileid,
                    chunk_size,
                    mode,
                    idx,
                    off,
                    flags,
                    epoch,
                    data,
                })
            }
            req @ Request::Read { .. } => match handler(req)? {
                Response::Data(d) => {
                    if d.len() > len {
                        return Err(ErrorReply::new(libc::EMSGSIZE, "more data than asked for"));
                    }
                    let n = d.len();
                    if n > 0 {
                        self.ep
                            .write_from(peer, d, key, 0, timeout)
                            .map_err(fabric)?;
                        self.stats.rma_pushes += 1;
                    }
                    Ok(Response::Written(n as u32))
                }
                other => Ok(other),
            },
            other => Err(proto(format!("FLAG_RMA on op {}", other.op()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        let m = encode_message(0xdead_beef, 42, 7, FLAG_ERROR, b"payload");
        let (token, h, payload) = decode_message(&m).unwrap();
        assert_eq!(token, 0xdead_beef);
        assert_eq!((h.id, h.op, h.flags, h.len), (42, 7, FLAG_ERROR, 7));
        assert_eq!(&payload[..], b"payload");
    }

    /// The authenticated hello's layout, byte for byte (a wire format:
    /// both sides of a pool must agree on it).
    #[test]
    fn hello_golden_bytes() {
        let m = encode_hello("ofi+tcp://10.0.0.5:40001", 0x0001_1000, &[0xaa, 0xbb]);
        let mut want = vec![24, 0];
        want.extend_from_slice(b"ofi+tcp://10.0.0.5:40001");
        want.extend_from_slice(&[0x00, 0x10, 0x01, 0x00, 0xaa, 0xbb]);
        assert_eq!(m, want);
        let (addr, max, hello) = decode_hello(&m).unwrap();
        assert_eq!(addr.to_string(), "ofi+tcp://10.0.0.5:40001");
        assert_eq!((max, hello), (0x0001_1000, &[0xaa, 0xbb][..]));
        // Cut anywhere before the hello, or a bad address: refused.
        for n in 0..m.len() - 2 {
            assert!(decode_hello(&m[..n]).is_err(), "{n} bytes");
        }
        assert!(decode_hello(&encode_hello("tcp://x", 1, &[])).is_err());
        // The whole message: token 0, the frame header, the payload.
        let whole = encode_message(0, 1, OP_AUTH_HELLO, 0, &m);
        assert_eq!(&whole[..8], &[0; 8]);
        assert_eq!(&whole[8..12], &(m.len() as u32).to_le_bytes());
        assert_eq!(&whole[12..20], &1u64.to_le_bytes());
        assert_eq!(&whole[20..24], &[0x02, 0xff, 0, 0]);
    }

    /// A request whose bulk data moves by RMA: `FLAG_RMA` (not one of
    /// chfs-proto's frame flags) and the key as the payload's last 24
    /// bytes (address, length, key; little-endian).
    #[test]
    fn rma_request_golden_bytes() {
        use chfs_proto::frame::{FLAG_CMA, FLAG_FORWARDED};
        assert_eq!(FLAG_RMA, 8);
        assert_eq!(FLAG_RMA & (FLAG_ERROR | FLAG_FORWARDED | FLAG_CMA), 0);
        let key = RemoteKey {
            addr: 0x1122_3344_5566_7788,
            len: 1 << 20,
            key: 0x0a0b,
        };
        let mut payload = b"head".to_vec();
        payload.extend_from_slice(&key.encode());
        let m = encode_message(7, 9, 3, FLAG_RMA, &payload);
        let mut want = vec![
            7, 0, 0, 0, 0, 0, 0, 0, 28, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 3, 0, 8, 0,
        ];
        want.extend_from_slice(b"head");
        want.extend_from_slice(&[0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11]);
        want.extend_from_slice(&[0, 0, 0x10, 0, 0, 0, 0, 0]);
        want.extend_from_slice(&[0x0b, 0x0a, 0, 0, 0, 0, 0, 0]);
        assert_eq!(m, want);
        let (_, h, p) = decode_message(&m).unwrap();
        assert_eq!(h.flags, FLAG_RMA);
        assert_eq!(RemoteKey::decode(&p[4..]).unwrap(), key);
    }

    /// A frame larger than a message is lent: `FLAG_LENT` (16, none of
    /// the frame's other flags) and a payload that is exactly the key of
    /// the frame's payload, whose length is that of a frame at most.
    #[test]
    fn lent_frames() {
        use chfs_proto::frame::{FLAG_CMA, FLAG_FORWARDED};
        assert_eq!((FLAG_LENT, OP_RELEASE), (16, 0xff08));
        assert_eq!(
            FLAG_LENT & (FLAG_ERROR | FLAG_FORWARDED | FLAG_CMA | FLAG_RMA),
            0
        );
        let max = 64 * 1024 + 4096;
        assert!(fits_message(max, max - TOKEN_LEN - HEADER_LEN, 0));
        assert!(!fits_message(max, max - TOKEN_LEN - HEADER_LEN + 1, 0));
        assert!(!fits_message(max, max - TOKEN_LEN - HEADER_LEN, 1));
        let key = RemoteKey {
            addr: 0x1122_3344_5566_7788,
            len: 175_406,
            key: 0x0a0b,
        };
        assert_eq!(lent_key(&key.encode()).unwrap(), key);
        assert!(lent_key(&key.encode()[..23]).is_err());
        assert!(lent_key(&[&key.encode()[..], &[0]].concat()).is_err());
        for len in [0, MAX_PAYLOAD as u64 + 1, u64::MAX] {
            let k = RemoteKey { len, ..key };
            assert!(lent_key(&k.encode()).is_err(), "{len}");
        }
        let k = RemoteKey {
            len: MAX_PAYLOAD as u64,
            ..key
        };
        assert!(lent_key(&k.encode()).is_ok());
    }

    #[test]
    fn message_from_golden_bytes() {
        let m = encode_message_from(7, 9, 3, 0, b"ab", b"ofi+tcp://1.2.3.4:5");
        let mut want = vec![7, 0, 0, 0, 0, 0, 0, 0];
        want.extend_from_slice(&[2, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0]);
        want.extend_from_slice(b"ab");
        want.extend_from_slice(&[19, 0]);
        want.extend_from_slice(b"ofi+tcp://1.2.3.4:5");
        assert_eq!(m, want);
        let (t, h, p, from) = decode_message_from(&m).unwrap();
        assert_eq!((t, h.id, h.op, &p[..]), (7, 9, 3, &b"ab"[..]));
        assert_eq!(from.unwrap().to_string(), "ofi+tcp://1.2.3.4:5");
        // Without a sender, as before; a bad trailer is refused.
        let plain = encode_message(7, 9, 3, 0, b"ab");
        assert!(decode_message_from(&plain).unwrap().3.is_none());
        assert!(decode_message_from(&m[..m.len() - 1]).is_err());
        assert!(decode_message_from(&[&plain[..], &[1][..]].concat()).is_err());
        // The strict decoder refuses the trailer.
        assert!(decode_message(&m).is_err());
    }

    #[test]
    fn welcome_golden_bytes() {
        use chfs_proto::handshake::{Auth, HelloReply};
        let r = HelloReply::refusal(libc::EACCES, "no");
        let m = encode_welcome(0x0102_0304_0506_0708, &r.encode());
        assert_eq!(&m[..8], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(&m[8..], &r.encode()[..]);
        let (_, status, msg, auth) = decode_hello_reply(&m[8..]).unwrap();
        assert_eq!((status, msg.as_str()), (libc::EACCES, "no"));
        assert!(matches!(auth, Auth::Open));
        assert!(decode_hello_reply(&m[8..20]).is_err());
    }

    #[test]
    fn malformed_messages_are_refused() {
        let m = encode_message(1, 2, 3, 0, b"12345");
        assert!(matches!(
            decode_message(&m[..10]),
            Err(ProtoError::Truncated { .. })
        ));
        assert!(matches!(
            decode_message(&m[..m.len() - 1]),
            Err(ProtoError::Truncated { needed: 1 })
        ));
        let mut longer = m.clone();
        longer.push(0);
        assert!(matches!(
            decode_message(&longer),
            Err(ProtoError::FrameTooLarge { .. })
        ));
        let mut huge = m;
        huge[TOKEN_LEN..TOKEN_LEN + 4].copy_from_slice(&(MAX_PAYLOAD + 1).to_le_bytes());
        assert!(matches!(
            decode_message(&huge),
            Err(ProtoError::FrameTooLarge { .. })
        ));
    }
}
