//! Serving clients over a libfabric endpoint (`chfsd -p ofi+tcp`, ...):
//! the progress thread that owns the endpoint's completion queue, the
//! sessions the handshake opened, and requests handed to the runtime.
//!
//! One chfs-proto frame is one message behind the session token
//! ([`chfs_fabric::rpc`]); a client's first message ([`OP_AUTH_HELLO`])
//! carries its address and the hello of `chfs_proto::handshake`, and the
//! challenge-response runs over messages. A session's requests are
//! checked by the role it proved ([`Access`]), served by
//! [`crate::handler::handle`] in a task of the runtime, and answered with
//! the frame a stream connection would get. The progress thread blocks on
//! the queue's descriptor (an idle server costs no CPU) and wakes up once
//! a second to see whether the server stops.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use chfs_fabric::rpc::{
    decode_hello, decode_message_from, encode_message, encode_welcome, lent_key, FLAG_LENT,
    FLAG_RMA, OP_AUTH_HELLO, OP_AUTH_REPLY, OP_BYE, OP_NO_SESSION, OP_PROOF, OP_RELEASE,
    OP_VERDICT,
};
use chfs_fabric::{
    Address, Buffer, Endpoint, Error as FabricError, Local, Peer, RemoteKey, Window,
};
use chfs_proto::frame::{Header, FLAG_ERROR, FLAG_FORWARDED, HEADER_LEN};
use chfs_proto::handshake::{self, Accept, Hello, HelloReply, Pending};
use chfs_proto::msg::encode_error;
use chfs_proto::{ErrorReply, Request};
use tracing::{debug, info, warn};

use crate::connection::{response_frame, Access};
use crate::metrics::Counters;
use crate::state::Shared;

/// Requests at most this large are served in the progress thread (as far
/// as they go at once: [`Inline`]): every message's, whose data (up to
/// `CHFS_RDMA_THRESH`, 32 KiB by default) the store copies in less time
/// than the wake-up of a runtime thread takes.
const INLINE_MAX: usize = 64 << 10;

/// How long a reply may take to leave before the session is given up.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);

enum SessionState {
    /// Waiting for the proof.
    Challenged(Pending),
    /// Serving requests.
    Open(Access),
}

struct Session {
    peer: Peer,
    /// The client's address (its entry in [`Table::peers`]).
    addr: String,
    state: SessionState,
    /// When its last message came.
    last: Instant,
    /// Its requests being served (a session is not ended under them:
    /// their answers, and a read's or write's RMA, need its peer).
    busy: Arc<std::sync::atomic::AtomicUsize>,
}

/// One of a session's requests being served, until dropped (after its
/// answer left).
struct Busy(Arc<std::sync::atomic::AtomicUsize>);

