//! The pool as a whole: its servers, their status and summed capacity
//! (`statfs`), moving chunks to their owners after servers joined
//! (`rebalance`), and stopping the servers.

use chfs_proto::msg::RebalanceState;
use chfs_proto::{Request, Response};

use super::{nonzero, unexpected, Client};
use crate::error::{fail, Result};
use crate::pool::Op;
use crate::types::StatFs;

impl Client {
    /// Number of servers in the pool.
    pub fn server_count(&self) -> usize {
        self.state().ring.len()
    }

    /// Server addresses, in placement order.
    pub fn servers(&self) -> Vec<String> {
        self.state().ring.list().servers.clone()
    }

    /// The index (placement order) of the server owning the entry of
    /// `path`, and the one this client's lookups of it go to (its contact
    /// server; the owner when lookups are not relayed).
    pub fn entry_servers(&self, path: &str) -> Result<(usize, usize)> {
        let st = self.state();
        let p = chfs_proto::path::normalize(path)?;
        let owner = st.owner(&p, 0);
        Ok((owner, st.contact(owner)))
    }

    /// A request that does nothing, answered by server `index` (in
    /// placement order): one round trip through the same path as every
    /// other request (connection, CPU lane, polling), for measuring it.
    pub fn ping(&self, index: usize) -> Result<()> {
        let st = self.state();
        if index >= st.ring.len() {
            return fail(libc::EINVAL, format!("no server {index} in the pool"));
        }
        match self.inner.pool.call(&st, index, &Request::Ping)? {
            Response::Ok => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// `statfs(2)`: capacity and use summed over all servers (the
    /// node-local areas included), with the node-local areas' share and
    /// this node's area apart.
    pub fn statfs(&self) -> Result<StatFs> {
        let st = self.state();
        let mut fs = StatFs {
            servers: st.ring.len() as u32,
            ..Default::default()
        };
        let local = st.local_server();
        for (i, r) in self
            .broadcast(&st, &Request::Status)
            .into_iter()
            .enumerate()
        {
            match r? {
                Response::Status(s) => {
                    fs.total += s.capacity.max(s.bytes);
                    fs.used += s.bytes;
                    fs.entries += s.entries;
                    fs.node_local_entries += s.node_local_entries;
                    fs.node_local_bytes += s.node_local_bytes;
                    if local == Some(i) {
                        fs.this_node = Some((s.node_local_entries, s.node_local_bytes));
                    }
                }
                other => return Err(unexpected(other)),
            }
        }
        fs.free = fs.total - fs.used;
        Ok(fs)
    }

    /// Status of every server (address, engine, use, requests).
    pub fn server_status(&self) -> Vec<(String, Result<chfs_proto::msg::ServerStatus>)> {
        let st = self.state();
        let servers = st.ring.list().servers.clone();
        statuses(
            servers
                .into_iter()
                .zip(self.broadcast(&st, &Request::Status)),
        )
    }

    /// Status of the servers named (addresses of the pool's list), in the
    /// order given, asked all at once: servers that do not answer cost one
    /// RPC timeout in all, not one each. An address not in the pool's list
    /// gets ENOENT.
    pub fn server_status_of(
        &self,
        servers: &[String],
    ) -> Vec<(String, Result<chfs_proto::msg::ServerStatus>)> {
        statuses(self.ask_each(servers, &Request::Status))
    }

    /// Asks the servers named to stop (as [`Client::server_status_of`]:
    /// at once, in the order given); the answer of each.
    pub fn shutdown_servers_of(&self, servers: &[String]) -> Vec<(String, Result<()>)> {
        self.ask_each(servers, &Request::Shutdown)
            .into_iter()
            .map(|(a, r)| (a, r.map(|_| ())))
            .collect()
    }

    /// `req` to each server named, pipelined; the answers in the order
    /// given.
    fn ask_each(&self, servers: &[String], req: &Request) -> Vec<(String, Result<Response>)> {
        let st = self.state();
        let list = &st.ring.list().servers;
        let mut answers: Vec<Option<Result<Response>>> = servers.iter().map(|_| None).collect();
        let mut ops = Vec::new();
        let mut at = Vec::new();
        for (j, a) in servers.iter().enumerate() {
            match list.iter().position(|s| s == a) {
                Some(i) => {
                    ops.push(Op::req(i, req));
                    at.push(j);
                }
                None => {
                    answers[j] = Some(fail(
                        libc::ENOENT,
                        format!("server {a} is not in the pool's list"),
                    ))
                }
            }
        }
        self.count(ops.len());
        for (j, r) in at.into_iter().zip(self.inner.pool.pipeline(&st, ops)) {
            answers[j] = Some(r);
        }
        servers
            .iter()
            .cloned()
            .zip(
                answers
                    .into_iter()
                    .map(|r| r.expect("every server answered or failed")),
            )
            .collect()
    }

    /// Moves every chunk to the server that owns it by the pool's current
    /// list (after servers joined, `chfsctl -A`) and waits until every
    /// server is done. Returns the counts summed over the servers; fails
    /// when chunks could not be moved (they stay where they were, readable
    /// by nobody until a later rebalance succeeds). Run it while no job
    /// does I/O: a chunk in flight is briefly on neither server.
    pub fn rebalance(&self) -> Result<RebalanceState> {
        let old = self.state();
        self.inner.pool.refresh(&old)?;
        let st = self.state();
        let mut pause = std::time::Duration::from_millis(5);
        let mut start = true;
        loop {
            let mut sum = RebalanceState {
                version: st.ring.list().version,
                ..Default::default()
            };
            let mut unreachable = None;
            for r in self.broadcast(&st, &Request::Rebalance { start }) {
                match r {
                    // The others still finish their passes first.
                    Err(e) => unreachable = unreachable.or(Some(e)),
                    Ok(Response::Rebalance(b)) => {
                        sum.running |= b.running;
                        sum.moved += b.moved;
                        sum.kept += b.kept;
                        sum.failed += b.failed;
                        if !b.last_error.is_empty() {
                            sum.last_error = b.last_error;
                            sum.last_errno = b.last_errno;
                        }
                    }
                    Ok(other) => return Err(unexpected(other)),
                }
            }
            if !sum.running {
                if let Some(e) = unreachable {
                    return Err(e);
                }
                if sum.failed > 0 {
                    return fail(
                        nonzero(sum.last_errno),
                        format!(
                            "{} chunks could not be moved to their owners: {}",
                            sum.failed, sum.last_error
                        ),
                    );
                }
                return Ok(sum);
            }
            start = false;
            std::thread::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_millis(200));
        }
    }

    /// Asks every server of the pool to stop.
    pub fn shutdown_servers(&self) -> Result<()> {
        let st = self.state();
        for r in self.broadcast(&st, &Request::Shutdown) {
            r?;
        }
        Ok(())
    }
}

/// Each server's answer to `Status`, as its status.
fn statuses(
    answers: impl IntoIterator<Item = (String, Result<Response>)>,
) -> Vec<(String, Result<chfs_proto::msg::ServerStatus>)> {
    answers
        .into_iter()
        .map(|(a, r)| {
            let r = r.and_then(|r| match r {
                Response::Status(s) => Ok(*s),
                other => Err(unexpected(other)),
            });
            (a, r)
        })
        .collect()
}
