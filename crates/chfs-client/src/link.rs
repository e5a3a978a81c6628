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

/// A request in flight on a [`Link`].
pub(crate) enum Ticket {
    Socket(conn::Ticket),
    Fabric(crate::fabric_link::FabricTicket),
}

impl Link {
    /// Connects to the server at `addr` over the transport its address
    /// names, and performs the handshake.
    pub fn connect(addr: &str, cfg: &ClientConfig, counts: Arc<Counts>) -> Result<Link> {
        if is_fabric(addr) {
            return FabricLink::connect(addr, cfg).map(Link::Fabric);
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

    /// Tells a local server about the shared window (sockets only).
    pub fn offer_window(&self, w: &crate::shm::Window) {
        if let Link::Socket(c) = self {
            c.offer_window(w)
        }
    }

    /// Sends a request whose payload is `head` followed by `tail`.
    pub fn send_raw(&self, op: u16, head: &[u8], tail: &[u8]) -> Result<Ticket> {
        match self {
            Link::Socket(c) => c.send_raw(op, head, tail).map(Ticket::Socket),
            Link::Fabric(f) => f.send_raw(op, head, tail).map(Ticket::Fabric),
        }
    }

    /// Sends a request.
    pub fn send(&self, req: &Request) -> Result<Ticket> {
        match self {
            Link::Socket(c) => c.send(req).map(Ticket::Socket),
            Link::Fabric(f) => f.send(req).map(Ticket::Fabric),
        }
    }

    /// Waits for the answer to a ticket of this link.
    pub fn wait(&self, t: Ticket) -> Result<Response> {
        match (self, t) {
            (Link::Socket(c), Ticket::Socket(t)) => c.wait(t),
            (Link::Fabric(f), Ticket::Fabric(t)) => f.wait(t),
            _ => unreachable!("a ticket is waited for on its own link"),
        }
    }

    /// Waits for the answer to a read's ticket, its data into `dst` when
    /// the transport can land it there.
    pub fn wait_into(&self, t: Ticket, dst: &mut [u8]) -> Result<Landing> {
        match (self, t) {
            (Link::Socket(c), Ticket::Socket(t)) => c.wait_into(t, dst),
            (Link::Fabric(f), Ticket::Fabric(t)) => f.wait_into(t, Some(dst)),
            _ => unreachable!("a ticket is waited for on its own link"),
        }
    }

    /// Sends a request and waits for its answer.
    pub fn call(&self, req: &Request) -> Result<Response> {
        let t = self.send(req)?;
        self.wait(t)
    }
}
