//! CPU lanes: one thread per CPU, pinned there, serving the local
//! connections whose client thread runs on that CPU and stays there
//! ([`chfs_proto::Request::Lane`]; chfuse's ring threads are pinned).
//!
//! With a CPU idle, the scheduler wakes a server worker there rather than
//! on the busy CPU of the client that woke it, and the reply wakes the
//! client back across CPUs: two cross-CPU wake-ups per request, which on
//! a VM cost more than the request's work (a create through chfuse took
//! ~107 us that way against 25-43 us when all of it ran on one CPU). A
//! lane's thread is pinned to its CPU, so a client pinned there too hands
//! its request over, and gets its reply, on one CPU; and a chunk the
//! client just wrote is copied from that CPU's cache. Connections without
//! a lane are served by the shared multi-thread runtime as before.
//!
//! A lane runs a current-thread tokio runtime: its connections' requests
//! are served one at a time, interleaved at their await points.

use std::collections::HashMap;
use std::io;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::state::Shared;

/// A local connection handed to a lane after its handshake.
pub(crate) struct Incoming {
    pub stream: UnixStream,
    pub peer: String,
    pub cma: Option<libc::pid_t>,
    pub access: crate::connection::Access,
    /// Counts the connection against its user's limit while it lives.
    pub _peer_guard: Option<crate::limits::PeerGuard>,
}

/// The lanes started so far, by CPU.
#[derive(Default)]
pub(crate) struct Lanes {
    lanes: Mutex<HashMap<u32, mpsc::UnboundedSender<Incoming>>>,
}

/// CPUs a lane may be asked for: those configured on this machine.
pub(crate) fn cpus() -> u32 {
    chfs_sys::cpu::configured() as u32
}

/// A running lane, to hand connections to.
pub(crate) struct Lane {
    cpu: u32,
    tx: mpsc::UnboundedSender<Incoming>,
}

impl Lanes {
    /// The lane of `cpu` (< [`cpus`]), started on first use.
    pub fn get(&self, sh: &Arc<Shared>, cpu: u32) -> io::Result<Lane> {
        let mut g = chfs_sys::lock(&self.lanes);
        let tx = match g.get(&cpu) {
            Some(tx) if !tx.is_closed() => tx.clone(),
            _ => {
                let tx = start(sh.clone(), cpu)?;
                g.insert(cpu, tx.clone());
                tx
            }
        };
        Ok(Lane { cpu, tx })
    }
}

impl Lane {
    /// Serves `inc` on this lane.
    pub fn hand_over(&self, inc: Incoming) -> io::Result<()> {
        let cpu = self.cpu;
        self.tx
            .send(inc)
            .map_err(|_| io::Error::other(format!("the lane of CPU {cpu} stopped")))
    }
}

fn pin(cpu: u32) {
    if chfs_sys::cpu::pin_current_thread(cpu as usize).is_err() {
        debug!(
            cpu,
            "cannot pin a lane (CPU offline or not ours): it runs unpinned"
        );
    }
}

/// Starts the lane of `cpu`; it ends when the server stops.
fn start(sh: Arc<Shared>, cpu: u32) -> io::Result<mpsc::UnboundedSender<Incoming>> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Incoming>();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name(format!("chfsd-lane{cpu}"))
        .spawn(move || {
            pin(cpu);
            let mut stop = sh.shutdown.subscribe();
            rt.block_on(async move {
                loop {
                    tokio::select! {
                        inc = rx.recv() => match inc {
                            Some(inc) => {
                                tokio::spawn(serve(sh.clone(), inc));
                            }
                            None => break,
                        },
                        _ = stop.wait_for(|s| *s) => break,
                    }
                }
            });
            // Dropping the runtime closes the lane's connections.
        })?;
    debug!(cpu, "lane started");
    Ok(tx)
}

async fn serve(sh: Arc<Shared>, inc: Incoming) {
    let fd = crate::connection::dup_fd(&inc.stream);
    match crate::local_io::split_std(inc.stream) {
        Ok((rd, wr)) => {
            crate::connection::serve_conn(sh, rd, wr, inc.peer, inc.cma, None, inc.access, fd).await
        }
        Err(e) => warn!(peer = %inc.peer, "closing connection: {e}"),
    }
}
