//! `chfsctl`: start, stop, inspect, kill and clean a pool on a job's hosts.
//!
//! Every server `k` on host `H` keeps three files named after it in the
//! scratch directory of its host: `chfsd@H@k.pid` (written by chfsd),
//! `chfsd@H@k.addr` (its address) and, unless `-L` moves it,
//! `chfsd@H@k.log`. Servers are stopped through the pool (a `Shutdown`
//! request) or by these recorded PIDs, never by process name, so other
//! jobs' servers on a shared node are safe.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::ToSocketAddrs;
use std::time::{Duration, Instant};

use chfs_client::{Client, ClientConfig};

use crate::error::CtlError;
use crate::launch::{hold_script, quote, Launcher, LauncherKind};

/// What chfsctl was told (see `chfsctl --help`).
#[derive(Debug, Clone)]
pub struct CtlOptions {
    /// Hosts of the job (a host listed twice gets two servers).
    pub hosts: Vec<String>,
    /// How commands reach the hosts.
    pub launcher: Launcher,
    /// Scratch directory on every host (`-c`).
    pub scratch: String,
    /// Log directory on every host (`-L`; default: the scratch directory).
    pub log_dir: Option<String>,
    /// Backend directory (`-b`): handed to chfsd as `--backend` and to
    /// clients as `CHFS_BACKEND_PATH`.
    pub backend: Option<String>,
    /// `CHFS_SUBDIR_PATH` to hand to servers and clients.
    pub subdir: Option<String>,
    /// Mount directory of chfuse on every host (`-m`).
    pub mount: Option<String>,
    /// Skip mounting/unmounting (`-M`).
    pub no_mount: bool,
    /// Add the servers to the running pool named by `CHFS_SERVER` (`-A`).
    pub add: bool,
    /// Storage engine of the servers (chfsd `--store`); a persistent one
    /// keeps its data at `chfsd@H@k.db` in the scratch directory.
    pub store: Option<String>,
    /// Store size per server (`-s`), chfsd's `-s`. Without it a new pmem
    /// store gets [`DEFAULT_PMEM_SIZE`], the other engines no limit.
    pub db_size: Option<String>,
    /// Flush threads per server (`-f`), chfsd's `--flush-threads`.
    pub flush_threads: Option<u32>,
    /// Variables exported to the servers (`-x`), resolved to values.
    pub exports: Vec<(String, String)>,
    /// Extra chfsd options (`-O`), inserted as shell words.
    pub chfsd_opts: Option<String>,
    /// CPU list the servers are bound to (`-C`), as taskset takes it.
    pub cpus: Option<String>,
    /// Servers per host (`-n`).
    pub per_host: usize,
    /// Start the pool without a secret (`--no-secret`): open to every
    /// process that reaches its servers. By default `start` generates a
    /// pool secret.
    pub no_secret: bool,
    /// Port of the servers (0 = any free port).
    pub port: u16,
    /// Transport of the servers for clients (`-p`): None for our TCP, else
    /// a libfabric protocol name handed to chfsd (`ofi+tcp`, ...); its
    /// servers are then known by their fabric addresses.
    pub protocol: Option<String>,
    /// chfsd binary on the hosts.
    pub chfsd: String,
    /// chfuse binary on the hosts.
    pub chfuse: String,
    /// How long to wait for servers to start or stop.
    pub timeout: Duration,
    /// How long a request to a server may go unanswered
    /// (`CHFS_RPC_TIMEOUT_MSEC`); None: `timeout`.
    pub rpc_timeout: Option<Duration>,
    /// `CHFS_SERVER` of the caller's environment.
    pub env_server: Option<String>,
    /// `CHFS_SECRET_FILE` of the caller's environment.
    pub env_secret_file: Option<String>,
    /// `CHFS_SECRET` of the caller's environment.
    pub env_secret: Option<String>,
}

/// One server as chfsctl identifies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerId {
    /// Host as given in the hostfile.
    pub host: String,
    /// Index of the server on that host.
    pub index: usize,
}

/// A server found through its files on a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Which server.
    pub id: ServerId,
    /// Recorded process id.
    pub pid: u32,
    /// Is that process a live chfsd?
    pub alive: bool,
    /// Recorded address (empty if unknown).
    pub addr: String,
}

const ALIVE_FN: &str = r#"alive() { [ "$(cat /proc/$1/comm 2>/dev/null)" = chfsd ] && ! grep -q '^State:[[:space:]]*Z' /proc/$1/status 2>/dev/null; }"#;

/// chfsd's environment variables that would change which pool a server
/// joins or how it stores: removed from an inherited environment before the
/// server starts (chfsctl passes its own choices as options and `-x`).
const INHERITED_POOL_VARS: &str = "CHFS_SERVER_HOST CHFS_JOIN CHFS_SECRET CHFS_SECRET_FILE CHFS_STORE CHFS_STORE_PATH CHFS_BACKEND_PATH CHFS_SUBDIR_PATH";

/// The name of the pool's secret file in the scratch directory: read by
/// the servers and by chfsctl (the administrator).
pub const SECRET_FILE: &str = "chfs.secret";

/// The name of the client key file in the scratch directory: what `start`
/// hands to applications (`CHFS_SECRET_FILE`) and to chfuse.
pub const CLIENT_KEY_FILE: &str = "chfs.client.key";

/// What `none_found` adds when `CHFS_SERVER` is not set either.
const NO_SERVER_VAR: &str = ", and CHFS_SERVER is not set (give the -c and -h that start was given, or set CHFS_SERVER by evaluating the output of start)";

/// Size of a new pmem store when `-s` is not given: 1 GiB per server, the
/// original chfsctl's `-s db_size` default. A store that exists already
/// keeps the size it was created with.
pub const DEFAULT_PMEM_SIZE: &str = "1G";

/// What `chfsctl start` has set up so far: handed from each of its phases
/// to the next, and what [`CtlOptions::undo_start`] undoes after a failure.
struct Starting {
    /// The pool secret; None for an open pool.
    secret: Option<String>,
    /// Where the servers read it (`SCRATCH/chfs.secret`), if there is one.
    secret_file: Option<String>,
    /// The client key file handed to chfuse and to applications
    /// (`SCRATCH/chfs.client.key`), if there is a secret.
    client_key: Option<String>,
    /// The hosts the secret was put on ("" for this one).
    placed: Vec<String>,
    /// The servers started, each with the address it printed.
    started: Vec<(ServerId, String)>,
}

impl Starting {
    /// The hosts of the servers started, each once, in the order started.
    fn hosts(&self) -> Vec<String> {
        let mut seen = BTreeSet::new();
        self.started
            .iter()
            .map(|(i, _)| i.host.clone())
            .filter(|h| seen.insert(h.clone()))
            .collect()
    }
}

impl CtlOptions {
    fn stem(&self, id: &ServerId) -> String {
        format!("{}/chfsd@{}@{}", self.scratch, id.host, id.index)
    }

    fn log_dir(&self) -> &str {
        self.log_dir.as_deref().unwrap_or(&self.scratch)
    }

    fn unique_hosts(&self) -> Vec<String> {
        let mut seen = BTreeSet::new();
        self.hosts
            .iter()
            .filter(|h| seen.insert(h.as_str()))
            .cloned()
            .collect()
    }

    /// Does the launcher end what it started when its command returns
    /// (srun: the job step's processes are killed with the step)? Then
    /// daemons are started in steps that last as long as the daemon.
    fn holds_daemons(&self) -> bool {
        self.launcher.kind == LauncherKind::Srun
    }

    /// This host's file of the launcher that keeps daemon `name` running
    /// (`chfsd@H@k.srun`, `chfuse@H.srun`), in the scratch directory.
    fn hold_log(&self, name: &str) -> std::path::PathBuf {
        std::path::Path::new(&self.scratch).join(format!("{name}.srun"))
    }