impl Busy {
    fn new(n: &Arc<std::sync::atomic::AtomicUsize>) -> Self {
        n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Busy(n.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A client endpoint in the address vector: inserted once whatever its
/// number of sessions, removed when it has had none for [`PEER_GRACE`].
struct PeerEntry {
    peer: Peer,
    /// Handshake messages and answers to strangers being sent to it
    /// ([`send_aside`], up to [`SEND_TIMEOUT`]): the peer is not removed
    /// from the address vector under them (removing a peer with a send
    /// in flight crashed chfsd inside the provider: a flood of messages
    /// of unknown sessions naming addresses where nobody answers).
    sending: Arc<std::sync::atomic::AtomicUsize>,
    sessions: usize,
    last: Instant,
}

/// How long a peer with no session stays in the address vector (the
/// answer to a refused hello, or an [`OP_NO_SESSION`], must get out; the
/// client usually says hello again at once).
const PEER_GRACE: Duration = Duration::from_secs(2);

/// Answers to messages of sessions unknown here ([`OP_NO_SESSION`]) per
/// second, and as many at once: anyone may send such a message naming
/// any address, and each answer is a message to that address (a send on
/// a blocking thread, up to [`SEND_TIMEOUT`] for an address where nobody
/// answers) and an address-vector entry for [`PEER_GRACE`] (longer while
/// the answer is still on its way; at most [`IDLE_PEERS_MAX`] at once).
/// Beyond, such messages are dropped (counted): their senders, if real
/// clients of a restarted server, find out at their request's timeout
/// instead. Sized for the clients of a restarted server that send at
/// once: 200 were all told within 3 s in
/// `many_clients_of_a_restarted_server_are_told_at_once`, where a bound
/// of 100 a second left 83 of them to time out.
const NO_SESSION_PER_SEC: f64 = 1000.0;
/// Peers without a session (strangers answered, refused hellos) in the
/// address vector at most before a message of an unknown session from a
/// new address is dropped rather than answered.
const IDLE_PEERS_MAX: usize = 256;

/// Welcomes (answers to hellos) being sent at once ([`send_aside`]: each
/// holds a blocking thread of the runtime, up to [`SEND_TIMEOUT`] where
/// nobody answers). Beyond, a hello is dropped (counted) unless its
/// address is in the address vector with no handshake message on its way
/// (a flood naming one address again and again is dropped too), so that a flood of hellos naming
/// addresses where nobody answers leaves the runtime's other blocking
/// threads (512; answers to unknown sessions take at most
/// [`IDLE_PEERS_MAX`]) to the rest (a `sync`, calls to other servers, the
/// cache's flushes): 2,000 junk hellos made every client of the server
/// time out for 10 s and more. A real client's welcome leaves in a moment
/// and frees its slot (the 200 clients of a restarted server that say
/// hello again at once all get in); during such a flood new clients are
/// refused (their handshake times out) and open sessions are served.
const WELCOMES_MAX: usize = 128;

/// A token bucket for [`OP_NO_SESSION`] answers.
struct Strangers {
    tokens: f64,
    at: Instant,
}

impl Default for Strangers {
    fn default() -> Self {
        Strangers {
            tokens: NO_SESSION_PER_SEC,
            at: Instant::now(),
        }
    }
}

impl Strangers {
    /// May one more answer go now?
    fn take(&mut self) -> bool {
        let now = Instant::now();
        let refill = now.duration_since(self.at).as_secs_f64() * NO_SESSION_PER_SEC;
        self.tokens = (self.tokens + refill).min(NO_SESSION_PER_SEC);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// How long a session waits for the proof of its hello.
const CHALLENGE_KEPT: Duration = Duration::from_secs(10);

/// The sessions and the peers they use.
#[derive(Default)]
struct Table {
    sessions: HashMap<u64, Session>,
    peers: HashMap<String, PeerEntry>,
    strangers: Strangers,
    /// Welcomes in flight ([`WELCOMES_MAX`]).
    welcoming: Arc<std::sync::atomic::AtomicUsize>,
}

impl Table {
    /// The peer at `addr`, inserted into the address vector if new.
    fn peer(&mut self, ep: &Endpoint, addr: &Address) -> Result<Peer, FabricError> {
        let key = addr.to_string();
        if let Some(p) = self.peers.get_mut(&key) {
            p.last = Instant::now();
            return Ok(p.peer);
        }
        let peer = ep.connect(addr)?;
        self.peers.insert(
            key,
            PeerEntry {
                peer,
                sessions: 0,
                sending: Default::default(),
                last: Instant::now(),
            },
        );
        Ok(peer)
    }

    /// Marks a send to the peer at `addr` in flight until dropped.
    fn sending(&self, addr: &str) -> Option<Busy> {
        self.peers.get(addr).map(|p| Busy::new(&p.sending))
    }

    fn open(&mut self, token: u64, s: Session) {
        if let Some(p) = self.peers.get_mut(&s.addr) {
            p.sessions += 1;
        }
        self.sessions.insert(token, s);
    }

    fn close(&mut self, token: u64) -> bool {
        let Some(s) = self.sessions.remove(&token) else {
            return false;
        };
        if let Some(p) = self.peers.get_mut(&s.addr) {
            p.sessions = p.sessions.saturating_sub(1);
            p.last = Instant::now();
        }
        true
    }

    /// Ends sessions idle for longer than `idle` (clients that died
    /// without [`OP_BYE`]) and removes peers left without a session for
    /// [`PEER_GRACE`] from the address vector.
    fn sweep(&mut self, shared: &Shared, ep: &Endpoint, idle: Option<Duration>) {
        // A hello whose proof never came (a stranger's, or a client's
        // that gave up) ends after CHALLENGE_KEPT, whatever the idle
        // timeout: else anyone could open sessions (and address-vector
        // entries) that last an hour.
        let unproven: Vec<u64> = self
            .sessions
            .iter()
            .filter(|(_, s)| {
                matches!(s.state, SessionState::Challenged(_)) && s.last.elapsed() > CHALLENGE_KEPT
            })
            .map(|(t, _)| *t)
            .collect();
        for t in unproven {
            self.close(t);
            Counters::inc(&shared.counters.fabric_expired);
            debug!(
                sessions = self.sessions.len(),
                "fabric session never proven, ended"
            );
        }
        if let Some(idle) = idle {
            // A session whose requests take longer than the idle time
            // is not idle: its idle time starts when they are answered.
            for s in self.sessions.values_mut() {
                if s.busy.load(std::sync::atomic::Ordering::Relaxed) > 0 {
                    s.last = Instant::now();
                }
            }
            let old: Vec<u64> = self
                .sessions
                .iter()
                .filter(|(_, s)| s.last.elapsed() > idle)
                .map(|(t, _)| *t)
                .collect();
            for t in old {
                self.close(t);
                Counters::inc(&shared.counters.fabric_expired);
                debug!(sessions = self.sessions.len(), "fabric session expired");
            }
        }
        self.peers.retain(|addr, p| {
            let sending = p.sending.load(std::sync::atomic::Ordering::Acquire) > 0
                || outbox().sending_to(ep, p.peer);
            if p.sessions > 0 || sending || p.last.elapsed() < PEER_GRACE {
                return true;
            }
            outbox().forget(ep, p.peer);
            chfs_sys::lock(rma_slots()).remove(&(ep_key(ep), p.peer));
            match ep.disconnect(p.peer) {
                Ok(()) => debug!(%addr, "fabric peer removed"),
                Err(e) => debug!(%addr, "fabric: cannot remove the peer: {e}"),
            }
            false
        });
        shared.counters.fabric_sessions.store(
            self.sessions.len() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        shared.counters.fabric_peers.store(
            self.peers.len() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
    }
}

/// Starts the progress thread serving `ep` until the server stops.
pub fn start(shared: Arc<Shared>, ep: Arc<Endpoint>, rt: tokio::runtime::Handle) {
    let name = "chfsd-fabric".to_string();
    let r = std::thread::Builder::new()
        .name(name)
        .spawn(move || progress(shared, ep, rt));
    if let Err(e) = r {
        warn!("cannot start the fabric progress thread: {e}");
    }
}

fn progress(shared: Arc<Shared>, ep: Arc<Endpoint>, rt: tokio::runtime::Handle) {
    info!(addr = %ep.address(), "serving over the fabric");
    // Requests first served here may spawn and use the runtime's timers.
    let _rt = rt.enter();
    ON_PROGRESS_THREAD.set(true);
    let mut t = Table::default();
    let stop = shared.shutdown.subscribe();
    let idle = shared.limits.idle;
    let mut swept = Instant::now();
    outbox().count_for(&ep, Some(shared.clone()));
    loop {
        if *stop.borrow() {
            break;
        }
        if swept.elapsed() >= Duration::from_secs(1) {
            t.sweep(&shared, &ep, idle);
            Lent::sweep();
            swept = Instant::now();
        }
        shared.counters.fabric_sessions.store(
            t.sessions.len() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        // Replies queued for peers are posted as earlier ones complete:
        // the queue is read often while any wait.
        let out = outbox();
        if out.waiting() {
            out.pump(&ep);
        }
        let wait = if out.waiting() {
            Duration::from_millis(2)
        } else {
            Duration::from_secs(1)
        };
        let m = match ep.recv(wait) {
            Ok(m) => m,
            Err(FabricError::Timeout { .. }) => continue,
            Err(e) => {
                debug!("fabric receive failed: {e}");
                continue;
            }
        };
        let decoded = decode_message_from(&m);
        drop(m);
        let Ok((token, h, payload, from)) = decoded else {
            debug!("fabric: a message that is not a frame, dropped");
            continue;
        };
        if token == 0 {
            if h.op == OP_AUTH_HELLO {
                hello(&shared, &ep, &rt, &mut t, h, &payload);
            } else {
                debug!(op = h.op, "fabric: a message of no session, dropped");
            }
            continue;
        }
        if h.op == OP_BYE {
            if t.close(token) {
                debug!(sessions = t.sessions.len(), "fabric session closed");
            }
            continue;
        }
        if h.op == OP_RELEASE {
            // The client pulled a lent reply: its window goes.
            if let Some(s) = t.sessions.get(&token) {
                Lent::release(s.peer, h.id);
            }
            continue;
        }
        let Some(s) = t.sessions.get_mut(&token) else {
            no_session(&shared, &ep, &rt, &mut t, h, from);
            continue;
        };
        s.last = Instant::now();
        let peer = s.peer;
        let addr = s.addr.clone();
        match &s.state {
            SessionState::Challenged(pending) => {
                if h.op != OP_PROOF {
                    t.close(token);
                    continue;
                }
                let proof: Option<&handshake::Proof> = payload[..].try_into().ok();
                let verdict = match proof.map(|p| pending.check(p)) {
                    Some(Ok(role)) => {
                        debug!(?role, "fabric session accepted");
                        s.state = SessionState::Open(Access(Some(role)));
                        handshake::accepted()
                    }
                    Some(Err((v, e))) => {
                        Counters::inc(&shared.counters.refused);
                        warn!("fabric session refused: {}", e.message);
                        t.close(token);
                        v
                    }
                    None => {
                        t.close(token);
                        continue;
                    }
                };
                let m = encode_message(0, h.id, OP_VERDICT, 0, &verdict.encode());
                let guard = t.sending(&addr);
                send_aside(&rt, &ep, peer, m, guard, "verdict");
            }
            SessionState::Open(access) => {
                let access = *access;
                let busy = Busy::new(&s.busy);
                if h.flags & FLAG_LENT != 0 {
                    lent_request(&shared, &ep, &rt, peer, access, h, payload, busy);
                } else {
                    request(&shared, &ep, &rt, peer, access, h, payload, busy);
                }
            }
        }
    }
    outbox().count_for(&ep, None);
    info!("fabric endpoint closed");
}

/// A message whose token names no session here (this server restarted,
/// or the session expired): answered [`OP_NO_SESSION`] at the address the
/// message gave, so that the client opens a new session at once and sends
/// the request again, instead of waiting out its timeout.
fn no_session(
    shared: &Shared,
    ep: &Arc<Endpoint>,
    rt: &tokio::runtime::Handle,
    t: &mut Table,
    h: Header,
    from: Option<Address>,
) {
    let Some(from) = from else {
        debug!(
            op = h.op,
            "fabric: a message of an unknown session, dropped"
        );
        return;
    };
    let known = t.peers.contains_key(&from.to_string());
    let idle = || t.peers.values().filter(|p| p.sessions == 0).count();
    if (!known && idle() >= IDLE_PEERS_MAX) || !t.strangers.take() {
        Counters::inc(&shared.counters.fabric_no_session_dropped);
        debug!(op = h.op, %from, "fabric: a message of an unknown session, not answered (bound reached)");
        return;
    }
    let peer = match t.peer(ep, &from) {
        Ok(p) => p,
        Err(e) => {
            debug!(%from, "fabric: cannot add the peer: {e}");
            return;
        }
    };
    Counters::inc(&shared.counters.fabric_no_session);
    debug!(op = h.op, %from, "fabric: a message of an unknown session, answered");
    let mut e = Vec::new();
    encode_error(
        &mut e,
        &ErrorReply::new(
            libc::ENOTCONN,
            "no such fabric session here (the server restarted, or the session expired)",
        ),
    );
    let m = encode_message(0, h.id, OP_NO_SESSION, FLAG_ERROR, &e);
    // From a blocking thread, not the outbox: posting answers to
    // thousands of addresses from the progress thread stalled a new
    // client's handshake past its timeout (rxm sets up a connection to
    // each). The peer stays in the address vector while the send is on
    // its way (`sending`).
    let guard = t.sending(&from.to_string());
    send_aside(rt, ep, peer, m, guard, "no-session answer");
}

/// A client's hello: a new session (open, or challenged) or a refusal.
fn hello(
    shared: &Shared,
    ep: &Arc<Endpoint>,
    rt: &tokio::runtime::Handle,
    t: &mut Table,
    h: Header,
    payload: &[u8],
) {
    let Ok((addr, max, hello)) = decode_hello(payload) else {
        debug!("fabric: malformed hello, dropped");
        return;
    };
    // Over the bound, only a client already in the address vector with
    // no handshake message on its way is answered (one saying hello
    // again): an address a flood names again and again is in the address
    // vector from its first hello on, with that hello's welcome still on
    // its way.
    let welcoming = t.welcoming.load(std::sync::atomic::Ordering::Relaxed);
    let idle_client = t
        .peers
        .get(&addr.to_string())
        .is_some_and(|p| p.sending.load(std::sync::atomic::Ordering::Relaxed) == 0);
    if welcoming >= WELCOMES_MAX && !idle_client {
        Counters::inc(&shared.counters.fabric_hellos_dropped);
        debug!(%addr, "fabric: a hello not answered (bound of welcomes in flight reached)");
        return;
    }
    let peer = match t.peer(ep, &addr) {
        Ok(p) => p,
        Err(e) => {
            debug!(%addr, "fabric: cannot add the peer: {e}");
            return;
        }
    };
    let answer = if max as usize != ep.max_message() {
        Accept::Refuse(HelloReply::refusal(
            libc::EPROTO,
            format!(
                "largest fabric message {max} bytes, this server's {}",
                ep.max_message()
            ),
        ))
    } else {
        match hello
            .get(..Hello::HEAD_LEN)
            .map(|b| Hello::decode_head(b.try_into().expect("head length")))
        {
            Some(Ok(v)) if v != chfs_proto::PROTOCOL_VERSION => {
                Accept::Refuse(handshake::version_refusal(v))
            }
            Some(Ok(_)) => match hello
                .try_into()
                .map_err(|_| ())
                .and_then(|b| Hello::decode(b).map_err(|_| ()))
            {
                Ok(hello) => handshake::accept(&hello, shared.keys.as_ref()),
                Err(()) => Accept::Refuse(HelloReply::refusal(libc::EPROTO, "malformed hello")),
            },
            _ => Accept::Refuse(HelloReply::refusal(libc::EPROTO, "malformed hello")),
        }
    };
    let token = loop {
        let tk = u64::from_le_bytes(handshake::random_bytes());
        if tk != 0 && !t.sessions.contains_key(&tk) {
            break tk;
        }
    };
    let session = |state| Session {
        peer,
        addr: addr.to_string(),
        state,
        last: Instant::now(),
        busy: Default::default(),
    };
    let (token, reply) = match answer {
        Accept::Refuse(r) => {
            Counters::inc(&shared.counters.refused);
            warn!(%addr, "fabric session refused: {}", r.message);
            (0, r)
        }
        Accept::Open(r) => {
            t.open(token, session(SessionState::Open(Access(None))));
            (token, r)
        }
        Accept::Challenge(r, pending) => {
            t.open(token, session(SessionState::Challenged(pending)));
            (token, r)
        }
    };
    let m = encode_message(
        0,
        h.id,
        OP_AUTH_REPLY,
        0,
        &encode_welcome(token, &reply.encode()),
    );
    let guard = t.sending(&addr.to_string());
    let welcome = Busy::new(&t.welcoming);
    send_aside(rt, ep, peer, m, (guard, welcome), "welcome");
}

/// Sends a handshake message from a blocking thread: the peer of a hello
/// is whatever address the hello named, and rxm reports no refused
/// connection, so a send to a bogus one waits out its timeout; the
/// progress thread must not (a test's hello naming port 1 stalled every
/// client for 10 s).
///
/// `sending` (the marks of the send in flight) is held until it ends.
fn send_aside<H: Send + 'static>(
    rt: &tokio::runtime::Handle,
    ep: &Arc<Endpoint>,
    peer: Peer,
    m: Vec<u8>,
    sending: H,
    what: &'static str,
) {
    let ep = ep.clone();
    rt.spawn_blocking(move || {
        if let Err(e) = ep.send(peer, &m, SEND_TIMEOUT) {
            debug!("fabric: {what} not sent: {e}");
        }
        drop(sending);
    });
}

/// A request larger than a message ([`FLAG_LENT`]) of an open session:
/// refused at once if the session's role may not make it, else its
/// payload is pulled from the client's memory (in a task: the progress
/// thread completes the pull), then it is served as if it had come whole.
#[allow(clippy::too_many_arguments)]
fn lent_request(
    shared: &Arc<Shared>,
    ep: &Arc<Endpoint>,
    rt: &tokio::runtime::Handle,
    peer: Peer,
    access: Access,
    h: Header,
    payload: Bytes,
    busy: Busy,
) {
    let key = match lent_key(&payload) {
        Ok(k) => k,
        Err(e) => {
            warn!(op = h.op, "malformed request over the fabric: {e}");
            let e = ErrorReply::new(e.errno(), format!("malformed request: {e}"));
            return reply(ep, peer, h, Err(e));
        }
    };
    // What the peer's role may not ask is refused before anything is
    // pulled (up to `MAX_PAYLOAD` from the sender's memory); `request`
    // checks again, for every request.
    if let Some(e) = access.refusal(h.op, h.flags & FLAG_FORWARDED != 0) {
        Counters::inc(&shared.counters.denied);
        warn!(op = h.op, "{}", e.message);
        return reply(ep, peer, h, Err(e));
    }
    let len = key.len as usize;
    let (sh, ep2, rt2) = (shared.clone(), ep.clone(), rt.clone());
    Counters::inc(&shared.counters.fabric_lent_pulls);
    rt.spawn(async move {
        let fabric = |e: FabricError| ErrorReply::new(e.errno(), format!("fabric: {e}"));
        let slot = rma_slot(&sh, &ep2, peer).await;
        let pull = ep2
            .buffer(len)
            .and_then(|b| ep2.start_read(peer, Local::Buffer(b), 0, len, key, 0, SEND_TIMEOUT));
        let pulled = match pull {
            Ok(pull) => match tokio::time::timeout(RMA_TIMEOUT, pull).await {
                Ok(Ok(Some(b))) => Ok(b),
                Ok(Ok(None)) => Err(ErrorReply::new(
                    libc::EIO,
                    "the pull buffer did not come back",
                )),
                Ok(Err(e)) => Err(fabric(e)),
                Err(_) => Err(ErrorReply::new(
                    libc::ETIMEDOUT,
                    "the request lent by the client was not reached in time",
                )),
            },
            Err(e) => Err(fabric(e)),
        };
        drop(slot);
        match pulled {
            Ok(b) => {
                let h = Header {
                    len: len as u32,
                    flags: h.flags & !FLAG_LENT,
                    ..h
                };
                let payload = Bytes::copy_from_slice(&b[..len]);
                request(&sh, &ep2, &rt2, peer, access, h, payload, busy);
            }
            Err(e) => reply(&ep2, peer, h, Err(e)),
        }
    });
}

/// Replies larger than a message, lent to their clients ([`FLAG_LENT`]):
/// kept until the client's [`OP_RELEASE`], at most [`LENT_KEPT`] (a
/// client that never pulls), and no more than [`LENT_MAX_BYTES`] at a
/// time (beyond, such replies fail with ENOBUFS).
#[derive(Default)]
struct Lent {
    windows: HashMap<(Peer, u64), (Arc<Window>, Instant)>,
    bytes: usize,
}

/// How long a lent reply waits for its client.
const LENT_KEPT: Duration = Duration::from_secs(30);
/// Bytes of lent replies held at most.
const LENT_MAX_BYTES: usize = 256 << 20;

impl Lent {
    fn get() -> std::sync::MutexGuard<'static, Lent> {
        static LENT: std::sync::OnceLock<std::sync::Mutex<Lent>> = std::sync::OnceLock::new();
        chfs_sys::lock(LENT.get_or_init(Default::default))
    }

    /// Lends `body` (a reply's payload) to `peer` for its request `id`.
    fn lend(ep: &Endpoint, peer: Peer, id: u64, body: &[u8]) -> Result<RemoteKey, ErrorReply> {
        let mut l = Lent::get();
        if l.bytes + body.len() > LENT_MAX_BYTES {
            return Err(ErrorReply::new(
                libc::ENOBUFS,
                format!(
                    "a reply of {} bytes would be lent, and {} bytes of replies wait to be fetched",
                    body.len(),
                    l.bytes
                ),
            ));
        }
        let fabric = |e: FabricError| ErrorReply::new(e.errno(), format!("fabric: {e}"));
        let w = ep.window(body.len()).map_err(fabric)?;
        w.copy_in(0, body).map_err(fabric)?;
        let key = RemoteKey {
            len: body.len() as u64,
            ..w.remote_key()
        };
        l.bytes += w.len();
        if let Some((old, _)) = l.windows.insert((peer, id), (w, Instant::now())) {
            l.bytes -= old.len();
        }
        Ok(key)
    }

    /// The client pulled its reply.
    fn release(peer: Peer, id: u64) {
        let mut l = Lent::get();
        if let Some((w, _)) = l.windows.remove(&(peer, id)) {
            l.bytes -= w.len();
        }
    }

    /// Drops the replies whose clients did not fetch them in time.
    fn sweep() {
        let mut l = Lent::get();
        let before = l.windows.len();
        l.windows.retain(|_, (_, at)| at.elapsed() < LENT_KEPT);
        if l.windows.len() != before {
            l.bytes = l.windows.values().map(|(w, _)| w.len()).sum();
            debug!(
                dropped = before - l.windows.len(),
                "fabric: lent replies never fetched, dropped"
            );
        }
    }
}

/// A request of an open session: served in a task of the runtime, its
/// reply sent from there.
#[allow(clippy::too_many_arguments)]
fn request(
    shared: &Arc<Shared>,
    ep: &Arc<Endpoint>,
    rt: &tokio::runtime::Handle,
    peer: Peer,
    access: Access,
    h: Header,
    payload: Bytes,
    busy: Busy,
) {
    let forwarded = h.flags & FLAG_FORWARDED != 0;
    let (sh, ep) = (shared.clone(), ep.clone());
    if let Some(e) = access.refusal(h.op, forwarded) {
        Counters::inc(&shared.counters.denied);
        warn!(op = h.op, "{}", e.message);
        reply(&ep, peer, h, Err(e));
        return;
    }
    if shared.unknown_ops.contains(&h.op) {
        // (`--unknown-op`: as a server older than the request.)
        let e = chfs_proto::ProtoError::UnknownOp(h.op);
        reply(
            &ep,
            peer,
            h,
            Err(ErrorReply::new(e.errno(), format!("{e}"))),
        );
        return;
    }
    if h.flags & FLAG_RMA != 0 && h.flags & !(FLAG_FORWARDED | FLAG_RMA) == 0 {
        let pulls = pulls(shared);
        let served = async move {
            let r = serve_rma(&sh, &ep, pulls, peer, h, payload, forwarded).await;
            reply(&ep, peer, h, r);
            drop(busy);
        };
        // Served on this thread: a write's pull (a read's handler,
        // usually done at once, and its push) is posted from here, and
        // when this thread reads its completion the rest (the store, the
        // reply) runs here too, not after a hop to a runtime thread.
        Inline::start(rt, served);
        return;
    }
    if h.flags & !FLAG_FORWARDED != 0 {
        let e = ErrorReply::new(
            libc::EPROTO,
            format!("frame flags {:#x} not served over the fabric", h.flags),
        );
        reply(&ep, peer, h, Err(e));
        return;
    }
    match Request::decode(h.op, payload) {
        Ok(mut req) => {
            if let Request::ListTree { max, flags, .. } = &mut req {
                // Not more entries than a message can hold: the rest of a
                // larger page would be read (and encoded) only to be cut
                // off by `fit_listing` and read again for the next page.
                *max = (*max).min(tree_page_cap(*flags, ep.max_message()));
            }
            if let Request::Readdir { max, .. } | Request::ReaddirDirs { max, .. } = &mut req {
                // The same for a directory page (a name and a record
                // each, 67 bytes at least).
                let most = ep.max_message().saturating_sub(64) / (3 + chfs_proto::meta::META_LEN);
                *max = (*max).min(most.max(1) as u32);
            }
            let small = h.len as usize <= INLINE_MAX && shared.cache.is_none();
            let served = async move {
                let r = crate::handler::handle(&sh, req, forwarded).await;
                reply(&ep, peer, h, r);
                drop(busy);
            };
            // As a stream connection's reader does: a small request is
            // served here, and most complete at once (a store lookup),
            // answered without a hop to a runtime thread (a cross-CPU
            // wake-up costs as much as the round trip here).
            if small {
                Inline::start(rt, served);
            } else {
                rt.spawn(served);
            }
        }
        Err(e) => {
            warn!(op = h.op, "malformed request over the fabric: {e}");
            let e = ErrorReply::new(e.errno(), format!("malformed request: {e}"));
            reply(&ep, peer, h, Err(e));
        }
    }
}

thread_local! {
    /// This thread is an endpoint's progress thread.
    static ON_PROGRESS_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A request being served: its reply is sent by the future itself.
type Served = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// A request served on the progress thread as far as it goes at once
/// and continued by the thread that wakes it: on the progress thread (the
/// completion of its RMA, read there) it goes on there at once; woken on
/// any other thread (a timer, a slot freed by a task) the rest runs as a
/// task of the runtime. Over a fabric, an RMA write's reply then costs no
/// wake-up of a runtime thread (on a machine whose idle CPUs halt, as
/// much as a round trip).
struct Inline {
    fut: std::sync::Mutex<Option<Served>>,
    /// Woken while another poll of it ran: poll again.
    again: std::sync::atomic::AtomicBool,
    rt: tokio::runtime::Handle,
}

impl Inline {
    /// Polls `fut` here, then wherever it is woken.
    fn start(rt: &tokio::runtime::Handle, fut: impl Future<Output = ()> + Send + 'static) {
        let mut fut: Served = Box::pin(fut);
        if !ON_PROGRESS_THREAD.get() {
            rt.spawn(fut);
            return;
        }
        // Most requests are done at once (a store lookup): first polled
        // without a task of ours (the second poll, which a request that
        // waits gets from `run`, registers the task's waker).
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if !Inline::poll_once(&mut fut, &mut cx) {
            Inline::run(&Arc::new(Inline {
                fut: std::sync::Mutex::new(Some(fut)),
                again: Default::default(),
                rt: rt.clone(),
            }));
        }
    }

    /// One poll: whether the request is finished, served or ended by a
    /// panic (its client times out; the thread goes on).
    fn poll_once(fut: &mut Served, cx: &mut std::task::Context<'_>) -> bool {
        let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            fut.as_mut().poll(cx).is_ready()
        }));
        polled.unwrap_or_else(|_| {
            warn!("fabric: serving a request panicked; dropped");
            true
        })
    }

    /// Polls it until it is done or waits for something (again when it
    /// was woken meanwhile).
    fn run(task: &Arc<Inline>) {
        use std::sync::atomic::Ordering::SeqCst;
        let waker = std::task::Waker::from(task.clone());
        loop {
            // Set before trying: a poll that holds it sees it after.
            task.again.store(true, SeqCst);
            let Ok(mut slot) = task.fut.try_lock() else {
                return;
            };
            task.again.store(false, SeqCst);
            let Some(f) = slot.as_mut() else { return };
            if Inline::poll_once(f, &mut std::task::Context::from_waker(&waker)) {
                *slot = None;
                return;
            }
            drop(slot);
            if !task.again.load(SeqCst) {
                return;
            }
        }
    }

    /// The rest runs as a task of the runtime (unless a poll here holds
    /// it: that poll goes on).
    fn hand_off(task: &Arc<Inline>) {
        task.again.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Ok(mut slot) = task.fut.try_lock() {
            if let Some(f) = slot.take() {
                task.rt.spawn(f);
            }
        }
    }
}

impl std::task::Wake for Inline {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if ON_PROGRESS_THREAD.get() {
            Inline::run(self);
        } else {
            Inline::hand_off(self);
        }
    }
}

/// Registered buffers that RMA reads of clients' write data land in,
/// kept for reuse (a fresh registered buffer per write measured slower
/// than a copy: first touch and registration, doc/fabric.md).
type Pulls = Arc<std::sync::Mutex<Vec<Buffer>>>;

/// The server's pool of pull buffers (one per process).
fn pulls(_shared: &Shared) -> Pulls {
    static PULLS: std::sync::OnceLock<Pulls> = std::sync::OnceLock::new();
    PULLS.get_or_init(Default::default).clone()
}

/// Pull buffers kept.
const PULLS_KEPT: usize = 64;

/// Spare pull buffers of a size kept ready (allocated, faulted in and
/// registered by a blocking thread, off the request's path: a fresh
/// buffer's first touch cost more than the copy it saves, and the
/// buffers a store keeps as chunks do not come back).
const PULLS_SPARE: usize = 4;
/// ... but no more than this many bytes of them (at least one buffer).
const PULLS_SPARE_BYTES: usize = 16 << 20;

/// Which kept pull buffer (by its length) takes a pull of `len` bytes:
/// the smallest that holds it, unless that is more than twice as large
/// (none: a new buffer of `len`). A store keeps a write's pull buffer as
/// its chunks' memory (slices of it, a `WriteSpans`' several), so a
/// buffer much larger than its data would hold the difference for as
/// long as they live; the pulls of `WriteSpans` vary in size with the
/// writes' shapes.
fn pull_fit(lens: impl Iterator<Item = usize>, len: usize) -> Option<usize> {
    lens.enumerate()
        .filter(|&(_, l)| l >= len && l / 2 <= len.max(64 * 1024))
        .min_by_key(|&(_, l)| l)
        .map(|(i, _)| i)
}

/// The size of a new pull buffer for `len` bytes: at least 64 KiB, and
/// above 256 KiB a multiple of 256 KiB, so that the spares made after it
/// ([`restock`], of its size) fit the next pulls of a similar size (a
/// `WriteSpans`' size varies with its write's shape: 448, 512, 576 KiB
/// for 1 MiB writes of 64 KiB chunks to two servers), within
/// [`pull_fit`]'s bound.
fn pull_size(len: usize) -> usize {
    const STEP: usize = 256 * 1024;
    if len <= STEP {
        len.max(64 * 1024)
    } else {
        len.div_ceil(STEP) * STEP
    }
}

/// Tops the pool up to [`PULLS_SPARE`] buffers of `len` bytes (at most
/// [`PULLS_SPARE_BYTES`]) in the background.
fn restock(ep: &Arc<Endpoint>, pulls: &Pulls, len: usize) {
    static BUSY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let spare = chfs_sys::lock(pulls)
        .iter()
        .filter(|b| b.len() == len)
        .count();
    let want = (PULLS_SPARE_BYTES / len.max(1)).clamp(1, PULLS_SPARE);
    if spare >= want || BUSY.swap(true, std::sync::atomic::Ordering::AcqRel) {
        return;
    }
    let (ep, pool) = (ep.clone(), Arc::downgrade(pulls));
    let r = tokio::runtime::Handle::try_current().map(|rt| {
        rt.spawn_blocking(move || {
            for _ in spare..want {
                let Ok(mut b) = ep.buffer(len) else { break };
                for i in (0..len).step_by(4096) {
                    b[i] = 0;
                }
                let Some(pool) = pool.upgrade() else { break };
                let mut pool = chfs_sys::lock(&pool);
                if pool.len() >= PULLS_KEPT {
                    break;
                }
                pool.push(b);
            }
            BUSY.store(false, std::sync::atomic::Ordering::Release);
        })
    });
    if r.is_err() {
        BUSY.store(false, std::sync::atomic::Ordering::Release);
    }
}

/// A pull buffer lent to a chunk as its memory; back to the pool when the
/// chunk lets go of it.
struct Pooled {
    buf: Option<Buffer>,
    len: usize,
    pool: std::sync::Weak<std::sync::Mutex<Vec<Buffer>>>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf.as_ref().expect("held until drop")[..self.len]
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let (Some(b), Some(pool)) = (self.buf.take(), self.pool.upgrade()) {
            let mut pool = chfs_sys::lock(&pool);
            if pool.len() < PULLS_KEPT {
                pool.push(b);
            }
        }
    }
}

/// How long an RMA of one request may take.
const RMA_TIMEOUT: Duration = Duration::from_secs(30);

/// Most RMA operations (pulls of writes' data, pushes of reads') in
/// flight for one peer (a client's endpoint, whatever its sessions) at
/// once; its other requests that move data by RMA wait (in their tasks)
/// for one to end. Without it a client could make the server post any
/// number, each with a buffer of up to `MAX_PAYLOAD` bytes for a pull.
const RMA_PER_PEER: usize = 32;

/// A peer's RMA slots ([`RMA_PER_PEER`]) and how many are taken.
struct RmaSlots {
    free: Arc<tokio::sync::Semaphore>,
    busy: std::sync::atomic::AtomicUsize,
}

/// An RMA slot of a peer, held while its operation is in flight.
struct RmaSlot {
    slots: Arc<RmaSlots>,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for RmaSlot {
    fn drop(&mut self) {
        self.slots
            .busy
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// RMA slots by endpoint (its address in memory) and peer.
type SlotsByPeer = std::sync::Mutex<HashMap<(usize, Peer), Arc<RmaSlots>>>;

/// Every endpoint's peers' RMA slots (by endpoint, as the [`Outbox`]).
fn rma_slots() -> &'static SlotsByPeer {
    static SLOTS: std::sync::OnceLock<SlotsByPeer> = std::sync::OnceLock::new();
    SLOTS.get_or_init(Default::default)
}

/// Waits for an RMA slot of `peer` (at once when one is free: no task
/// switch); notes the most taken at once in `fabric_rma_most`.
async fn rma_slot(shared: &Shared, ep: &Endpoint, peer: Peer) -> RmaSlot {
    let slots = chfs_sys::lock(rma_slots())
        .entry((ep_key(ep), peer))
        .or_insert_with(|| {
            Arc::new(RmaSlots {
                free: Arc::new(tokio::sync::Semaphore::new(RMA_PER_PEER)),
                busy: Default::default(),
            })
        })
        .clone();
    let permit = slots
        .free
        .clone()
        .acquire_owned()
        .await
        .expect("never closed");
    let busy = slots
        .busy
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        + 1;
    shared
        .counters
        .fabric_rma_most
        .fetch_max(busy as u64, std::sync::atomic::Ordering::Relaxed);
    RmaSlot {
        slots,
        _permit: permit,
    }
}

/// A request whose bulk data is in the client's memory (`FLAG_RMA`, the
/// payload ending with a [`RemoteKey`]): a `Write`'s data (or a chunk a
/// peer moves here: `AdoptChunk`, `PutChunk`) is read from
/// there (into a pull buffer that becomes the chunk's memory) before it is
/// served; a `Read`'s data (or a `ReadSpans`' records) is written there
/// after, and `Written(n)` answers it, sent only once the write completed.
async fn serve_rma(
    shared: &Arc<Shared>,
    ep: &Arc<Endpoint>,
    pulls: Pulls,
    peer: Peer,
    h: Header,
    payload: Bytes,
    forwarded: bool,
) -> Result<chfs_proto::Response, ErrorReply> {
    let fabric = |e: FabricError| ErrorReply::new(e.errno(), format!("fabric: {e}"));
    let proto = |why: String| ErrorReply::new(libc::EPROTO, why);
    let at = payload
        .len()
        .checked_sub(RemoteKey::LEN)
        .ok_or_else(|| proto("FLAG_RMA without a remote key".into()))?;
    let key = RemoteKey::decode(&payload[at..]).map_err(fabric)?;
    let req = Request::decode(h.op, payload.slice(..at))
        .map_err(|e| ErrorReply::new(e.errno(), format!("malformed request: {e}")))?;
    let len = usize::try_from(key.len).unwrap_or(usize::MAX);
    if len > chfs_proto::frame::MAX_PAYLOAD as usize {
        return Err(ErrorReply::new(
            libc::EMSGSIZE,
            format!("{len} bytes of bulk data"),
        ));
    }
    let timed =
        |r: Result<Result<Option<Buffer>, FabricError>, tokio::time::error::Elapsed>| match r {
            Ok(r) => r.map_err(fabric),
            Err(_) => Err(ErrorReply::new(
                libc::ETIMEDOUT,
                "the client's memory was not reached in time",
            )),
        };
    let bulk_in = matches!(
        &req,
        Request::Write { data, .. }
            | Request::WriteSpans { data, .. }
            | Request::AdoptChunk { data, .. }
            | Request::PutChunk { data, .. }
            if data.is_empty() && len > 0
    );
    if bulk_in {
        // (Before its data is pulled; `handle` checks again, for the rest.)
        crate::handler::spans_of_one_owner(shared, &req)?;
    }
    match req {
        // A write's data, or a chunk a peer moves to this server
        // (rebalance, rename), read from the sender's memory.
        mut req if bulk_in => {
            // Before the buffer is taken: the bound is on memory too.
            let slot = rma_slot(shared, ep, peer).await;
            let kept = {
                let mut pool = chfs_sys::lock(&pulls);
                pull_fit(pool.iter().map(|b| b.len()), len).map(|i| pool.swap_remove(i))
            };
            let buf = match kept {
                Some(b) => b,
                None => ep.buffer(pull_size(len)).map_err(fabric)?,
            };
            restock(ep, &pulls, buf.len());
            let pull = ep
                .start_read(peer, Local::Buffer(buf), 0, len, key, 0, SEND_TIMEOUT)
                .map_err(fabric)?;
            let buf = timed(tokio::time::timeout(RMA_TIMEOUT, pull).await)?
                .ok_or_else(|| ErrorReply::new(libc::EIO, "the pull buffer did not come back"))?;
            drop(slot);
            Counters::inc(&shared.counters.rma_pulls);
            let pulled = Bytes::from_owner(Pooled {
                buf: Some(buf),
                len,
                pool: Arc::downgrade(&pulls),
            });
            match &mut req {
                Request::Write { data, .. }
                | Request::WriteSpans { data, .. }
                | Request::AdoptChunk { data, .. }
                | Request::PutChunk { data, .. } => *data = pulled,
                _ => unreachable!("matched above"),
            }
            crate::handler::handle(shared, req, forwarded).await
        }
        // A read's data, or the records of a read-ahead (`ReadSpans`: its
        // pieces one after the other; `ReadSpansPlaced`: each at its place
        // in the file, from the first's), written into the client's
        // memory from the store's chunks, without gathering them first.
        req @ (Request::Read { .. }
        | Request::ReadSpans { .. }
        | Request::ReadSpansPlaced { .. }) => {
            let places = match &req {
                Request::ReadSpansPlaced {
                    chunk_size, spans, ..
                } => {
                    let places = chfs_proto::msg::span_places(*chunk_size, spans)?;
                    let end = places.last().map_or(0, |&(o, n)| o + n);
                    if end > key.len {
                        return Err(ErrorReply::new(
                            libc::EMSGSIZE,
                            format!("spans placed over {end} bytes of {}", key.len),
                        ));
                    }
                    Some(places)
                }
                _ => None,
            };
            let pieces = match crate::handler::handle_pieces(shared, req, forwarded).await? {
                crate::handler::Served::Pieces(p) => p,
                crate::handler::Served::Reply(chfs_proto::Response::Data(d)) => vec![d],
                crate::handler::Served::Reply(other) => return Ok(other),
            };
            let n: usize = pieces.iter().map(Bytes::len).sum();
            if n > len {
                return Err(ErrorReply::new(libc::EMSGSIZE, "more data than asked for"));
            }
            if n > 0 {
                let _slot = rma_slot(shared, ep, peer).await;
                let packed = [(0, n as u64)];
                let places = match &places {
                    // (Every span is padded to its length by the store.)
                    Some(p) if p.iter().map(|x| x.1).sum::<u64>() == n as u64 => &p[..],
                    Some(_) => {
                        return Err(ErrorReply::new(
                            libc::EIO,
                            "spans read short of their length",
                        ))
                    }
                    None => &packed[..],
                };
                let pushes = push(shared, ep, peer, pieces, places, key)?;
                timed(
                    tokio::time::timeout(RMA_TIMEOUT, async {
                        for p in pushes {
                            p.await?;
                        }
                        Ok(None)
                    })
                    .await,
                )?;
                Counters::inc(&shared.counters.rma_pushes);
            }
            Ok(chfs_proto::Response::Written(n as u32))
        }
        other => Err(proto(format!("FLAG_RMA on request {}", other.op()))),
    }
}

/// Starts the RMA writes of `pieces` (a read's data: slices of the
/// store's chunks and of zeros, in order) into `places` (offset, length)
/// of the client's memory under `key`, which add up to the pieces'
/// length: as few gathered writes as the provider's iov limits allow,
/// each piece held for its write (`Endpoint::hold`: registered only where
/// the provider wants local memory registered, verbs; the hold keeps the
/// chunk alive until the write completes, no longer: a cached
/// registration kept chunks the store had dropped, up to the cache's 256
/// MiB, and their pull buffers out of the pool). A piece that cannot be
/// registered makes it one write from a copy (`reg_fallbacks`).
fn push(
    shared: &Shared,
    ep: &Arc<Endpoint>,
    peer: Peer,
    pieces: Vec<Bytes>,
    places: &[(u64, u64)],
    key: RemoteKey,
) -> Result<Vec<chfs_fabric::InFlight>, ErrorReply> {
    let fabric = |e: FabricError| ErrorReply::new(e.errno(), format!("fabric: {e}"));
    let pinned: Result<Vec<_>, _> = pieces.iter().map(|d| ep.hold(d.clone())).collect();
    let Ok(pinned) = pinned else {
        Counters::inc(&shared.counters.reg_fallbacks);
        let data = crate::handler::gather(pieces);
        let mut at = 0;
        return places
            .iter()
            .map(|&(roff, len)| {
                let len = len as usize;
                let mut b = ep.buffer(len).map_err(fabric)?;
                b.copy_from_slice(&data[at..at + len]);
                at += len;
                ep.start_write(peer, Local::Buffer(b), 0, len, key, roff, SEND_TIMEOUT)
                    .map_err(fabric)
            })
            .collect();
    };
    let lens: Vec<usize> = pieces.iter().map(Bytes::len).collect();
    writev_plan(&lens, places, ep.writev_limits())
        .into_iter()
        .map(|(local, remote)| {
            let local = local
                .into_iter()
                .map(|(i, off, len)| chfs_fabric::Piece {
                    mem: pinned[i].clone(),
                    off,
                    len,
                })
                .collect();
            ep.start_writev(peer, local, &remote, key, SEND_TIMEOUT)
                .map_err(fabric)
        })
        .collect()
}

/// The gathered writes that move pieces of `lens` bytes, one after the
/// other, into `places` (offset, length; adding up to the same length):
/// each write's local parts (piece, offset in it, length) and places, at
/// most `most` and `most_places` of each (the provider's iov limits).
/// Adjacent parts of one piece, and places that continue one another,
/// are one entry.
#[allow(clippy::type_complexity)]
fn writev_plan(
    lens: &[usize],
    places: &[(u64, u64)],
    (most, most_places): (usize, usize),
) -> Vec<(Vec<(usize, usize, usize)>, Vec<(u64, u64)>)> {
    let mut ops = Vec::new();
    let mut local: Vec<(usize, usize, usize)> = Vec::new();
    let mut remote: Vec<(u64, u64)> = Vec::new();
    let (mut pi, mut poff) = (0usize, 0usize);
    for &(roff, rlen) in places {
        let mut done = 0u64;
        while done < rlen {
            while pi < lens.len() && poff == lens[pi] {
                pi += 1;
                poff = 0;
            }
            if pi == lens.len() {
                break;
            }
            let take = (lens[pi] - poff).min((rlen - done) as usize);
            let at = roff + done;
            let joins_local = local
                .last()
                .is_some_and(|&(i, o, l)| i == pi && o + l == poff);
            let joins_remote = remote.last().is_some_and(|&(o, l)| o + l == at);
            if (!joins_local && local.len() == most)
                || (!joins_remote && remote.len() == most_places)
            {
                ops.push((std::mem::take(&mut local), std::mem::take(&mut remote)));
            }
            match local.last_mut() {
                Some((i, o, l)) if *i == pi && *o + *l == poff => *l += take,
                _ => local.push((pi, poff, take)),
            }
            match remote.last_mut() {
                Some((o, l)) if *o + *l == at => *l += take as u64,
                _ => remote.push((at, take as u64)),
            }
            poff += take;
            done += take as u64;
        }
    }
    if !local.is_empty() {
        ops.push((local, remote));
    }
    ops
}

/// Most entries of a tree listing page that a message of `max_message`
/// bytes can hold: each takes at least 6 bytes (front coding: shared and
/// rest lengths, a byte of its own, its type), and its metadata record
/// with [`chfs_proto::msg::tree::META`].
fn tree_page_cap(flags: u8, max_message: usize) -> u32 {
    let per = 6 + if flags & chfs_proto::msg::tree::META != 0 {
        chfs_proto::meta::META_LEN
    } else {
        0
    };
    (max_message.saturating_sub(64) / per).clamp(1, u32::MAX as usize) as u32
}

/// A directory listing or a tree listing larger than a message is cut to
/// a page that fits (`done` false: the client asks for the rest after its
/// last name or path, as it does when a page is full).
fn fit_listing(resp: chfs_proto::Response, max: usize) -> chfs_proto::Response {
    use chfs_proto::Response;
    if let Response::Tree(mut page) = resp {
        loop {
            let mut b = Vec::new();
            let r = Response::Tree(page);
            r.encode(&mut b);
            let Response::Tree(p) = r else {
                unreachable!("built above")
            };
            page = p;
            if b.len() + 64 <= max || page.len() <= 1 {
                return Response::Tree(page);
            }
            let keep = (page.len() * (max - 64) / b.len()).clamp(1, page.len() - 1);
            page.truncate(keep);
        }
    }
    let Response::Entries {
        mut entries,
        mut done,
    } = resp
    else {
        return resp;
    };
    loop {
        let r = Response::Entries { entries, done };
        let mut b = Vec::new();
        r.encode(&mut b);
        let Response::Entries {
            entries: e,
            done: d,
        } = r
        else {
            unreachable!("built above")
        };
        (entries, done) = (e, d);
        if b.len() + 64 <= max || entries.len() <= 1 {
            return Response::Entries { entries, done };
        }
        let keep = (entries.len() * (max - 64) / b.len()).clamp(1, entries.len() - 1);
        entries.truncate(keep);
        done = false;
    }
}

/// Sends the reply to request `h`: the frame a stream would carry, in one
/// message; a frame larger than a message is lent ([`FLAG_LENT`]: the
/// message carries its key, the client pulls it). Listings are cut into
/// pages that fit instead (the protocol pages them anyway).
fn reply(ep: &Arc<Endpoint>, peer: Peer, h: Header, r: Result<chfs_proto::Response, ErrorReply>) {
    let r = r.map(|resp| fit_listing(resp, ep.max_message()));
    let (rh, head, tail, _) = response_frame(h.id, h.op, r);
    let tail = tail.into_bytes();
    let mut m = Vec::with_capacity(8 + HEADER_LEN + head.len() + tail.len());
    m.extend_from_slice(&0u64.to_le_bytes());
    m.extend_from_slice(&rh.encode());
    m.extend_from_slice(&head);
    m.extend_from_slice(&tail);
    if !chfs_fabric::rpc::fits_message(ep.max_message(), head.len() + tail.len(), 0) {
        // Chunk data (a tail) larger than a message moves by the
        // client's RMA (`FLAG_RMA`), which it asks for: a read asked
        // inline beyond a message is refused as before, not lent (it
        // would hold server memory for a client that need not ask so).
        let lent = if tail.is_empty() {
            Lent::lend(ep, peer, h.id, &m[8 + HEADER_LEN..])
        } else {
            Err(ErrorReply::new(
                libc::EMSGSIZE,
                format!(
                    "a read's reply of {} bytes is larger than a fabric message ({} bytes): ask for it by RMA",
                    m.len(),
                    ep.max_message()
                ),
            ))
        };
        let (rh, body) = match lent {
            Ok(key) => {
                let rh = Header {
                    len: RemoteKey::LEN as u32,
                    flags: rh.flags | FLAG_LENT,
                    ..rh
                };
                (rh, key.encode().to_vec())
            }
            Err(e) => {
                let (rh, head, _, _) = response_frame(h.id, h.op, Err(e));
                (rh, head.to_vec())
            }
        };
        m.truncate(8);
        m.extend_from_slice(&rh.encode());
        m.extend_from_slice(&body);
    }
    outbox().send(ep, peer, m, h.op);
}

/// Most sends to one peer (a client's endpoint, whatever its number of
/// sessions) posted and not yet completed; more wait in its queue.
const PEER_POSTED_MAX: usize = 16;

/// Most bytes of replies queued for one peer beyond those posted: a peer
/// that takes none of them (a stopped process) costs the server at most
/// this and [`PEER_POSTED_MAX`] messages; replies beyond are dropped (its
/// calls time out, as they would with a lost message).
const PEER_QUEUED_BYTES: usize = 8 << 20;

/// Replies on their way out, per peer. A reply is never waited for:
/// injected or posted at once (its completion checked later), or queued
/// behind the peer's earlier ones when it already has
/// [`PEER_POSTED_MAX`] in flight or the provider's queue is full; the
/// progress thread posts queued ones as earlier ones complete
/// ([`Outbox::pump`]). So a peer that stops reading (a SIGSTOPped client
/// with replies pending) holds no thread and no other peer's replies:
/// before, the progress thread waited up to [`SEND_TIMEOUT`] for each
/// reply to it to leave, stalling every other client.
#[derive(Default)]
struct Outbox {
    /// By endpoint (its address in memory) and peer.
    peers: std::sync::Mutex<HashMap<(usize, Peer), PeerOut>>,
    /// Messages queued over all peers.
    queued: std::sync::atomic::AtomicUsize,
    /// By endpoint: the server whose status counts its dropped replies
    /// (`fabric_replies_dropped`), while its progress thread runs.
    servers: std::sync::Mutex<HashMap<usize, Arc<Shared>>>,
}

#[derive(Default)]
struct PeerOut {
    posted: std::collections::VecDeque<chfs_fabric::InFlight>,
    queued: std::collections::VecDeque<(Vec<u8>, u16)>,
    queued_bytes: usize,
    /// Replies dropped since its queue was last empty.
    dropped: u64,
}

impl PeerOut {
    /// Forgets the posted sends that completed.
    fn reap(&mut self) {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        self.posted
            .retain_mut(|f| match std::pin::Pin::new(f).poll(&mut cx) {
                std::task::Poll::Pending => true,
                std::task::Poll::Ready(Ok(_)) => false,
                std::task::Poll::Ready(Err(e)) => {
                    debug!("fabric: reply not sent: {e}");
                    false
                }
            });
    }

    /// Tries to send `m` now: false when it must wait.
    fn try_post(&mut self, ep: &Arc<Endpoint>, peer: Peer, m: &[u8], op: u16) -> bool {
        if self.posted.len() >= PEER_POSTED_MAX {
            return false;
        }
        match ep.try_send(peer, m) {
            Ok(chfs_fabric::Sent::Done) => true,
            Ok(chfs_fabric::Sent::Posted(f)) => {
                self.posted.push_back(f);
                true
            }
            Ok(chfs_fabric::Sent::Again) => false,
            Err(e) => {
                debug!(op, "fabric: reply not sent: {e}");
                true
            }
        }
    }
}

/// An endpoint's key in the [`Outbox`].
fn ep_key(ep: &Endpoint) -> usize {
    ep as *const Endpoint as usize
}

/// The process's outbox (of every endpoint that serves: a peer's number
/// is its endpoint's).
fn outbox() -> &'static Outbox {
    static OUTBOX: std::sync::OnceLock<Outbox> = std::sync::OnceLock::new();
    OUTBOX.get_or_init(Default::default)
}

impl Outbox {
    /// Sends `m` (the reply to a request `op`) to `peer` without waiting.
    fn send(&self, ep: &Arc<Endpoint>, peer: Peer, m: Vec<u8>, op: u16) {
        let mut g = chfs_sys::lock(&self.peers);
        let o = g.entry((ep_key(ep), peer)).or_default();
        o.reap();
        if o.queued.is_empty() && o.try_post(ep, peer, &m, op) {
            return;
        }
        if o.queued_bytes + m.len() > PEER_QUEUED_BYTES {
            if o.dropped == 0 {
                warn!(
                    queued = o.queued.len(),
                    "fabric: a client takes no replies (stopped?): its replies are dropped until it does"
                );
            }
            o.dropped += 1;
            if let Some(sh) = chfs_sys::lock(&self.servers).get(&ep_key(ep)) {
                Counters::inc(&sh.counters.fabric_replies_dropped);
            }
            return;
        }
        o.queued_bytes += m.len();
        o.queued.push_back((m, op));
        self.queued
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Counts the replies to `ep`'s peers it drops in `shared`'s status
    /// (`None`: no more, the endpoint's progress thread ended).
    fn count_for(&self, ep: &Endpoint, shared: Option<Arc<Shared>>) {
        let mut g = chfs_sys::lock(&self.servers);
        match shared {
            Some(sh) => g.insert(ep_key(ep), sh),
            None => g.remove(&ep_key(ep)),
        };
    }

    /// Are replies waiting to be posted?
    fn waiting(&self) -> bool {
        self.queued.load(std::sync::atomic::Ordering::Relaxed) > 0
    }

    /// Posts queued replies as far as their peers' completed sends and
    /// the provider's queue allow (the progress thread, often while any
    /// wait).
    fn pump(&self, ep: &Arc<Endpoint>) {
        let mut g = chfs_sys::lock(&self.peers);
        let at = ep_key(ep);
        for ((_, peer), o) in g.iter_mut().filter(|((e, _), _)| *e == at) {
            o.reap();
            while let Some((m, op)) = o.queued.pop_front() {
                if !o.try_post(ep, *peer, &m, op) {
                    o.queued.push_front((m, op));
                    break;
                }
                o.queued_bytes -= m.len();
                self.queued
                    .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            }
            if o.queued.is_empty() && o.dropped > 0 {
                debug!(dropped = o.dropped, "fabric: a client takes replies again");
                o.dropped = 0;
            }
        }
        g.retain(|_, o| !o.posted.is_empty() || !o.queued.is_empty());
    }

    /// Has `peer` a reply posted and not yet completed? Such a peer is
    /// not removed from the address vector: a peer removed under a send
    /// crashed chfsd inside the provider (found with unknown-session
    /// answers, which now wait for their send the same way).
    fn sending_to(&self, ep: &Endpoint, peer: Peer) -> bool {
        chfs_sys::lock(&self.peers)
            .get_mut(&(ep_key(ep), peer))
            .is_some_and(|o| {
                o.reap();
                !o.posted.is_empty()
            })
    }

    /// Drops what is on its way to `peer` (removed from the address
    /// vector: its number may name another peer later).
    fn forget(&self, ep: &Endpoint, peer: Peer) {
        if let Some(o) = chfs_sys::lock(&self.peers).remove(&(ep_key(ep), peer)) {
            self.queued
                .fetch_sub(o.queued.len(), std::sync::atomic::Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chfs_proto::msg::{tree, TreePage};
    use chfs_proto::{Meta, Response};

    /// A request served inline goes on at once on the progress thread
    /// when that thread wakes it (as it does reading the completion of
    /// the request's RMA), as a task of the runtime when another thread
    /// does, and a panic in it ends the request, not the thread.
    #[test]
    fn inline_requests_go_on_where_they_are_woken() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let h = rt.handle().clone();
        std::thread::spawn(move || {
            ON_PROGRESS_THREAD.set(true);
            let me = std::thread::current().id();
            let (ran, where_) = std::sync::mpsc::channel();
            let served = |rx: tokio::sync::oneshot::Receiver<()>| {
                let ran = ran.clone();
                async move {
                    rx.await.unwrap();
                    ran.send(std::thread::current().id()).unwrap();
                }
            };
            let (tx, rx) = tokio::sync::oneshot::channel();
            Inline::start(&h, served(rx));
            assert!(where_.try_recv().is_err(), "it waits");
            tx.send(()).unwrap();
            assert_eq!(where_.try_recv(), Ok(me), "went on in the send");

            let (tx, rx) = tokio::sync::oneshot::channel();
            Inline::start(&h, served(rx));
            std::thread::spawn(move || tx.send(()).unwrap())
                .join()
                .unwrap();
            let there = where_.recv_timeout(Duration::from_secs(10)).unwrap();
            assert_ne!(there, me);

            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            Inline::start(&h, async move {
                rx.await.unwrap();
                panic!("a request's handler panicked (this test's)");
            });
            tx.send(()).unwrap();
            Inline::start(&h, async {
                panic!("a request's handler panicked at once (this test's)")
            });
            let (tx, rx) = tokio::sync::oneshot::channel();
            Inline::start(&h, served(rx));
            tx.send(()).unwrap();
            assert_eq!(where_.try_recv(), Ok(me), "the thread goes on");
        })
        .join()
        .unwrap();
    }

    /// A pull takes the smallest kept buffer that holds it, and none more
    /// than twice its size (of at least 64 KiB): a 4 MiB buffer kept from
    /// a large `WriteSpans` does not become the memory of 448 KiB of
    /// chunks.
    #[test]
    fn a_pull_takes_the_smallest_buffer_that_fits() {
        let kept = [4 << 20, 576 << 10, 1 << 20, 64 << 10];
        assert_eq!(pull_fit(kept.into_iter(), 448 << 10), Some(1));
        assert_eq!(pull_fit(kept.into_iter(), 600 << 10), Some(2));
        assert_eq!(pull_fit(kept.into_iter(), 64 << 10), Some(3));
        // (Small pulls: any buffer of up to 128 KiB.)
        assert_eq!(pull_fit([128 << 10].into_iter(), 4096), Some(0));
        assert_eq!(pull_fit([4 << 20].into_iter(), 1 << 20), None);
        assert_eq!(pull_fit([4 << 20].into_iter(), 2 << 20), Some(0));
        assert_eq!(pull_fit([32 << 10].into_iter(), 64 << 10), None);
        assert_eq!(pull_fit(std::iter::empty(), 1), None);
        // New buffers come in few sizes, each fitting its neighbours.
        assert_eq!(pull_size(1000), 64 << 10);
        assert_eq!(pull_size(200 << 10), 200 << 10);
        assert_eq!(pull_size(448 << 10), 512 << 10);
        assert_eq!(pull_size(576 << 10), 768 << 10);
        assert_eq!(
            pull_fit([pull_size(576 << 10)].into_iter(), 448 << 10),
            Some(0)
        );
    }

    /// A read's pieces are pushed by as few gathered writes as the
    /// provider's iov limits allow, every byte once and in order.
    #[test]
    fn pushes_are_planned_within_the_iov_limits() {
        // Packed: 16 chunk slices of 64 KiB into one place, 4 per write.
        let lens = vec![65536; 16];
        let plan = writev_plan(&lens, &[(0, 16 * 65536)], (4, 4));
        assert_eq!(plan.len(), 4);
        for (k, (local, remote)) in plan.iter().enumerate() {
            assert_eq!(local.len(), 4);
            assert_eq!(remote, &vec![(k as u64 * 4 * 65536, 4 * 65536)]);
        }
        // Placed: pieces cut across places, places that continue one
        // another joined, a piece's parts of one write joined.
        let plan = writev_plan(
            &[100, 50, 30],
            &[(1000, 60), (1060, 60), (5000, 60)],
            (2, 2),
        );
        assert_eq!(
            plan,
            vec![
                (vec![(0, 0, 100), (1, 0, 50)], vec![(1000, 120), (5000, 30)]),
                (vec![(2, 0, 30)], vec![(5030, 30)]),
            ]
        );
        // One place per write: every write takes what fits.
        let plan = writev_plan(&[10, 10], &[(0, 5), (100, 10), (200, 5)], (4, 1));
        assert_eq!(
            plan,
            vec![
                (vec![(0, 0, 5)], vec![(0, 5)]),
                (vec![(0, 5, 5), (1, 0, 5)], vec![(100, 10)]),
                (vec![(1, 5, 5)], vec![(200, 5)]),
            ]
        );
        // Every byte planned once, in order, whatever the limits.
        for (most, most_places) in [(1, 1), (1, 3), (3, 1), (4, 4), (16, 16)] {
            let lens = [7, 1, 30, 12, 5];
            let places = [(0u64, 9u64), (20, 1), (30, 25), (100, 20)];
            let plan = writev_plan(&lens, &places, (most, most_places));
            let mut stream = Vec::new();
            let mut dst = Vec::new();
            for (local, remote) in &plan {
                assert!(local.len() <= most && remote.len() <= most_places);
                let l: usize = local.iter().map(|x| x.2).sum();
                let r: u64 = remote.iter().map(|x| x.1).sum();
                assert_eq!(l as u64, r);
                for &(i, o, n) in local {
                    stream.extend((o..o + n).map(|b| (i, b)));
                }
                for &(o, n) in remote {
                    dst.extend(o..o + n);
                }
            }
            let want: Vec<_> = lens
                .iter()
                .enumerate()
                .flat_map(|(i, &n)| (0..n).map(move |b| (i, b)))
                .collect();
            assert_eq!(stream, want);
            let want_dst: Vec<u64> = places.iter().flat_map(|&(o, n)| o..o + n).collect();
            assert_eq!(dst, want_dst);
        }
    }

    /// A tree page is asked for no more entries than a message holds,
    /// and not many fewer: a page of the capped number of the smallest
    /// entries is cut by at most a few percent (the rest of a page read
    /// beyond what fits was read for nothing, and again for the next
    /// page: 30,001 entries with headers over ofi+tcp took 535 ms, 84 ms
    /// with the cap).
    #[test]
    fn tree_pages_are_capped_to_what_a_message_holds() {
        let max = crate::fabric_ep::MAX_MESSAGE;
        for flags in [0, tree::META] {
            let cap = tree_page_cap(flags, max) as usize;
            let mut page = TreePage::default();
            let meta = Meta::default();
            for i in 0..cap {
                // Consecutive paths differing in their last bytes.
                let p = format!("/d/{i:08}");
                page.push_entry(&p, 8, (flags & tree::META != 0).then_some(&meta));
            }
            let Response::Tree(fit) = fit_listing(Response::Tree(page), max) else {
                panic!("not a tree page");
            };
            assert!(
                fit.len() * 100 >= cap * 90,
                "flags {flags}: {} of {cap} fit",
                fit.len()
            );
            let mut b = Vec::new();
            Response::Tree(fit).encode(&mut b);
            assert!(b.len() + 8 + HEADER_LEN <= max);
        }
        assert_eq!(tree_page_cap(tree::META, 100), 1);
    }
}
