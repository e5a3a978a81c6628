//! Starts N `chfsd` processes on loopback, joined into one pool, and stops
//! them (by their recorded PIDs) when dropped.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Is capability `cap` required of this machine? `CHFS_TEST_REQUIRE` lists
/// the capabilities the test suite must find (comma separated, or `all`):
/// `root`, `fuse`, `uring` (FUSE over io_uring), `mpi`, `slurm`, `netns`
/// (network namespaces with sshd), `fabric` (libfabric found by pkg-config:
/// crates/chfs-fabric). `scripts/test.sh` sets it to what the machine has, so a test
/// never passes by skipping what it could have run.
pub fn required(cap: &str) -> bool {
    std::env::var("CHFS_TEST_REQUIRE")
        .is_ok_and(|v| v.split(',').map(str::trim).any(|c| c == cap || c == "all"))
}

/// A test that cannot run here because capability `cap` is missing
/// (`why`): fails when the suite requires `cap` ([`required`]), otherwise
/// says it was skipped; the caller then returns.
pub fn skip(cap: &str, test: &str, why: &str) {
    assert!(
        !required(cap),
        "{test}: {why}, but CHFS_TEST_REQUIRE requires {cap:?} on this machine"
    );
    eprintln!("SKIPPED {test}: {why}");
}

/// Options of a local pool.
#[derive(Debug, Clone)]
pub struct PoolOptions {
    /// Number of servers.
    pub servers: usize,
    /// The pool secret (None: an open pool, which serves every process
    /// that reaches it). The servers read it from a file of mode 0600 in
    /// the pool directory ([`LocalPool::secret_file`]); applications get
    /// the client key file ([`LocalPool::client_key_file`]).
    /// [`PoolOptions::with_new_secret`] generates one.
    pub secret: Option<String>,
    /// Extra `chfsd` arguments for every server.
    pub args: Vec<String>,
    /// The `chfsd` binary (default: [`find_chfsd`]).
    pub chfsd: Option<PathBuf>,
    /// Log filter of the servers.
    pub log_level: String,
    /// Storage engine of every server (`mem`, `pmem`, `posix`; default:
    /// `CHFS_TEST_STORE`, else chfsd's default, mem). A persistent engine
    /// gets a store per server under the pool directory (on /dev/shm when
    /// there is one) of `store_size`.
    pub store: Option<String>,
    /// Size of each server's persistent store (chfsd `--size`).
    pub store_size: String,
}

impl Default for PoolOptions {
    fn default() -> Self {
        Self {
            servers: 2,
            secret: None,
            args: Vec::new(),
            chfsd: None,
            log_level: "warn".into(),
            store: None,
            store_size: "256M".into(),
        }
    }
}

impl PoolOptions {
    /// These options with a new random pool secret
    /// (`chfs_proto::handshake::new_secret`).
    pub fn with_new_secret(mut self) -> Self {
        self.secret = Some(chfs_proto::handshake::new_secret());
        self
    }
}

/// The pool secret's file in the pool directory.
const SECRET_FILE: &str = "chfs.secret";

/// The client key's file in the pool directory.
const CLIENT_KEY_FILE: &str = "chfs.client.key";

/// Writes `text` to a new file `path` of mode 0600.
fn write_private(path: &Path, text: &str) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    // A file left by an earlier pool of the same directory name is not
    // reused (its mode may be another).
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(text.as_bytes())
}

/// A running local pool.
pub struct LocalPool {
    children: Vec<Option<Child>>,
    addrs: Vec<String>,
    dir: PathBuf,
    chfsd: PathBuf,
    opts: PoolOptions,
    starts: usize,
}