    /// Runs daemon-starting scripts in parallel: `(host, script, pid file,
    /// process name, file stem)`. Each script prints what to report (an
    /// address) and returns once its daemon runs. With a launcher whose
    /// steps end their processes, every daemon gets a step that lasts while
    /// it lives (its launcher's output goes to `stem.srun` in this host's
    /// scratch directory).
    fn run_daemons(
        &self,
        jobs: &[(String, String, String, &str, String)],
    ) -> Vec<Result<String, CtlError>> {
        if !self.holds_daemons() {
            let plain: Vec<_> = jobs
                .iter()
                .map(|(h, script, ..)| (h.clone(), script.clone(), Vec::new()))
                .collect();
            return self.launcher.run_all(&plain);
        }
        if let Err(e) = std::fs::create_dir_all(&self.scratch) {
            return jobs
                .iter()
                .map(|(h, ..)| {
                    Err(CtlError::Host {
                        host: h.clone(),
                        message: format!("cannot create {} on this host: {e}", self.scratch),
                    })
                })
                .collect();
        }
        std::thread::scope(|s| {
            let hs: Vec<_> = jobs
                .iter()
                .map(|(h, script, pf, comm, stem)| {
                    s.spawn(move || {
                        self.launcher.run_held(
                            h,
                            &hold_script(script, pf, comm),
                            &self.hold_log(stem),
                            self.timeout,
                        )
                    })
                })
                .collect();
            hs.into_iter()
                .zip(jobs)
                .map(|(t, (host, ..))| {
                    t.join().unwrap_or_else(|_| {
                        Err(CtlError::Host {
                            host: host.clone(),
                            message: "launcher thread panicked".into(),
                        })
                    })
                })
                .collect()
        })
    }

    /// The server's process and file name stem (`chfsd@H@k`).
    fn name(id: &ServerId) -> String {
        format!("chfsd@{}@{}", id.host, id.index)
    }

    /// Starts the given servers (in parallel), each with `start_script`.
    fn launch_servers(
        &self,
        ids: &[ServerId],
        join: Option<&str>,
        secret_file: Option<&str>,
    ) -> Vec<Result<String, CtlError>> {
        let jobs: Vec<_> = ids
            .iter()
            .map(|id| {
                (
                    id.host.clone(),
                    self.start_script(id, join, secret_file),
                    format!("{}.pid", self.stem(id)),
                    "chfsd",
                    Self::name(id),
                )
            })
            .collect();
        self.run_daemons(&jobs)
    }

    /// The servers `start` creates: `per_host` for every hostfile line.
    pub fn servers(&self) -> Vec<ServerId> {
        let mut out: Vec<ServerId> = Vec::new();
        for h in &self.hosts {
            for _ in 0..self.per_host.max(1) {
                let index = out.iter().filter(|s| s.host == *h).count();
                out.push(ServerId {
                    host: h.clone(),
                    index,
                });
            }
        }
        out
    }

    /// The shell script that starts server `id` as a daemon and prints its
    /// address.
    pub fn start_script(
        &self,
        id: &ServerId,
        join: Option<&str>,
        secret_file: Option<&str>,
    ) -> String {
        let stem = self.stem(id);
        let mut s = String::new();
        let _ = writeln!(s, "{ALIVE_FN}");
        let _ = writeln!(
            s,
            "mkdir -p {} {} || exit 1",
            quote(&self.scratch),
            quote(self.log_dir())
        );
        let _ = writeln!(
            s,
            "if [ -e {pid} ] && p=$(cat {pid}) && alive \"$p\"; then echo \"chfsd already runs with pid $p (recorded in {pid}): stop it first or choose another scratch directory (-c)\" >&2; exit 3; fi",
            pid = quote(&format!("{stem}.pid"))
        );
        // What defines the pool comes from chfsctl's options, never from an
        // environment the launcher passes on (srun and the local launcher
        // hand the caller's whole environment to the script).
        let _ = writeln!(s, "unset {INHERITED_POOL_VARS}");
        let mut cmd = String::from("exec");
        if !self.exports.is_empty() {
            cmd.push_str(" env");
            for (k, v) in &self.exports {
                let _ = write!(cmd, " {}", quote(&format!("{k}={v}")));
            }
        }
        if let Some(c) = &self.cpus {
            let _ = write!(cmd, " taskset -c {}", quote(c));
        }
        let _ = write!(
            cmd,
            " {} --daemon --host {} -S {} -P {} -l {}",
            quote(&self.chfsd),
            quote(&format!("{}:{}", id.host, self.port)),
            quote(&format!("{stem}.addr")),
            quote(&format!("{stem}.pid")),
            quote(&format!(
                "{}/chfsd@{}@{}.log",
                self.log_dir(),
                id.host,
                id.index
            )),
        );
        if let Some(j) = join {
            let _ = write!(cmd, " --join {}", quote(j));
        }
        if let Some(f) = secret_file {
            let _ = write!(cmd, " --secret-file {}", quote(f));
        }
        if let Some(p) = &self.protocol {
            let _ = write!(cmd, " -p {}", quote(p));
        }
        if let Some(st) = self.store.as_deref().filter(|s| *s != "mem") {
            let db = quote(&format!("{stem}.db"));
            let _ = write!(cmd, " --store {} --path {db}", quote(st));
            if st == "pmem" && self.db_size.is_none() {
                // A new store gets the default size; an existing one (a
                // restart on the same scratch directory) keeps its own.
                let _ = writeln!(
                    s,
                    "if [ -s {db} ]; then set --; else set -- -s {DEFAULT_PMEM_SIZE}; fi"
                );
                cmd.push_str(" \"$@\"");
            }
        }
        if let Some(sz) = &self.db_size {
            let _ = write!(cmd, " -s {}", quote(sz));
        }
        if let Some(b) = &self.backend {
            let _ = write!(cmd, " --backend {}", quote(b));
        }
        if let Some(f) = self.flush_threads {
            let _ = write!(cmd, " --flush-threads {f}");
        }
        if let Some(o) = &self.chfsd_opts {
            let _ = write!(cmd, " {o}");
        }
        s.push_str(&cmd);
        s.push('\n');
        s
    }

    /// Script stopping the given servers of one host by recorded PID
    /// (`sig`, then SIGKILL after `grace`) and removing their files.
    fn kill_script(&self, host: &str, index: Option<usize>, sig: &str, grace: Duration) -> String {
        let pat = match index {
            Some(i) => format!("{}/chfsd@{host}@{i}.pid", self.scratch),
            None => format!("{}/chfsd@{host}@*.pid", self.scratch),
        };
        let ticks = (grace.as_millis() / 100).max(1);
        format!(
            r#"{ALIVE_FN}
for f in {pat}; do
  [ -e "$f" ] || continue
  p=$(cat "$f" 2>/dev/null)
  if [ -n "$p" ] && alive "$p"; then
    kill -{sig} "$p"
    n=0; while alive "$p" && [ $n -lt {ticks} ]; do sleep 0.1; n=$((n+1)); done
    if alive "$p"; then echo "pid $p did not stop on SIG{sig}: sent SIGKILL" >&2; kill -KILL "$p"; fi
  fi
  rm -f "$f" "${{f%.pid}}.addr"
done
"#,
            pat = pat_quote(&pat),
        )
    }

