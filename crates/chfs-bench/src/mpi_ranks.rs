//! Ranks as MPI processes (cargo feature `mpi`). Under `mpirun`/`srun`
//! every process runs `chfs-bench` with the same arguments: rank 0 leads
//! (setup, find, report) and also works as rank 0; the others serve the
//! leader's messages until it tells them to quit. Messages are the same
//! JSON as with local worker processes, sent point to point.

use std::cell::RefCell;
use std::time::Instant;

use indicatif::ProgressBar;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, Destination, Source};

use crate::error::{BenchError, Result};
use crate::leader::{Launcher, Ranks};
use crate::worker::{FromWorker, Params, RankResult, TargetSpec, ToWorker, Work, WorkerState};

/// Was this process started by an MPI launcher?
pub fn launched_by_mpi() -> bool {
    [
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "PMIX_RANK",
        "MPI_LOCALNRANKS",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some())
}

/// An initialised MPI world (finalised when dropped).
pub struct MpiSession {
    world: SimpleCommunicator,
    me: RefCell<WorkerState>,
    _universe: mpi::environment::Universe,
}

impl MpiSession {
    /// Initialises MPI.
    pub fn init() -> Result<MpiSession> {
        let universe = mpi::initialize()
            .ok_or_else(|| BenchError::Config("MPI is already initialised".into()))?;
        Ok(MpiSession {
            world: universe.world(),
            me: RefCell::new(WorkerState::default()),
            _universe: universe,
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.world.size() as usize
    }

    fn send<T: serde::Serialize>(&self, rank: usize, m: &T) -> Result<()> {
        let bytes = serde_json::to_vec(m)?;
        self.world.process_at_rank(rank as i32).send(&bytes[..]);
        Ok(())
    }

    fn recv<T: serde::de::DeserializeOwned>(&self, rank: usize) -> Result<T> {
        let (bytes, _) = self.world.process_at_rank(rank as i32).receive_vec::<u8>();
        Ok(serde_json::from_slice(&bytes)?)
    }

    /// The loop of ranks other than 0: serve the leader until it says quit.
    pub fn serve(&self) -> Result<()> {
        let mut state = WorkerState::default();
        loop {
            let msg: ToWorker = self.recv(0)?;
            match state.handle(msg, &mut |_| {}) {
                Some(reply) => self.send(0, &reply)?,
                None => return Ok(()),
            }
        }
    }

    /// Rank 0: tells every other rank to exit.
    pub fn quit_all(&self) {
        for r in 1..self.size() {
            let _ = self.send(r, &ToWorker::Quit);
        }
    }

    /// Sends `m(rank)` to every rank (rank 0 handles its own) and collects
    /// the answers in rank order.
    fn round(&self, m: impl Fn(usize) -> ToWorker) -> Result<Vec<FromWorker>> {
        for r in 1..self.size() {
            self.send(r, &m(r))?;
        }
        let mine = self
            .me
            .borrow_mut()
            .handle(m(0), &mut |_| {})
            .ok_or_else(|| BenchError::Config("rank 0 told to quit".into()))?;
        let mut out = vec![mine];
        for r in 1..self.size() {
            out.push(self.recv(r)?);
        }
        Ok(out)
    }
}

/// The ranks of one target in an MPI world.
struct MpiRanks<'s> {
    s: &'s MpiSession,
    id: usize,
}

impl Ranks for MpiRanks<'_> {
    fn run(
        &mut self,
        work: Work,
        counts: &[u64],
        _bar: Option<&ProgressBar>,
    ) -> Result<(Vec<RankResult>, f64)> {
        let t0 = Instant::now();
        let replies = self.s.round(|_| ToWorker::Run {
            id: self.id,
            work,
            counts: counts.to_vec(),
        })?;
        let secs = t0.elapsed().as_secs_f64();
        let mut out = Vec::new();
        for (rank, m) in replies.into_iter().enumerate() {
            match m {
                FromWorker::Done(r) => out.push(r),
                FromWorker::Failed(msg) => return Err(BenchError::Worker { rank, msg }),
                other => {
                    return Err(BenchError::Worker {
                        rank,
                        msg: format!("unexpected {other:?}"),
                    })
                }
            }
        }
        Ok((out, secs))
    }
}

impl Drop for MpiRanks<'_> {
    fn drop(&mut self) {
        let _ = self.s.round(|_| ToWorker::Close { id: self.id });
    }
}

impl Launcher for MpiSession {
    fn launch<'s>(
        &'s self,
        id: usize,
        target: &TargetSpec,
        name: &str,
        params: &Params,
    ) -> Result<Box<dyn Ranks + 's>> {
        let replies = self.round(|rank| ToWorker::Init {
            id,
            rank,
            target: target.clone(),
            name: name.to_string(),
            params: params.clone(),
        })?;
        for (rank, m) in replies.into_iter().enumerate() {
            if let FromWorker::Failed(msg) = m {
                return Err(BenchError::Worker { rank, msg });
            }
        }
        Ok(Box::new(MpiRanks { s: self, id }))
    }
}