/// Finds the `chfsd` binary: `$CHFSD`, next to the running executable (or
/// one level up, as for test binaries in `target/*/deps`), then `$PATH`.
pub fn find_chfsd() -> io::Result<PathBuf> {
    if let Some(p) = std::env::var_os("CHFSD") {
        return Ok(PathBuf::from(p));
    }
    if let Ok(exe) = std::env::current_exe() {
        let mut dir = exe.parent().map(Path::to_path_buf);
        for _ in 0..2 {
            if let Some(d) = &dir {
                let c = d.join("chfsd");
                if c.is_file() {
                    return Ok(c);
                }
                dir = d.parent().map(Path::to_path_buf);
            }
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for d in std::env::split_paths(&path) {
            let c = d.join("chfsd");
            if c.is_file() {
                return Ok(c);
            }
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        "chfsd not found (build it, or set CHFSD=/path/to/chfsd)",
    ))
}

/// Resident memory of process `pid` in KiB (`VmRSS`; 0 if it cannot be
/// read).
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

fn wait_file(path: &Path, child: &mut Child, timeout: Duration) -> io::Result<String> {
    let start = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if s.ends_with('\n') {
                return Ok(s.trim().to_string());
            }
        }
        if let Some(status) = child.try_wait()? {
            return Err(io::Error::other(format!(
                "chfsd exited early ({status}); see its log next to {}",
                path.display()
            )));
        }
        if start.elapsed() > timeout {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("chfsd did not start within {timeout:?}"),
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

static SEQ: AtomicU32 = AtomicU32::new(0);

impl LocalPool {
    /// Starts `n` servers with default options.
    pub fn start(n: usize) -> io::Result<Self> {
        Self::start_with(PoolOptions {
            servers: n,
            ..Default::default()
        })
    }

    /// Starts a pool.
    ///
    /// With `store` in the options, or else `CHFS_TEST_STORE=pmem` or
    /// `posix` in the environment (and no `--store` among the extra
    /// arguments), every server gets that persistent engine
    /// with its own store under the pool directory (on /dev/shm when there
    /// is one), so a whole test suite can run against an engine:
    /// `CHFS_TEST_STORE=pmem cargo test -p chfs-client`.
    pub fn start_with(mut opts: PoolOptions) -> io::Result<Self> {
        let chfsd = match &opts.chfsd {
            Some(p) => p.clone(),
            None => find_chfsd()?,
        };
        let test_store = opts
            .store
            .clone()
            .or_else(|| std::env::var("CHFS_TEST_STORE").ok())
            .filter(|s| !s.is_empty() && s != "mem" && !opts.args.iter().any(|a| a == "--store"));
        let base = match &test_store {
            Some(_) if Path::new("/dev/shm").is_dir() => PathBuf::from("/dev/shm"),
            _ => std::env::temp_dir(),
        };
        let dir = base.join(format!(
            "chfs-pool-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)?;
        if let Some(secret) = &opts.secret {
            write_private(&dir.join(SECRET_FILE), &format!("{secret}\n"))?;
            write_private(
                &dir.join(CLIENT_KEY_FILE),
                &chfs_proto::handshake::Credential::client_key_file(secret.as_bytes()),
            )?;
        }
        if let Some(store) = test_store {
            let path = dir.join("store{i}").display().to_string();
            opts.args.extend([
                "--store".to_string(),
                store,
                "--path".to_string(),
                path,
                "--size".to_string(),
                opts.store_size.clone(),
            ]);
        }
        let n = opts.servers.max(1);
        let mut pool = LocalPool {
            children: Vec::new(),
            addrs: Vec::new(),
            dir,
            chfsd,
            opts,
            starts: 0,
        };
        for i in 0..n {
            let join = pool.addrs.first().cloned();
            let (child, addr) = pool.spawn(i, "127.0.0.1:0", join.as_deref())?;
            pool.children.push(Some(child));
            pool.addrs.push(addr);
        }
        Ok(pool)
    }

    /// Starts server `i` on `host`, joining `join`; `{i}` in the extra
    /// arguments becomes the server's index (for per-server store paths).
    fn spawn(&mut self, i: usize, host: &str, join: Option<&str>) -> io::Result<(Child, String)> {
        self.starts += 1;
        let info = self.dir.join(format!("server{i}.{}.addr", self.starts));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("server{i}.log")))?;
        let mut cmd = Command::new(&self.chfsd);
        cmd.args(["--host", host, "-S"])
            .arg(&info)
            .args(["--log-level", &self.opts.log_level]);
        if let Some(seed) = join {
            cmd.args(["--join", seed]);
        }
        cmd.args(
            self.opts
                .args
                .iter()
                .map(|a| a.replace("{i}", &i.to_string())),
        );
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
        cmd.env_remove("CHFS_SECRET").env_remove("CHFS_SECRET_FILE");
        if let Some(f) = self.secret_file() {
            cmd.env("CHFS_SECRET_FILE", f);
        }
        let mut child = cmd.spawn()?;
        match wait_file(&info, &mut child, Duration::from_secs(20)) {
            Ok(addr) => Ok((child, addr)),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
        }
    }

    /// Kills every server at once (SIGKILL) and starts them again on the
    /// same addresses with the same options, in the original order — what a
    /// persistent store must survive.
    pub fn restart_all(&mut self) -> io::Result<()> {
        for i in 0..self.children.len() {
            self.kill(i);
        }
        let addrs = std::mem::take(&mut self.addrs);
        for (i, a) in addrs.iter().enumerate() {
            let join = self.addrs.first().cloned();
            let (child, addr) = self.spawn(i, a, join.as_deref())?;
            self.children[i] = Some(child);
            self.addrs.push(addr);
        }
        Ok(())
    }

    /// Kills server `i` (SIGKILL) and starts it again on the same address
    /// with the same options, joining the first other running server: a
    /// node that rebooted, or an admin's restart. A DRAM server comes back
    /// empty.
    pub fn restart(&mut self, i: usize) -> io::Result<()> {
        self.restart_joining(i, true)
    }

    /// As [`LocalPool::restart`]; with `join` false the server starts a
    /// pool of its own (an admin's `chfsd` without `--join`).
    pub fn restart_joining(&mut self, i: usize, join: bool) -> io::Result<()> {
        self.kill(i);
        let join = (0..self.children.len())
            .find(|&j| join && j != i && self.children[j].is_some())
            .map(|j| self.addrs[j].clone());
        let a = self.addrs[i].clone();
        let (child, addr) = self.spawn(i, &a, join.as_deref())?;
        self.children[i] = Some(child);
        self.addrs[i] = addr;
        Ok(())
    }

    /// Extra `chfsd` arguments of the servers started from now on (by
    /// [`LocalPool::add_server`] and the restarts), in place of those of
    /// the options: a pool of servers that differ (older ones among
    /// newer, say).
    pub fn set_args(&mut self, args: Vec<String>) {
        self.opts.args = args;
    }

    /// Starts one more server joining the pool (as `chfsctl -A` does) and
    /// returns its address.
    pub fn add_server(&mut self) -> io::Result<String> {
        let i = self.children.len();
        let join = self.addrs.first().cloned();
        let (child, addr) = self.spawn(i, "127.0.0.1:0", join.as_deref())?;
        self.children.push(Some(child));
        self.addrs.push(addr.clone());
        Ok(addr)
    }

    /// Server addresses.
    pub fn addrs(&self) -> &[String] {
        &self.addrs
    }

    /// The `CHFS_SERVER` value (every server, comma separated).
    pub fn server_string(&self) -> String {
        self.addrs.join(",")
    }

    /// Directory holding the servers' logs.
    pub fn log_dir(&self) -> &Path {
        &self.dir
    }

    /// The pool secret, if the pool has one.
    pub fn secret(&self) -> Option<&str> {
        self.opts.secret.as_deref()
    }

    /// The file (mode 0600) holding the pool secret, if the pool has one:
    /// the servers' and the administrator's.
    pub fn secret_file(&self) -> Option<PathBuf> {
        self.opts
            .secret
            .as_ref()
            .map(|_| self.dir.join(SECRET_FILE))
    }

    /// The file (mode 0600) holding the pool's client key, if the pool has
    /// a secret: what applications get as `CHFS_SECRET_FILE`.
    pub fn client_key_file(&self) -> Option<PathBuf> {
        self.opts
            .secret
            .as_ref()
            .map(|_| self.dir.join(CLIENT_KEY_FILE))
    }

    /// Process id of server `i`.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.children.get(i)?.as_ref().map(Child::id)
    }

    /// Kills server `i` at once (SIGKILL to its recorded PID).
    pub fn kill(&mut self, i: usize) {
        if let Some(Some(mut c)) = self.children.get_mut(i).map(Option::take) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends a signal to server `i` (e.g. SIGSTOP to simulate a hung node).
    pub fn signal(&self, i: usize, sig: i32) -> io::Result<()> {
        let pid = self
            .pid(i)
            .ok_or_else(|| io::Error::other("no such server"))?;
        // SAFETY: kill(2) with a PID of a child we spawned and still own.
        if unsafe { libc::kill(pid as i32, sig) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Stops every server (SIGTERM, then SIGKILL after 5 s) and removes the
    /// log directory.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        for c in self.children.iter_mut().flatten() {
            // SAFETY: kill(2) on the PID of a child we own and have not reaped.
            unsafe { libc::kill(c.id() as i32, libc::SIGCONT) };
            // SAFETY: as above.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for slot in self.children.iter_mut() {
            if let Some(mut c) = slot.take() {
                loop {
                    match c.try_wait() {
                        Ok(Some(_)) => break,
                        Ok(None) if Instant::now() < deadline => {
                            std::thread::sleep(Duration::from_millis(5))
                        }
                        _ => {
                            let _ = c.kill();
                            let _ = c.wait();
                            break;
                        }
                    }
                }
            }
        }
        if std::env::var_os("CHFS_KEEP_LOGS").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Drop for LocalPool {
    fn drop(&mut self) {
        self.shutdown();
    }
}