    /// Script listing one host's servers: `index pid alive|dead addr`.
    fn list_script(&self, host: &str) -> String {
        format!(
            r#"{ALIVE_FN}
for f in {pat}; do
  [ -e "$f" ] || continue
  p=$(cat "$f" 2>/dev/null); a=$(cat "${{f%.pid}}.addr" 2>/dev/null)
  i=${{f%.pid}}; i=${{i##*@}}
  if [ -n "$p" ] && alive "$p"; then s=alive; else s=dead; fi
  echo "$i ${{p:-0}} $s $a"
done
"#,
            pat = pat_quote(&format!("{}/chfsd@{host}@*.pid", self.scratch)),
        )
    }

    /// Servers recorded on every host (in hostfile order).
    pub fn records(&self) -> Result<Vec<Record>, CtlError> {
        let (out, errs) = self.records_partial();
        one_or_many(errs)?;
        Ok(out)
    }

    /// Servers recorded on the hosts that answered, and one error per host
    /// that did not.
    pub fn records_partial(&self) -> (Vec<Record>, Vec<CtlError>) {
        let hosts = self.unique_hosts();
        let jobs: Vec<_> = hosts
            .iter()
            .map(|h| (h.clone(), self.list_script(h), Vec::new()))
            .collect();
        let mut out = Vec::new();
        let mut errs = Vec::new();
        for (h, r) in hosts.iter().zip(self.launcher.run_all(&jobs)) {
            match r {
                Ok(text) => {
                    for line in text.lines() {
                        let mut w = line.split_whitespace();
                        let (Some(i), Some(p), Some(s)) = (w.next(), w.next(), w.next()) else {
                            continue;
                        };
                        let (Ok(index), Ok(pid)) = (i.parse(), p.parse()) else {
                            continue;
                        };
                        out.push(Record {
                            id: ServerId {
                                host: h.clone(),
                                index,
                            },
                            pid,
                            alive: s == "alive",
                            addr: w.next().unwrap_or("").to_string(),
                        });
                    }
                }
                Err(e) => errs.push(e),
            }
        }
        (out, errs)
    }

    /// `SCRATCH/chfs.secret`.
    fn secret_path(&self) -> String {
        format!("{}/{SECRET_FILE}", self.scratch)
    }

    /// `SCRATCH/chfs.client.key`.
    fn client_key_path(&self) -> String {
        format!("{}/{CLIENT_KEY_FILE}", self.scratch)
    }

    /// The pool secret in the scratch directory (`-c`) of this host, if
    /// there is one.
    fn scratch_secret(&self) -> Result<Option<String>, CtlError> {
        let p = self.secret_path();
        match std::fs::read_to_string(&p) {
            Ok(s) if !s.trim().is_empty() => Ok(Some(s.trim_end().to_string())),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(CtlError::Io {
                context: format!("reading the pool secret {p}"),
                source,
            }),
        }
    }

    /// What chfsctl presents to a running pool (stop, status, rebalance):
    /// the pool secret in the scratch directory (`-c`), with which it acts
    /// as the administrator; without one there, the caller's
    /// `CHFS_SECRET_FILE` / `CHFS_SECRET` (a client key stops nothing).
    fn admin_secret(&self) -> Result<Option<String>, CtlError> {
        match self.scratch_secret()? {
            Some(s) => Ok(Some(s)),
            None => self.caller_secret(),
        }
    }

    /// The secret of the pool `start` creates (a new one unless
    /// `--no-secret`) or grows (`-A`: the running pool's, which the new
    /// servers need to join it); None for an open pool.
    fn pool_secret(&self) -> Result<Option<String>, CtlError> {
        use chfs_proto::handshake::{new_secret, Credential};
        if self.no_secret {
            return Ok(None);
        }
        if !self.add {
            return Ok(Some(new_secret()));
        }
        let found = match self.scratch_secret()? {
            Some(s) => Some(s),
            None => self.caller_secret()?,
        };
        let parsed = found.as_deref().map(|s| Credential::parse(s.as_bytes()));
        match parsed {
            Some(Ok(Credential::Secret(_))) => Ok(found),
            Some(Ok(Credential::ClientKey(_))) => Err(CtlError::Usage(format!(
                "-A: the new servers need the pool secret to join, and CHFS_SECRET_FILE holds a client key (there is no {} on this host): give the -c of the pool's start, or set CHFS_SECRET_FILE to its {SECRET_FILE}",
                self.secret_path()
            ))),
            Some(Err(e)) => Err(CtlError::Usage(format!("-A: the pool secret: {e}"))),
            Some(Ok(Credential::None)) | None => Err(CtlError::Usage(format!(
                "-A: the new servers need the pool secret to join, and there is no {} on this host nor CHFS_SECRET_FILE / CHFS_SECRET: give the -c of the pool's start (or --no-secret for a pool started with --no-secret)",
                self.secret_path()
            ))),
        }
    }

    /// Puts the pool secret and its client key (each mode 0600) in the
    /// scratch directory of every host, and of this one (chfsctl's own
    /// stop, status and rebalance read the secret there); both are sent on
    /// standard input, never on a command line. Without a secret, removes
    /// those an earlier pool left there. A host where a server recorded in
    /// this scratch directory runs is refused (its pool's files stay).
    /// Returns the hosts written to ("" for this one); on failure, what was
    /// written is removed again.
    fn place_secret(&self, secret: Option<&str>) -> Result<Vec<String>, CtlError> {
        let (sp, kp) = (quote(&self.secret_path()), quote(&self.client_key_path()));
        let act = match secret {
            Some(_) => format!(
                r#"IFS= read -r s && IFS= read -r k || {{ echo "no secret on standard input" >&2; exit 1; }}
t=.tmp.$(uname -n).$$
printf '%s\n' "$s" > {sp}$t && printf '%s\n' "$k" > {kp}$t && mv -f {sp}$t {sp} && mv -f {kp}$t {kp}
"#
            ),
            None => format!("rm -f {sp} {kp}\n"),
        };
        let input = secret
            .map(|v| {
                format!(
                    "{v}\n{}",
                    chfs_proto::handshake::Credential::client_key_file(v.as_bytes())
                )
            })
            .unwrap_or_default()
            .into_bytes();
        let script = |guard: Option<&str>| {
            let mut sc = format!("umask 077\nmkdir -p {} || exit 1\n", quote(&self.scratch));
            if let Some(pat) = guard {
                let _ = write!(
                    sc,
                    r#"{ALIVE_FN}
for f in {pat}; do
  [ -e "$f" ] || continue; p=$(cat "$f" 2>/dev/null)
  if [ -n "$p" ] && alive "$p"; then echo "chfsd already runs with pid $p (recorded in $f): stop it first or choose another scratch directory (-c)" >&2; exit 3; fi
done
"#
                );
            }
            sc.push_str(&act);
            sc
        };
        let hosts = self.unique_hosts();
        let jobs: Vec<_> = hosts
            .iter()
            .map(|h| {
                let pat = pat_quote(&format!("{}/chfsd@{h}@*.pid", self.scratch));
                (h.clone(), script(Some(&pat)), input.clone())
            })
            .collect();
        let mut written = Vec::new();
        let mut errs = Vec::new();
        for (h, r) in hosts.iter().zip(self.launcher.run_all(&jobs)) {
            match r {
                Ok(_) => written.push(h.clone()),
                Err(e) => errs.push(e),
            }
        }
        // This host, unless it is one of the hosts. Growing a pool writes
        // the same secret again, whoever runs there, and never removes
        // the pool's (an open pool has none here).
        if errs.is_empty()
            && self.launcher.kind != LauncherKind::Local
            && !(self.add && secret.is_none())
        {
            let local = Launcher {
                kind: LauncherKind::Local,
                ..self.launcher.clone()
            };
            let pat = pat_quote(&format!("{}/chfsd@*.pid", self.scratch));
            let guard = (!self.add).then_some(pat.as_str());
            match local.run("localhost", &script(guard), &input) {
                Ok(_) => written.push(String::new()),
                Err(e) => errs.push(e),
            }
        }
        if !errs.is_empty() {
            if secret.is_some() {
                self.forget_secret(&written);
            }
            one_or_many(errs)?;
        }
        Ok(written)
    }

    fn client(&self, contacts: Vec<String>, secret: Option<&str>) -> Result<Client, CtlError> {
        let mut cfg = ClientConfig::from_lookup(|_| None).map_err(|source| CtlError::Client {
            context: "client configuration".into(),
            source,
        })?;
        cfg.servers = contacts.clone();
        cfg.rpc_timeout = self
            .rpc_timeout
            .unwrap_or_else(|| self.timeout.max(Duration::from_secs(1)));
        if let Some(s) = secret {
            cfg.secret = s.as_bytes().to_vec();
        }
        // With the pool secret chfsctl acts as the administrator (stop,
        // rebalance); with a client key, or none, as a client.
        if matches!(
            chfs_proto::handshake::Credential::parse(&cfg.secret),
            Ok(chfs_proto::handshake::Credential::Secret(_))
        ) {
            cfg.role = chfs_proto::handshake::Role::Admin;
        }
        Client::connect(cfg).map_err(|source| CtlError::Client {
            context: format!("cannot reach the pool through {}", contacts.join(",")),
            source,
        })
    }

    /// The caller's `CHFS_SECRET_FILE` (its content) or `CHFS_SECRET`.
    fn caller_secret(&self) -> Result<Option<String>, CtlError> {
        Ok(match &self.env_secret_file {
            Some(f) => Some(
                std::fs::read_to_string(f)
                    .map_err(|source| CtlError::Io {
                        context: format!("reading CHFS_SECRET_FILE {f}"),
                        source,
                    })?
                    .trim_end()
                    .to_string(),
            ),
            None => self.env_secret.clone(),
        })
    }

    /// Stops the given servers by recorded PID (cleanup after a failed
    /// start).
    fn stop_ids(&self, ids: &[ServerId]) -> Vec<CtlError> {
        let jobs: Vec<_> = ids
            .iter()
            .map(|id| {
                (
                    id.host.clone(),
                    self.kill_script(&id.host, Some(id.index), "TERM", Duration::from_secs(5)),
                    Vec::new(),
                )
            })
            .collect();
        self.launcher
            .run_all(&jobs)
            .into_iter()
            .filter_map(Result::err)
            .collect()
    }

    /// Removes the secret and client key this start put on `hosts` ("":
    /// this host) after a failed start. Those of the pool a start with
    /// `-A` grows stay.
    fn forget_secret(&self, hosts: &[String]) {
        if self.add || hosts.is_empty() {
            return;
        }
        let script = format!(
            "rm -f {} {}",
            quote(&self.secret_path()),
            quote(&self.client_key_path())
        );
        let local = Launcher {
            kind: LauncherKind::Local,
            ..self.launcher.clone()
        };
        let jobs: Vec<_> = hosts
            .iter()
            .filter(|h| !h.is_empty())
            .map(|h| (h.clone(), script.clone(), Vec::new()))
            .collect();
        let _ = self.launcher.run_all(&jobs);
        if hosts.iter().any(String::is_empty) {
            let _ = local.run("localhost", &script, b"");
        }
    }

    fn unmount(&self, hosts: &[String], lazy: bool) -> Vec<CtlError> {
        let Some(m) = self.mount.as_deref().filter(|_| !self.no_mount) else {
            return Vec::new();
        };
        let flag = if lazy { "-uz" } else { "-u" };
        // Unmount, then wait for the recorded chfuse daemon to exit (it
        // flushes on unmount); SIGTERM it by PID if it lingers.
        let jobs: Vec<_> = hosts
            .iter()
            .map(|h| {
                let script = format!(
                    r#"if grep -qs " $(realpath -m {m}) " /proc/self/mounts; then fusermount3 {flag} {m} || exit 1; fi
pf={pf}
if [ -e "$pf" ]; then
  p=$(cat "$pf"); n=0
  while [ -n "$p" ] && [ "$(cat /proc/$p/comm 2>/dev/null)" = chfuse ] && [ $n -lt {ticks} ]; do sleep 0.1; n=$((n+1)); done
  if [ -n "$p" ] && [ "$(cat /proc/$p/comm 2>/dev/null)" = chfuse ]; then kill -TERM "$p"; fi
  rm -f "$pf"
fi
exit 0
"#,
                    m = quote(m),
                    pf = quote(&format!("{}/chfuse@{h}.pid", self.scratch)),
                    ticks = if lazy { 1 } else { 100 },
                );
                (h.clone(), script, Vec::new())
            })
            .collect();
        self.launcher
            .run_all(&jobs)
            .into_iter()
            .filter_map(Result::err)
            .collect()
    }

    /// `chfsctl start`: puts a new pool secret and its client key in the
    /// scratch directory of every host (unless `no_secret`; with `add`, the
    /// running pool's secret), starts the servers with the secret, waits
    /// until all have joined, mounts chfuse (with the client key) if asked,
    /// and returns the shell lines to `eval` (`CHFS_SECRET_FILE` names the
    /// client key). On any failure everything it started is stopped again.
    ///
    /// The phases, in order, each a method: `start_join` (the pool to
    /// join, with `add`), `start_secret` (check the scratch directories'
    /// records, place the secret), `start_servers` (launch), `start_wait`
    /// (until every server is in the pool's list), `start_rebalance`
    /// (`add` only), `start_mount` (chfuse), `start_environment` (the
    /// lines to `eval`); a failure after launching calls `undo_start`.
    pub fn start(&self) -> Result<String, CtlError> {
        let ids = self.servers();
        let join = self.start_join()?;
        let mut st = self.start_secret()?;
        let join_addr = self.start_servers(&ids, join, &mut st)?;
        let list = self.start_wait(&join_addr, &st)?;
        let server_var = list.join(",");
        if self.add {
            self.start_rebalance(list, &st)?;
        }
        self.start_mount(&server_var, &st)?;
        Ok(self.start_environment(&server_var, &st))
    }

    /// Phase 1 of `start`: the address the new servers join. With `add`,
    /// the first server of the running pool named by `CHFS_SERVER` (a
    /// usage error without one); otherwise none (the first server started
    /// founds the pool).
    fn start_join(&self) -> Result<Option<String>, CtlError> {
        if !self.add {
            return Ok(None);
        }
        let env = self.env_server.as_deref().unwrap_or("");
        match chfs_client::config::parse_servers(env).first() {
            Some(a) => Ok(Some(a.clone())),
            None => Err(CtlError::Usage(
                "-A adds servers to a running pool: set CHFS_SERVER (eval the output of chfsctl start)".into(),
            )),
        }
    }

    /// Phase 2 of `start`: the pool's secret ([`pool_secret`](Self::pool_secret):
    /// a new one, the running pool's with `add`, none with `no_secret`),
    /// put with its client key in the scratch directory of every host and
    /// of this one ([`place_secret`](Self::place_secret), which first
    /// checks the scratch directories' records: a host where a recorded
    /// server still runs is refused, and nothing is started).
    fn start_secret(&self) -> Result<Starting, CtlError> {
        let secret = self.pool_secret()?;
        let placed = self.place_secret(secret.as_deref())?;
        Ok(Starting {
            secret_file: secret.as_ref().map(|_| self.secret_path()),
            client_key: secret.as_ref().map(|_| self.client_key_path()),
            secret,
            placed,
            started: Vec::new(),
        })
    }

    /// Phase 3 of `start`: launches the servers `ids` with the secret,
    /// adding each that printed its address to `st.started`. Without
    /// `join`, the first server is launched alone and founds the pool
    /// (if it fails, the secret is removed again and its error returned);
    /// then the others, in parallel, join it (or `join`). Returns the
    /// address joined. If any of the others fails, everything is undone
    /// ([`undo_start`](Self::undo_start)).
    fn start_servers(
        &self,
        ids: &[ServerId],
        join: Option<String>,
        st: &mut Starting,
    ) -> Result<String, CtlError> {
        let sf = st.secret_file.as_deref();
        let mut rest: &[ServerId] = ids;
        let join_addr = match join {
            Some(j) => j,
            None => {
                let first = &ids[0];
                match self
                    .launch_servers(std::slice::from_ref(first), None, sf)
                    .remove(0)
                {
                    Ok(out) => {
                        let a = out.trim().to_string();
                        st.started.push((first.clone(), a.clone()));
                        rest = &ids[1..];
                        a
                    }
                    Err(e) => {
                        self.forget_secret(&st.placed);
                        return Err(e);
                    }
                }
            }
        };
        let mut errs = Vec::new();
        for (id, r) in rest
            .iter()
            .zip(self.launch_servers(rest, Some(&join_addr), sf))
        {
            match r {
                Ok(out) if !out.trim().is_empty() => {
                    st.started.push((id.clone(), out.trim().into()))
                }
                Ok(_) => errs.push(CtlError::Host {
                    host: id.host.clone(),
                    message: format!("server {} printed no address", id.index),
                }),
                Err(e) => errs.push(e),
            }
        }
        if !errs.is_empty() {
            return Err(self.undo_start(errs, st));
        }
        Ok(join_addr)
    }

    /// Phase 4 of `start`: waits (up to `timeout`) until every server
    /// started is in the pool's list, as the server at `join_addr` gives
    /// it, and returns that list. At the deadline, everything is undone,
    /// naming the servers that did not join (or the error of the last
    /// try).
    fn start_wait(&self, join_addr: &str, st: &Starting) -> Result<Vec<String>, CtlError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let r = self
                .client(vec![join_addr.to_string()], st.secret.as_deref())
                .map(|c| c.servers());
            match r {
                Ok(list) if st.started.iter().all(|(_, a)| list.contains(a)) => return Ok(list),
                Ok(list) if Instant::now() >= deadline => {
                    let missing: Vec<_> = st
                        .started
                        .iter()
                        .filter(|(_, a)| !list.contains(a))
                        .map(|(id, a)| CtlError::Host {
                            host: id.host.clone(),
                            message: format!("server {a} did not join the pool"),
                        })
                        .collect();
                    return Err(self.undo_start(missing, st));
                }
                Err(e) if Instant::now() >= deadline => return Err(self.undo_start(vec![e], st)),
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Phase 5 of `start`, with `add` only: moves the files written before
    /// the new servers joined to their new owners. On failure the new
    /// servers stay in the pool (their addresses are in every server's
    /// list now), and the error says to run `chfsctl rebalance`.
    fn start_rebalance(&self, list: Vec<String>, st: &Starting) -> Result<(), CtlError> {
        let server_var = list.join(",");
        self.client(list, st.secret.as_deref())
            .and_then(|c| self.rebalance_with(&c))
            .map(|_| ())
            .map_err(|e| {
                CtlError::Many(vec![
                    e,
                    CtlError::Usage(format!(
                        "the servers were added (CHFS_SERVER={server_var}) but files written before may not be found until `chfsctl rebalance` succeeds"
                    )),
                ])
            })
    }

    /// Phase 6 of `start`, if a mount directory is given and `no_mount` is
    /// not: mounts chfuse on every host of the servers started, each
    /// kept running as a daemon, with the client key (and no credential of
    /// the caller's environment) and `CHFS_SERVER=server_var`. If a mount
    /// fails, the others are unmounted and everything is undone.
    fn start_mount(&self, server_var: &str, st: &Starting) -> Result<(), CtlError> {
        let Some(m) = self.mount.as_deref().filter(|_| !self.no_mount) else {
            return Ok(());
        };
        // chfuse is an application: it gets the client key (and no
        // credential of the caller's environment).
        let mut env = String::from("-u CHFS_SECRET");
        match &st.client_key {
            Some(k) => {
                let _ = write!(env, " CHFS_SECRET_FILE={}", quote(k));
            }
            None => env.push_str(" -u CHFS_SECRET_FILE"),
        }
        let _ = write!(env, " CHFS_SERVER={}", quote(server_var));
        let script = |h: &str| {
            format!(
                "mkdir -p {m} {l} && env {env} {} --pid-file {pf} --log-file {lf} {m}",
                quote(&self.chfuse),
                m = quote(m),
                l = quote(self.log_dir()),
                pf = quote(&format!("{}/chfuse@{h}.pid", self.scratch)),
                lf = quote(&format!("{}/chfuse@{h}.log", self.log_dir())),
            )
        };
        let hosts = st.hosts();
        let jobs: Vec<_> = hosts
            .iter()
            .map(|h| {
                (
                    h.clone(),
                    script(h),
                    format!("{}/chfuse@{h}.pid", self.scratch),
                    "chfuse",
                    format!("chfuse@{h}"),
                )
            })
            .collect();
        let mut mounted = Vec::new();
        let mut errs = Vec::new();
        for (h, r) in hosts.iter().zip(self.run_daemons(&jobs)) {
            match r {
                Ok(_) => mounted.push(h.clone()),
                Err(CtlError::Host { host, message }) => errs.push(CtlError::Host {
                    host,
                    message: format!("cannot mount chfuse on {m}: {message}"),
                }),
                Err(e) => errs.push(e),
            }
        }
        if !errs.is_empty() {
            errs.extend(self.unmount(&mounted, true));
            return Err(self.undo_start(errs, st));
        }
        Ok(())
    }

    /// Phase 7 of `start`: the shell lines to `eval`: `CHFS_SERVER`, the
    /// client key as `CHFS_SECRET_FILE` (or, for an open pool, unsetting
    /// any earlier credential), `CHFS_BACKEND_PATH` and `CHFS_SUBDIR_PATH`
    /// when set.
    fn start_environment(&self, server_var: &str, st: &Starting) -> String {
        let mut out = String::new();
        let line = |out: &mut String, k: &str, v: &str| {
            let _ = writeln!(out, "{k}={}; export {k};", quote(v));
        };
        line(&mut out, "CHFS_SERVER", server_var);
        match &st.client_key {
            // Applications get the client key, never the pool secret.
            Some(k) => line(&mut out, "CHFS_SECRET_FILE", k),
            // No credential of an earlier pool: a client holding one
            // would refuse this pool's servers.
            None => out.push_str("unset CHFS_SECRET_FILE CHFS_SECRET;\n"),
        }
        if let Some(b) = &self.backend {
            line(&mut out, "CHFS_BACKEND_PATH", b);
        }
        if let Some(s) = &self.subdir {
            line(&mut out, "CHFS_SUBDIR_PATH", s);
        }
        out
    }

    /// Undoes a failed `start`: stops the servers it started (by recorded
    /// PID), removes the secret it placed, and returns `errs` (with the
    /// errors of stopping) as one error, saying how many servers were
    /// stopped.
    fn undo_start(&self, errs: Vec<CtlError>, st: &Starting) -> CtlError {
        let ids: Vec<ServerId> = st.started.iter().map(|(i, _)| i.clone()).collect();
        let mut all = errs;
        all.extend(self.stop_ids(&ids));
        self.forget_secret(&st.placed);
        let n = ids.len();
        let mut e = match one_or_many(all) {
            Err(e) => e,
            Ok(()) => CtlError::Usage("start failed".into()),
        };
        if n > 0 {
            e = CtlError::Many(vec![
                e,
                CtlError::Usage(format!(
                    "stopped the {n} server(s) this start had launched; nothing is left running"
                )),
            ]);
        }
        e
    }

    /// `chfsctl rebalance`: moves every chunk of the pool named by
    /// `CHFS_SERVER` to the server that owns it by the pool's current list
    /// (what `-A` does after adding servers); returns a one-line report.
    pub fn rebalance(&self) -> Result<String, CtlError> {
        let Some(env) = self.env_server.as_deref() else {
            return Err(CtlError::Usage(
                "rebalance: set CHFS_SERVER (eval the output of chfsctl start)".into(),
            ));
        };
        let secret = self.admin_secret()?;
        let c = self.client(chfs_client::config::parse_servers(env), secret.as_deref())?;
        self.rebalance_with(&c)
    }

    fn rebalance_with(&self, c: &Client) -> Result<String, CtlError> {
        let r = c.rebalance().map_err(|source| CtlError::Client {
            context: "rebalance".into(),
            source,
        })?;
        Ok(format!(
            "rebalance: {} chunk(s) moved to their owners, {} older copies dropped, {} server(s)\n",
            r.moved,
            r.kept,
            c.servers().len()
        ))
    }

    /// The error of stop, status, kill and clean when there is nothing to
    /// act on: no server recorded in the scratch directory of any host
    /// (`detail` says what else was tried and what to do).
    fn none_found(&self, detail: &str) -> CtlError {
        let hosts = self.unique_hosts();
        let on = match hosts.as_slice() {
            [h] => format!("host {h}"),
            hs => format!("the {} hosts", hs.len()),
        };
        CtlError::NotFound(format!(
            "no server found: none recorded in {} (-c) on {on}{detail}",
            self.scratch
        ))
    }

    /// `chfsctl stop`: in cache mode first waits until every dirty chunk is
    /// in the backend (failing, with mounts and servers left running, if it
    /// cannot be written back), unmounts, asks the pool to stop (a
    /// `Shutdown` request to every server that answered its status
    /// request), waits for every server it asked to exit (a recorded one
    /// by its PID; one known only through `CHFS_SERVER` until its port is
    /// closed), stops the other recorded servers by their PIDs (SIGTERM,
    /// then SIGKILL) and removes the recorded servers' files.
    ///
    /// A recorded server whose recorded PID is not alive (looked at on the
    /// server's own host) has exited: nothing is sent to it, and `note` is
    /// told. A server that does not answer its status request is not asked
    /// to stop (a recorded one is stopped by its PID) and is named in the
    /// error; the others are stopped all the same. Fails with "no server
    /// found" when no server is recorded and none is reachable through
    /// `CHFS_SERVER`.
    pub fn stop(&self, note: &mut dyn FnMut(&str)) -> Result<String, CtlError> {
        let hosts = self.unique_hosts();
        let (recs, mut errs) = self.records_partial();
        if recs.is_empty() && self.env_server.is_none() {
            errs.push(self.none_found(NO_SERVER_VAR));
            return one_or_many(errs).map(|()| String::new());
        }
        // A request to a server that has exited could only wait out the
        // RPC timeout (over ofi+shm the hello to a queue nobody reads
        // does), twice: status, then Shutdown.
        let exited: Vec<&Record> = recs.iter().filter(|r| !r.alive).collect();
        for r in &exited {
            note(&format!(
                "server {} had already exited (its recorded PID is not alive): not contacted",
                who(r)
            ));
        }
        let recorded = |a: &str| recs.iter().find(|r| r.alive && r.addr == a);
        let mut contacts: Vec<String> = recs
            .iter()
            .filter(|r| r.alive && !r.addr.is_empty())
            .map(|r| r.addr.clone())
            .collect();
        if let Some(s) = &self.env_server {
            for a in chfs_client::config::parse_servers(s) {
                if !has_exited(&recs, &a) && !contacts.contains(&a) {
                    contacts.push(a);
                }
            }
        }
        let mut report = String::new();
        let client = if contacts.is_empty() {
            None
        } else {
            let secret = self.admin_secret()?;
            match self.client(contacts, secret.as_deref()) {
                Ok(c) => Some(c),
                Err(e) if recs.is_empty() => {
                    errs.push(self.none_found(&format!(
                        ", and CHFS_SERVER={} cannot be reached ({e})",
                        self.env_server.as_deref().unwrap_or("")
                    )));
                    return one_or_many(errs).map(|()| String::new());
                }
                Err(e) => {
                    let _ = writeln!(report, "{e}; stopping by recorded PID");
                    None
                }
            }
        };
        // Only servers that answer are asked to stop (all at once: those
        // that do not cost one RPC timeout in all). One that does not is
        // named; a recorded one is then stopped by its PID below.
        let mut answering: Vec<String> = Vec::new();
        let mut cached = false;
        if let Some(c) = &client {
            let targets: Vec<String> = c
                .servers()
                .into_iter()
                .filter(|a| !has_exited(&recs, a))
                .collect();
            for (a, r) in c.server_status_of(&targets) {
                match r {
                    Ok(s) => {
                        cached |= !s.backend.is_empty();
                        answering.push(a);
                    }
                    Err(source) => errs.push(CtlError::Client {
                        context: match recorded(&a) {
                            Some(r) => format!(
                                "server {} failed its status request, so it was not asked to stop; stopping it by its recorded PID",
                                who(r)
                            ),
                            None => format!(
                                "server {a} (not recorded in {}) failed its status request, so it was not asked to stop",
                                self.scratch
                            ),
                        },
                        source,
                    }),
                }
            }
        }
        // Cache mode: nothing is unmounted or stopped before every dirty
        // chunk is in the backend; on failure the mounts and the servers
        // stay, so the job's data stays readable and a later stop retries.
        let write_back = |c: &Client, report: &mut String| {
            let t = Instant::now();
            c.wait_flushed("/", None).map_err(|source| CtlError::Client {
                context: "dirty data could not be written back to the backend; the servers keep running (chfsctl kill discards it)".into(),
                source,
            })?;
            let _ = writeln!(report, "dirty data written back in {:?}", t.elapsed());
            Ok::<(), CtlError>(())
        };
        if let Some(c) = client.as_ref().filter(|_| cached) {
            write_back(c, &mut report)?;
        }
        errs.extend(self.unmount(&hosts, false));
        // The recorded servers that took the stop request: waited for
        // below; the other recorded ones are stopped by their PIDs.
        let mut stopping: Vec<String> = Vec::new();
        if let Some(c) = &client {
            // What the mounts flushed when they were unmounted.
            if cached {
                write_back(c, &mut report)?;
            }
            // Servers not recorded here (reached through CHFS_SERVER) are
            // watched through a connection each: it ends when the server
            // exits.
            let unrecorded: Vec<String> = answering
                .iter()
                .filter(|a| recorded(a).is_none())
                .cloned()
                .collect();
            let mut watches: Vec<_> = unrecorded.iter().map(|a| (a, watch(a))).collect();
            let mut refused: Vec<String> = Vec::new();
            let mut first_refusal = None;
            for (a, r) in c.shutdown_servers_of(&answering) {
                match r {
                    Ok(()) => stopping.push(a),
                    Err(e) => {
                        let by_pid = if recorded(&a).is_some() {
                            "; stopping it by its recorded PID"
                        } else {
                            ""
                        };
                        let _ = writeln!(report, "server {a}: stop request failed ({e}){by_pid}");
                        // Without the pool secret (a client key, or none
                        // for this pool) the servers refuse: those not
                        // recorded here keep running, no use waiting for
                        // them.
                        if e.errno() == libc::EPERM && by_pid.is_empty() {
                            refused.push(a);
                            first_refusal.get_or_insert(e);
                        }
                    }
                }
            }
            let _ = writeln!(report, "asked {} server(s) to stop", stopping.len());
            if let Some(e) = first_refusal {
                errs.push(CtlError::Client {
                    context: format!(
                        "{} server(s) not recorded in {} refused to stop (stopping a pool needs its secret: give the -c of start, whose {SECRET_FILE} chfsctl reads, or set CHFS_SECRET_FILE to that file)",
                        refused.len(),
                        self.scratch
                    ),
                    source: e,
                });
            }
            watches.retain(|(a, _)| !refused.contains(a));
            if !watches.is_empty() {
                let t = Instant::now();
                let deadline = t + self.timeout;
                let n = watches.len();
                let left: Vec<&String> = watches
                    .into_iter()
                    .filter(|(a, w)| !gone(a, w.as_ref(), deadline))
                    .map(|(a, _)| a)
                    .collect();
                let _ = writeln!(
                    report,
                    "{} server(s) not recorded in {} exited in {:?}",
                    n - left.len(),
                    self.scratch,
                    t.elapsed()
                );
                for a in left {
                    errs.push(CtlError::NotFound(format!(
                        "server {a} still serves {:?} after the stop request (not recorded in {}: stop it on its host, or chfsctl kill with its -c)",
                        self.timeout, self.scratch
                    )));
                }
            }
        }
        // Wait for the servers asked to stop to exit on their own, then
        // SIGTERM by PID whatever still runs.
        let jobs: Vec<_> = hosts
            .iter()
            .map(|h| {
                let waited: Vec<String> = recs
                    .iter()
                    .filter(|r| r.id.host == *h && r.alive && stopping.contains(&r.addr))
                    .map(|r| quote(&format!("{}.pid", self.stem(&r.id))))
                    .collect();
                let wait = if waited.is_empty() {
                    String::new()
                } else {
                    format!(
                        r#"for f in {list}; do
  [ -e "$f" ] || continue; p=$(cat "$f" 2>/dev/null); n=0
  while [ -n "$p" ] && alive "$p" && [ $n -lt {ticks} ]; do sleep 0.1; n=$((n+1)); done
done
"#,
                        list = waited.join(" "),
                        ticks = (self.timeout.as_millis() / 100).max(1),
                    )
                };
                let script = format!(
                    r#"{ALIVE_FN}
{wait}{kill}for f in {addrs}; do [ -e "$f" ] && [ ! -e "${{f%.addr}}.pid" ] && rm -f "$f"; done
exit 0
"#,
                    addrs = pat_quote(&format!("{}/chfsd@{h}@*.addr", self.scratch)),
                    kill = self.kill_script(h, None, "TERM", Duration::from_secs(5)),
                );
                (h.clone(), script, Vec::new())
            })
            .collect();
        for r in self.launcher.run_all(&jobs) {
            match r {
                Ok(_) => {}
                Err(e) => errs.push(e),
            }
        }
        let _ = writeln!(
            report,
            "stopped {} recorded server(s)",
            recs.iter().filter(|r| r.alive).count()
        );
        one_or_many(errs)?;
        Ok(report)
    }

    /// `chfsctl kill`: unmounts lazily and sends SIGKILL to every recorded
    /// server at once. Fails with "no server found" when none is recorded.
    pub fn kill(&self) -> Result<String, CtlError> {
        let hosts = self.unique_hosts();
        let (recs, mut errs) = self.records_partial();
        errs.extend(self.unmount(&hosts, true));
        if recs.is_empty() {
            errs.push(self.none_found(
                " (kill stops recorded servers only: give the -c and -h that start was given)",
            ));
            return one_or_many(errs).map(|()| String::new());
        }
        let jobs: Vec<_> = hosts
            .iter()
            .map(|h| {
                (
                    h.clone(),
                    self.kill_script(h, None, "KILL", Duration::from_secs(5)),
                    Vec::new(),
                )
            })
            .collect();
        errs.extend(
            self.launcher
                .run_all(&jobs)
                .into_iter()
                .filter_map(Result::err),
        );
        one_or_many(errs)?;
        Ok(String::new())
    }

    /// `chfsctl status`: one line per server with its state and use.
    /// Returns the table and whether every server answered.
    pub fn status(&self, counters: bool) -> Result<(String, bool), CtlError> {
        let (recs, host_errs) = self.records_partial();
        let mut addrs: Vec<String> = Vec::new();
        if let Some(s) = &self.env_server {
            addrs.extend(chfs_client::config::parse_servers(s));
        }
        for r in &recs {
            if !r.addr.is_empty() && !addrs.contains(&r.addr) {
                addrs.push(r.addr.clone());
            }
        }
        let mut out = String::new();
        if addrs.is_empty() {
            one_or_many(host_errs)?;
            return Err(self.none_found(NO_SERVER_VAR));
        }
        let secret = self.admin_secret()?;
        let mut answered: Vec<(String, Result<chfs_proto::msg::ServerStatus, String>)> = Vec::new();
        let live: Vec<String> = addrs
            .iter()
            .filter(|a| !has_exited(&recs, a))
            .cloned()
            .collect();
        match self.client(live.clone(), secret.as_deref()) {
            Ok(c) => {
                // Every server of the pool's list but the recorded ones
                // whose PID is not alive: a request to one could only
                // wait out the RPC timeout (over ofi+shm, a hello to a
                // killed server's queue does); they are "not running".
                let ask: Vec<String> = c
                    .servers()
                    .into_iter()
                    .filter(|a| !has_exited(&recs, a))
                    .collect();
                for (a, r) in c.server_status_of(&ask) {
                    answered.push((a, r.map_err(|e| e.to_string())));
                }
            }
            Err(e) => {
                let _ = writeln!(out, "# {e}");
                for a in &live {
                    answered.push((a.clone(), Err("unreachable".into())));
                }
            }
        }
        for a in &addrs {
            if !answered.iter().any(|(x, _)| x == a) {
                answered.push((a.clone(), Err("not running".into())));
            }
        }
        let mut all_ok = host_errs.is_empty();
        for e in &host_errs {
            let _ = writeln!(out, "# {e}");
        }
        let mut rows: Vec<StatusRow> = Vec::new();
        for (a, r) in &answered {
            let rec = recs.iter().find(|r| r.addr == *a);
            let mut row = StatusRow {
                server: a.clone(),
                state: "up",
                pid: rec.map_or("-".to_string(), |r| r.pid.to_string()),
                host: rec.map_or("-".to_string(), |r| format!("{}#{}", r.id.host, r.id.index)),
                ..StatusRow::default()
            };
            match r {
                Ok(s) => {
                    row.numbers = [
                        s.entries.to_string(),
                        s.bytes.to_string(),
                        s.capacity.to_string(),
                        if s.backend.is_empty() {
                            "-".to_string()
                        } else {
                            s.flush.bytes.to_string()
                        },
                        s.requests.to_string(),
                        s.lost.to_string(),
                    ];
                    if s.since > 0 {
                        row.note = format!(
                            "started with an empty store, replacing a lost one (list version {})",
                            s.since
                        );
                    }
                }
                Err(e) => {
                    all_ok = false;
                    row.state = "DOWN";
                    row.note = e.clone();
                }
            }
            rows.push(row);
        }
        out.push_str(&render_status(&rows));
        if counters {
            for (a, r) in &answered {
                if let Ok(s) = r {
                    let _ = writeln!(
                        out,
                        "{a}: requests={} forwarded={} reads={} writes={} cma_writes={} shm_writes={} shm_reads={} lost={} refused={} denied={} over_limit={} idle_closed={} throttled={} poll_hits={} poll_misses={} cpu_ms={} rss_mib={} heap_free_mib={} heap_trims={} connections={} peers={} lookups={} lookup_hits={} lookup_forwards={} node_local_entries={} node_local_bytes={} fabric_sessions={} fabric_expired={} rma_pulls={} rma_pushes={} reg_fallbacks={} fabric_peers={} fabric_no_session={} fabric_no_session_dropped={} fabric_replies_dropped={} fabric_lent_pulls={} fabric_rma_most={} fabric_hellos_dropped={}",
                        s.requests, s.forwarded, s.reads, s.writes, s.cma_writes, s.shm_writes, s.shm_reads,
                        s.lost, s.refused, s.denied, s.over_limit, s.idle_closed, s.throttled, s.poll_hits, s.poll_misses, s.cpu_ns / 1_000_000, s.rss >> 20, s.heap_free >> 20, s.heap_trims, s.connections, s.peers,
                        s.lookups, s.lookup_hits, s.lookup_forwards, s.node_local_entries, s.node_local_bytes,
                        s.fabric_sessions, s.fabric_expired, s.rma_pulls, s.rma_pushes, s.reg_fallbacks,
                        s.fabric_peers, s.fabric_no_session, s.fabric_no_session_dropped,
                        s.fabric_replies_dropped, s.fabric_lent_pulls, s.fabric_rma_most,
                        s.fabric_hellos_dropped
                    );
                }
            }
        }
        Ok((out, all_ok))
    }

    /// `chfsctl clean`: removes the servers' files, the pool secret and the
    /// client key from the scratch directory of every host (refused while a server runs there).
    /// Fails with "no server found" when there was nothing of chfsctl's to
    /// remove on any host.
    pub fn clean(&self) -> Result<String, CtlError> {
        let hosts = self.unique_hosts();
        let mut removed = 0usize;
        if self.holds_daemons() {
            // The launchers' output files on this host.
            let ours = |n: &str| {
                n.strip_suffix(".srun").is_some_and(|stem| {
                    hosts.iter().any(|h| {
                        stem == format!("chfuse@{h}")
                            || stem
                                .strip_prefix(&format!("chfsd@{h}@"))
                                .is_some_and(|k| k.parse::<usize>().is_ok())
                    })
                })
            };
            if let Ok(rd) = std::fs::read_dir(&self.scratch) {
                for e in rd.flatten() {
                    if ours(&e.file_name().to_string_lossy())
                        && std::fs::remove_file(e.path()).is_ok()
                    {
                        removed += 1;
                    }
                }
            }
        }
        // Each host prints how many of chfsctl's files it removed (the
        // scratch directory itself counts once it is empty: after a stop
        // with the logs elsewhere, -L, nothing else may be left).
        let jobs: Vec<_> = hosts
            .iter()
            .map(|h| {
                let script = format!(
                    r#"{ALIVE_FN}
for f in {pat}; do
  [ -e "$f" ] || continue; p=$(cat "$f" 2>/dev/null)
  if [ -n "$p" ] && alive "$p"; then echo "chfsd (pid $p, $f) still runs: stop it first" >&2; exit 4; fi
done
n=0
for f in {all} {secret} {key} {fuse}; do [ -e "$f" ] && n=$((n+1)); done
rm -rf {all}
rm -f {secret} {key} {fuse}
rmdir {scratch} 2>/dev/null && n=$((n+1))
echo "$n"
exit 0
"#,
                    pat = pat_quote(&format!("{}/chfsd@{h}@*.pid", self.scratch)),
                    all = pat_quote(&format!("{}/chfsd@{h}@*", self.scratch)),
                    secret = quote(&self.secret_path()),
                    key = quote(&self.client_key_path()),
                    fuse = pat_quote(&format!("{}/chfuse@{h}.*", self.scratch)),
                    scratch = quote(&self.scratch),
                );
                (h.clone(), script, Vec::new())
            })
            .collect();
        let mut errs = Vec::new();
        for r in self.launcher.run_all(&jobs) {
            match r {
                Ok(out) => removed += out.trim().parse::<usize>().unwrap_or(0),
                Err(e) => errs.push(e),
            }
        }
        one_or_many(errs)?;
        if self.holds_daemons() {
            // This host's scratch directory, if only the launchers' files
            // were there.
            let _ = std::fs::remove_dir(&self.scratch);
        }
        if removed == 0 {
            return Err(self.none_found(
                " (no file of chfsctl's there to remove: give the -c and -h that start was given)",
            ));
        }
        Ok(format!("removed {removed} file(s)\n"))
    }
}

/// Is `addr` a recorded server whose recorded PID is not alive (and no
/// live record names it)? Nothing is sent to such a server: a request
/// could only wait out the RPC timeout.
fn has_exited(recs: &[Record], addr: &str) -> bool {
    let mut named = recs.iter().filter(|r| !r.addr.is_empty() && r.addr == addr);
    named.clone().next().is_some() && named.all(|r| !r.alive)
}

/// A recorded server as stop names it: `ADDR (host HOST#k, pid P)`.
fn who(r: &Record) -> String {
    let addr = if r.addr.is_empty() {
        "(no address recorded)"
    } else {
        &r.addr
    };
    format!("{addr} (host {}#{}, pid {})", r.id.host, r.id.index, r.pid)
}

/// Quotes a path whose last component holds a `*` glob: the directory is
/// quoted, the pattern part is left to the shell.
fn pat_quote(p: &str) -> String {
    match p.rsplit_once('/') {
        Some((d, f)) => {
            let (pre, post) = f.split_once('*').unwrap_or((f, ""));
            let star = if f.contains('*') { "*" } else { "" };
            format!(
                "{}/{}{star}{}",
                quote(d),
                quote(pre),
                if post.is_empty() {
                    String::new()
                } else {
                    quote(post)
                }
            )
        }
        None => quote(p),
    }
}

/// One line of `chfsctl status`.
#[derive(Debug, Default)]
struct StatusRow {
    server: String,
    state: &'static str,
    /// Entries, bytes, capacity, dirty bytes, requests, lost ("-" when
    /// unknown).
    numbers: [String; 6],
    pid: String,
    host: String,
    /// Why a server is down.
    note: String,
}

/// The status table: a header and one aligned line per server; a down
/// server has `-` in the columns it could not report and the reason after
/// its host.
fn render_status(rows: &[StatusRow]) -> String {
    let sw = rows
        .iter()
        .map(|r| r.server.len())
        .max()
        .unwrap_or(0)
        .max(24);
    let hw = rows.iter().map(|r| r.host.len()).max().unwrap_or(0).max(4);
    let line = |server: &str, state: &str, n: [&str; 6], pid: &str, host: &str, note: &str| {
        let l = format!(
            "{server:<sw$} {state:<5} {:>10} {:>14} {:>14} {:>12} {:>10} {:>6} {pid:>7}  {host:<hw$}  {note}",
            n[0], n[1], n[2], n[3], n[4], n[5]
        );
        format!("{}\n", l.trim_end())
    };
    let mut out = line(
        "SERVER",
        "STATE",
        [
            "ENTRIES",
            "BYTES",
            "CAPACITY",
            "DIRTY_BYTES",
            "REQUESTS",
            "LOST",
        ],
        "PID",
        "HOST",
        "",
    );
    for r in rows {
        let n = r
            .numbers
            .each_ref()
            .map(|s| if s.is_empty() { "-" } else { s.as_str() });
        out.push_str(&line(&r.server, r.state, n, &r.pid, &r.host, &r.note));
    }
    out
}

/// A connection to the server at `addr`, opened before it is asked to
/// stop: it ends (EOF or reset) when the server's process goes.
fn watch(addr: &str) -> Option<std::net::TcpStream> {
    let sa = stream_addr(addr).to_socket_addrs().ok()?.next()?;
    let s = std::net::TcpStream::connect_timeout(&sa, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_millis(100))).ok()?;
    Some(s)
}

/// Where a server listens on a stream socket: its address, or for a
/// fabric address whose provider listens on TCP (`ofi+tcp://IP:PORT`,
/// `ofi+sockets://...`) that socket's IP:PORT.
fn stream_addr(addr: &str) -> String {
    match addr.parse::<chfs_fabric::Address>() {
        Ok(a) => a
            .socket_addr()
            .map_or_else(String::new, |sa| sa.to_string()),
        Err(_) => addr.to_string(),
    }
}

/// Waits until the server at `addr` has exited: the connection `w` opened
/// before the stop request is closed and new connections are refused.
/// False if it still serves at `deadline`.
fn gone(addr: &str, w: Option<&std::net::TcpStream>, deadline: Instant) -> bool {
    use std::io::Read;
    let mut buf = [0u8; 512];
    if let Some(mut w) = w {
        loop {
            match w.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break,
            }
            if Instant::now() >= deadline {
                return false;
            }
        }
    }
    loop {
        let serving = stream_addr(addr).to_socket_addrs().is_ok_and(|mut it| {
            it.any(|sa| {
                std::net::TcpStream::connect_timeout(&sa, Duration::from_millis(500)).is_ok()
            })
        });
        if !serving {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn one_or_many(mut errs: Vec<CtlError>) -> Result<(), CtlError> {
    match errs.len() {
        0 => Ok(()),
        1 => Err(errs.remove(0)),
        _ => Err(CtlError::Many(errs)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_stay_globs() {
        assert_eq!(
            pat_quote("/tmp/a b/chfsd@h@*.pid"),
            "'/tmp/a b'/chfsd@h@*.pid"
        );
        assert_eq!(pat_quote("/tmp/x/chfsd@h@*"), "/tmp/x/chfsd@h@*");
        assert_eq!(pat_quote("/tmp/x/chfsd@h@3.pid"), "/tmp/x/chfsd@h@3.pid");
    }
}
