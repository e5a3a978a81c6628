//! The transport seam: what the pool needs of a path to one server, over
//! a socket ([`Conn`]: TCP or a Unix socket) or a libfabric endpoint
//! ([`FabricLink`]), chosen by the server's address (`ofi+tcp://IP:PORT`
//! is the fabric, `host:port` our TCP).

use std::sync::Arc;
use std::time::Duration;

use chfs_proto::{Request, Response};

use crate::config::ClientConfig;
use crate::conn::{self, Conn, Landing};
use crate::error::{fail, Result};
use crate::fabric_link::{is_fabric, FabricLink};
use crate::poll::Counts;

/// A path to one server (always behind an `Arc`: the size of the socket
/// variant costs nothing).
#[allow(clippy::large_enum_variant)]
pub(crate) enum Link {
    /// A TCP or Unix stream.
    Socket(Conn),
    /// A session over a fabric endpoint.
    Fabric(FabricLink),
}

/// A request in flight on a [`Link`], holding what it borrowed for its
/// flight: the data a fabric server reads from the caller's memory, or a
/// read's destination.
pub(crate) enum Ticket<'a> {
    Socket(conn::Ticket),
    /// A read whose data lands in the destination when the answer comes.
    SocketInto(conn::Ticket, &'a mut [u8]),
    /// A read whose data lands in these parts, one after the other.
    SocketParts(conn::Ticket, Vec<&'a mut [u8]>),
    /// A read whose data the server places in the destination, in the
    /// client's landing area (`FLAG_LAND`).
    SocketLanding(conn::Ticket, &'a mut [u8]),
    Fabric(crate::fabric_link::FabricTicket<'a>),
}

impl Link {
    /// Connects to the server at `addr` over the transport its address
    /// names, and performs the handshake.
    pub fn connect(addr: &str, cfg: &ClientConfig, counts: Arc<Counts>) -> Result<Link> {
        if is_fabric(addr) {
            return FabricLink::connect(addr, cfg, counts).map(Link::Fabric);
        }
        Conn::connect(addr, cfg, counts).map(Link::Socket)
    }

    /// A CPU lane to a local server (sockets only).
    pub fn connect_lane(
        addr: &str,
        cfg: &ClientConfig,
        cpu: u32,
        counts: Arc<Counts>,
    ) -> Result<Link> {
        if is_fabric(addr) {
            return fail(
                libc::EINVAL,
                format!("server {addr}: no CPU lanes over the fabric"),
            );
        }
        Conn::connect_lane(addr, cfg, cpu, counts).map(Link::Socket)
    }

    /// Is this a Unix socket to a server on this host?
    pub fn is_local(&self) -> bool {
        match self {
            Link::Socket(c) => c.is_local(),
            Link::Fabric(_) => false,
        }
    }

    /// Is the link still usable?
    pub fn alive(&self) -> bool {
        match self {
            Link::Socket(c) => c.alive(),
            Link::Fabric(f) => f.alive(),
        }
    }

    /// Usable, as far as can be told without a round trip.
    pub fn usable(&self) -> bool {
        match self {
            Link::Socket(c) => c.usable(),
            Link::Fabric(f) => f.alive(),
        }
    }

    /// How long since the link last sent or received.
    pub fn idle_for(&self) -> Duration {
        match self {
            Link::Socket(c) => c.idle_for(),
            Link::Fabric(f) => f.idle_for(),
        }
    }

    /// Does the server place reads' data in the landing area `area`?
    /// (Local sockets only.)
    pub fn lands_in(&self, area: &crate::shm::Landing) -> bool {
        match self {
            Link::Socket(c) => c.lands_in(area),
            Link::Fabric(_) => false,
        }
    }

    /// Tells a local server about the shared window (sockets only).
    pub fn offer_window(&self, w: &crate::shm::Window) {
        if let Link::Socket(c) = self {
            c.offer_window(w)
        }
    }

    /// Sends a request whose payload is `head` followed by `tail` (which
    /// a fabric server may read from here until the answer is waited for).
    pub fn send_raw<'a>(&self, op: u16, head: &[u8], tail: &'a [u8]) -> Result<Ticket<'a>> {
        match self {
            Link::Socket(c) => c.send_raw(op, head, tail).map(Ticket::Socket),
            Link::Fabric(f) => f.send_raw(op, head, tail).map(Ticket::Fabric),
        }
    }

    /// Sends a read (`head` the request) whose data is to land in `dst`
    /// ([`Link::wait_landed`]); a fabric server may write it there by RMA
    /// while the request is in flight, and a local server that mapped the
    /// landing area `area` writes it there itself when `dst` lies in it.
    /// A read into `area` that fails must not use `dst` again.
    pub fn send_read<'a>(
        &self,
        op: u16,
        head: &[u8],
        dst: &'a mut [u8],
        area: Option<&crate::shm::Landing>,
    ) -> Result<Ticket<'a>> {
        match self {
            Link::Socket(c)
                if area.is_some_and(|a| a.holds(dst.as_ptr(), dst.len()) && c.lands_in(a)) =>
            {
                c.send_landing(op, head, dst)
                    .map(|t| Ticket::SocketLanding(t, dst))
            }
            Link::Socket(c) => c
                .send_raw(op, head, &[])
                .map(|t| Ticket::SocketInto(t, dst)),
            Link::Fabric(f) => f.send_read(op, head, dst).map(Ticket::Fabric),
        }
    }

    /// Sends a read (`head` the request) whose data is to land in
    /// `parts`, one after the other ([`Link::wait_landed`]): the places of
    /// a `ReadSpans`' spans in the caller's buffer. Sockets only, and at
    /// most [`conn::MAX_PARTS`] parts.
    pub fn send_read_parts<'a>(
        &self,
        op: u16,
        head: &[u8],
        parts: Vec<&'a mut [u8]>,
    ) -> Result<Ticket<'a>> {
        match self {
            Link::Socket(_) if parts.len() > conn::MAX_PARTS => fail(
                libc::EINVAL,
                format!(
                    "a read into {} parts (at most {})",
                    parts.len(),
                    conn::MAX_PARTS
                ),
            ),
            Link::Socket(c) => c
                .send_raw(op, head, &[])
                .map(|t| Ticket::SocketParts(t, parts)),
            Link::Fabric(_) => fail(libc::EINVAL, "reads into parts are for sockets only"),
        }
    }

    /// Sends a read whose data the server writes into memory the caller
    /// lent on `on` ([`FabricLink::send_placed`]). Fabric links only.
    pub fn send_read_placed(
        &self,
        op: u16,
        head: &[u8],
        key: chfs_fabric::RemoteKey,
        on: &chfs_fabric::Endpoint,
    ) -> Result<Ticket<'static>> {
        match self {
            Link::Fabric(f) => f.send_placed(op, head, key, on).map(Ticket::Fabric),
            Link::Socket(_) => fail(libc::EINVAL, "placed reads are for fabric links only"),
        }
    }

    /// The endpoint a fabric link lends the caller's memory on
    /// ([`FabricLink::lender`]); None for sockets.
    pub fn lender(&self) -> Option<&std::sync::Arc<chfs_fabric::Endpoint>> {
        match self {
            Link::Fabric(f) => f.lender(),
            Link::Socket(_) => None,
        }
    }

    /// Sends a request.
    pub fn send(&self, req: &Request) -> Result<Ticket<'static>> {
        match self {
            Link::Socket(c) => c.send(req).map(Ticket::Socket),
            Link::Fabric(f) => f.send(req).map(Ticket::Fabric),
        }
    }

    /// Waits for the answer to a ticket of this link.
    pub fn wait(&self, t: Ticket<'_>) -> Result<Response> {
        match (self, t) {
            (Link::Socket(c), Ticket::Socket(t)) => c.wait(t),
            (Link::Socket(c), Ticket::SocketInto(t, _) | Ticket::SocketParts(t, _)) => c.wait(t),
            (Link::Socket(c), Ticket::SocketLanding(t, dst)) => match c.wait_landing(t, dst)? {
                Landing::Reply(r) => Ok(r),
                Landing::Landed(n) => Ok(Response::Data(bytes::Bytes::copy_from_slice(&dst[..n]))),
            },
            (Link::Fabric(f), Ticket::Fabric(t)) => f.wait(t),
            _ => unreachable!("a ticket is waited for on its own link"),
        }
    }

    /// Waits for the answer to a read sent with [`Link::send_read`], its
    /// data into the destination given there when the transport can land
    /// it there.
    pub fn wait_landed(&self, t: Ticket<'_>) -> Result<Landing> {
        match (self, t) {
            (Link::Socket(c), Ticket::SocketInto(t, dst)) => c.wait_into(t, dst),
            (Link::Socket(c), Ticket::SocketParts(t, mut parts)) => {
                c.wait_into_parts(t, &mut parts)
            }
            (Link::Socket(c), Ticket::SocketLanding(t, dst)) => c.wait_landing(t, dst),
            (Link::Socket(c), Ticket::Socket(t)) => c.wait(t).map(Landing::Reply),
            (Link::Fabric(f), Ticket::Fabric(t)) => f.wait_into(t, None),
            _ => unreachable!("a ticket is waited for on its own link"),
        }
    }

    /// Sends a request and waits for its answer.
    pub fn call(&self, req: &Request) -> Result<Response> {
        let t = self.send(req)?;
        self.wait(t)
    }
}
