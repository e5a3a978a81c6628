//! The persistent engines behind real `chfsd` processes on loopback:
//! restart on the same path and address, `kill -9` during writes, ENOSPC
//! reaching the client, status reporting. Needs `chfsd` built
//! (`cargo build -p chfs-server`) or `CHFSD` set.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chfs_client::{Client, ClientConfig};

/// A set of chfsd processes with fixed addresses and store paths, which
/// can be killed (SIGKILL to the recorded child) and restarted.
struct Cluster {
    chfsd: PathBuf,
    store: &'static str,
    size: String,
    dir: tempfile::TempDir,
    addrs: Vec<String>,
    children: Vec<Option<Child>>,
    starts: usize,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Cluster {
    fn start(n: usize, store: &'static str, size: &str) -> Cluster {
        let dir = if Path::new("/dev/shm").is_dir() {
            tempfile::tempdir_in("/dev/shm").unwrap()
        } else {
            tempfile::tempdir().unwrap()
        };
        let mut c = Cluster {
            chfsd: chfs_localpool::find_chfsd().expect("chfsd (cargo build -p chfs-server)"),
            store,
            size: size.into(),
            dir,
            addrs: (0..n)
                .map(|_| format!("127.0.0.1:{}", free_port()))
                .collect(),
            children: (0..n).map(|_| None).collect(),
            starts: 0,
        };
        c.restart_all();
        c
    }

    fn store_path(&self, i: usize) -> PathBuf {
        match self.store {
            "pmem" => self.dir.path().join(format!("s{i}.pmem")),
            _ => self.dir.path().join(format!("s{i}")),
        }
    }

    fn spawn(&mut self, i: usize) {
        let join = (i > 0).then(|| self.addrs[0].clone());
        self.spawn_joining(i, join);
    }

    fn spawn_joining(&mut self, i: usize, join: Option<String>) {
        self.starts += 1;
        let info = self.dir.path().join(format!("s{i}-{}.addr", self.starts));
        let log = std::fs::File::create(self.dir.path().join(format!("s{i}-{}.log", self.starts)))
            .unwrap();
        let mut cmd = Command::new(&self.chfsd);
        cmd.args([
            "--host",
            &self.addrs[i],
            "--store",
            self.store,
            "--size",
            &self.size,
        ])
        .arg("--path")
        .arg(self.store_path(i))
        .arg("-S")
        .arg(&info)
        .args(["--log-level", "info"])
        .env_remove("CHFS_SECRET")
        .env_remove("CHFS_SECRET_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
        if let Some(j) = &join {
            cmd.args(["--join", j]);
        }
        let mut child = cmd.spawn().unwrap();
        let t0 = Instant::now();
        while !std::fs::read_to_string(&info).is_ok_and(|s| s.ends_with('\n')) {
            if let Some(st) = child.try_wait().unwrap() {
                let log = std::fs::read_to_string(
                    self.dir.path().join(format!("s{i}-{}.log", self.starts)),
                );
                panic!("chfsd {i} exited: {st}: {log:?}");
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "chfsd {i} did not start"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        self.children[i] = Some(child);
    }

    /// SIGKILL every server (by its recorded child handle) and reap it.
    fn kill_all(&mut self) {
        for c in self.children.iter_mut() {
            if let Some(mut c) = c.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    /// Starts every server again, in the original order (same ring).
    fn restart_all(&mut self) {
        self.kill_all();
        for i in 0..self.addrs.len() {
            self.spawn(i);
        }
    }

    /// SIGKILL server `i` only and start it again (same path, same port),
    /// joining a live member, which still lists it.
    fn restart_one(&mut self, i: usize) {
        if let Some(mut c) = self.children[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let other = self.addrs[if i == 0 { 1 } else { 0 }].clone();
        self.spawn_joining(i, Some(other));
    }

    fn pid(&self, i: usize) -> u32 {
        self.children[i].as_ref().unwrap().id()
    }

    fn client(&self) -> Client {
        let cfg = ClientConfig {
            servers: self.addrs.clone(),
            rpc_timeout: Duration::from_secs(10),
            ..Default::default()
        };
        Client::connect(cfg).unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.kill_all();
    }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn write_file(c: &Client, path: &str, data: &[u8]) -> chfs_client::Result<()> {
    let fd = c.create(path, libc::O_WRONLY | libc::O_TRUNC, 0o644)?;
    let r = (|| {
        let mut off = 0;
        for piece in data.chunks(100_000) {
            c.pwrite(fd, piece, off as u64)?;
            off += piece.len();
        }
        c.fsync(fd)
    })();
    let closed = c.close(fd);
    r.and(closed)
}

fn read_file(c: &Client, path: &str) -> chfs_client::Result<Vec<u8>> {
    let size = c.stat(path)?.size as usize;
    let fd = c.open(path, libc::O_RDONLY, 0)?;
    let mut buf = vec![0u8; size];
    let mut got = 0;
    while got < size {
        let n = c.pread(fd, &mut buf[got..], got as u64)?;
        if n == 0 {
            break;
        }
        got += n;
    }
    c.close(fd)?;
    buf.truncate(got);
    Ok(buf)
}

fn restart_serves_everything(store: &'static str) {
    let mut cl = Cluster::start(2, store, "64M");
    let c = cl.client();
    for (_, st) in c.server_status() {
        assert_eq!(st.unwrap().store, store);
    }
    c.mkdir("/d", 0o755).unwrap();
    let sizes: Vec<usize> = (0..12).map(|i| i * 61_000).collect();
    for (i, n) in sizes.iter().enumerate() {
        write_file(&c, &format!("/d/f{i}"), &pattern(*n, i as u64)).unwrap();
    }
    c.symlink("/d/f3", "/link").unwrap();
    c.chmod("/d/f2", 0o600).unwrap();
    // Overwrite the middle of a file (copy-on-write in the engines).
    let fd = c.open("/d/f5", libc::O_WRONLY, 0).unwrap();
    c.pwrite(fd, &[0xEE; 5000], 100_000).unwrap();
    c.fsync(fd).unwrap();
    c.close(fd).unwrap();
    // sync(2) of the whole pool: every server makes its store durable.
    c.sync().unwrap();
    drop(c);
    for round in 0..2 {
        cl.restart_all(); // SIGKILL, then start again on the same paths and ports
        let c = cl.client();
        let mut names: Vec<String> = c
            .readdir("/d")
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        names.sort();
        let mut want: Vec<String> = (0..12).map(|i| format!("f{i}")).collect();
        want.sort();
        assert_eq!(names, want, "round {round}");
        for (i, n) in sizes.iter().enumerate() {
            let mut p = pattern(*n, i as u64);
            if i == 5 {
                p[100_000..105_000].fill(0xEE);
            }
            let got = read_file(&c, &format!("/d/f{i}")).unwrap();
            assert!(
                got == p,
                "round {round}: /d/f{i} differs ({} vs {} bytes)",
                got.len(),
                p.len()
            );
        }
        assert_eq!(c.readlink("/link").unwrap(), "/d/f3");
        assert_eq!(c.stat("/d/f2").unwrap().mode & 0o777, 0o600);
        assert!(c.stat("/d").unwrap().is_dir());
        // The restarted pool keeps taking writes and removals.
        c.unlink(&format!("/d/f{}", 11 - round)).unwrap();
        write_file(
            &c,
            &format!("/d/f{}", 11 - round),
            &pattern(sizes[11 - round], (11 - round) as u64),
        )
        .unwrap();
    }
}

/// One node of a running pool restarts (the others stay up): it rejoins
/// and serves its chunks again.
fn one_server_restarts(store: &'static str) {
    let mut cl = Cluster::start(3, store, "64M");
    let c = cl.client();
    for i in 0..9 {
        write_file(
            &c,
            &format!("/f{i}"),
            &pattern(150_000 + i * 1000, i as u64),
        )
        .unwrap();
    }
    for victim in [2, 1, 0] {
        cl.restart_one(victim);
        let c = cl.client();
        for i in 0..9 {
            let got = read_file(&c, &format!("/f{i}"))
                .unwrap_or_else(|e| panic!("after restarting server {victim}: /f{i}: {e}"));
            assert!(
                got == pattern(150_000 + i * 1000, i as u64),
                "after restarting server {victim}: /f{i} differs"
            );
        }
        assert_eq!(c.readdir("/").unwrap().len(), 9);
    }
}

#[test]
fn pmem_single_server_restart_rejoins_and_serves_its_chunks() {
    one_server_restarts("pmem");
}

#[test]
fn posix_single_server_restart_rejoins_and_serves_its_chunks() {
    one_server_restarts("posix");
}

#[test]
fn pmem_pool_restarted_on_same_paths_serves_every_file() {
    restart_serves_everything("pmem");
}

#[test]
fn posix_pool_restarted_on_same_paths_serves_every_file() {
    restart_serves_everything("posix");
}

/// Writers create, write and fsync files while every server is killed
/// with SIGKILL; after the restart every acknowledged file is intact and
/// no file returns bytes it was never given.
fn kill9_during_writes(store: &'static str) {
    let mut cl = Cluster::start(2, store, "256M");
    let acked: Arc<Mutex<Vec<(String, usize, u64)>>> = Arc::default();
    let mut attempted: Vec<(String, usize, u64)> = Vec::new();
    for round in 0..3u64 {
        let c = cl.client();
        let _ = c.mkdir("/w", 0o755);
        let writers: Vec<_> = (0..2u64)
            .map(|t| {
                let c = c.clone();
                let acked = acked.clone();
                std::thread::spawn(move || {
                    let mut tried = Vec::new();
                    for i in 0..10_000u64 {
                        let path = format!("/w/r{round}-t{t}-{i}");
                        let seed = round * 1_000_000 + t * 100_000 + i;
                        let len = 1000 + (seed as usize * 7919) % 300_000;
                        tried.push((path.clone(), len, seed));
                        if write_file(&c, &path, &pattern(len, seed)).is_err() {
                            break;
                        }
                        acked.lock().unwrap().push((path, len, seed));
                    }
                    tried
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(250 + 150 * round));
        cl.kill_all();
        for w in writers {
            attempted.extend(w.join().unwrap());
        }
        cl.restart_all();
        let c = cl.client();
        let acked = acked.lock().unwrap().clone();
        assert!(!acked.is_empty(), "no write completed before the kill");
        for (path, len, seed) in &acked {
            let got = read_file(&c, path)
                .unwrap_or_else(|e| panic!("{store} round {round}: {path}: {e}"));
            assert!(
                got == pattern(*len, *seed),
                "{store} round {round}: acknowledged {path} damaged"
            );
        }
        for (path, len, seed) in &attempted {
            match read_file(&c, path) {
                Ok(got) => {
                    let p = pattern(*len, *seed);
                    assert!(got.len() <= p.len());
                    for (k, b) in got.iter().enumerate() {
                        assert!(*b == p[k] || *b == 0, "{path}: byte {k} was never written");
                    }
                }
                Err(e) => assert!(
                    [libc::ENOENT, libc::EIO].contains(&e.errno()),
                    "{path}: unexpected {e}"
                ),
            }
        }
    }
}

#[test]
fn pmem_kill9_during_writes_keeps_fsynced_files() {
    kill9_during_writes("pmem");
}

#[test]
fn posix_kill9_during_writes_keeps_fsynced_files() {
    kill9_during_writes("posix");
}

fn enospc_then_reuse(store: &'static str) {
    let cl = Cluster::start(1, store, "2M");
    let c = cl.client();
    let fd = c.create("/big", libc::O_WRONLY, 0o644).unwrap();
    let block = pattern(65536, 1);
    let mut off = 0u64;
    let err = loop {
        match c.pwrite(fd, &block, off).and_then(|_| c.fsync(fd)) {
            Ok(()) => off += block.len() as u64,
            Err(e) => break e,
        }
        assert!(off < 8 << 20, "no ENOSPC from a 2 MiB store");
    };
    let _ = c.close(fd);
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    assert!(off >= 1 << 20, "only {off} bytes fit");
    // Data written before the error is intact.
    let got = read_file(&c, "/big").unwrap();
    assert!(got.len() as u64 >= off);
    for k in 0..(off / 65536) as usize {
        assert!(got[k * 65536..(k + 1) * 65536] == block[..]);
    }
    // Deleting frees the space for new files, repeatedly (3/4 of what
    // fitted: unaligned writes replace chunks copy-on-write, which needs
    // room for a chunk's new version next to the old one).
    c.unlink("/big").unwrap();
    let n = off as usize * 3 / 4;
    for i in 0..3 {
        let p = format!("/again{i}");
        write_file(&c, &p, &pattern(n, i)).unwrap();
        assert!(read_file(&c, &p).unwrap() == pattern(n, i));
        c.unlink(&p).unwrap();
    }
}

#[test]
fn pmem_enospc_reaches_the_client_and_freed_space_is_reused() {
    enospc_then_reuse("pmem");
}

#[test]
fn posix_enospc_reaches_the_client_and_freed_space_is_reused() {
    enospc_then_reuse("posix");
}

use chfs_localpool::rss_kib;

/// CI-sized variant of the 10 GiB measurement (`chfs-bench store-rss`):
/// 192 MiB pass through a POSIX-engine server in 1 MiB chunks (all written
/// and kept, read back, then removed); its RSS may grow by at most 64 MiB,
/// a third of the data held (the DRAM engine would grow by all of it).
#[test]
fn posix_server_memory_stays_flat_while_data_passes_through() {
    let cl = Cluster::start(1, "posix", "0");
    let c = cl.client();
    c.set_chunk_size(1 << 20).unwrap();
    let block = pattern(4 << 20, 3);
    // Warm up (runtime threads, buffers), then take the baseline.
    write_file(&c, "/warm", &block).unwrap();
    let _ = read_file(&c, "/warm").unwrap();
    let base = rss_kib(cl.pid(0));
    assert!(base > 0, "VmRSS of the server unreadable");
    let mut peak = base;
    for i in 0..6 {
        let fd = c
            .create(&format!("/stream{i}"), libc::O_WRONLY, 0o644)
            .unwrap();
        for k in 0..8u64 {
            c.pwrite(fd, &block, k * block.len() as u64).unwrap();
            peak = peak.max(rss_kib(cl.pid(0)));
        }
        c.fsync(fd).unwrap();
        c.close(fd).unwrap();
    }
    for i in 0..6 {
        let got = read_file(&c, &format!("/stream{i}")).unwrap();
        assert_eq!(got.len(), 32 << 20);
        assert!(got[..block.len()] == block[..]);
        peak = peak.max(rss_kib(cl.pid(0)));
    }
    for i in 0..6 {
        c.unlink(&format!("/stream{i}")).unwrap();
    }
    let grew = peak.saturating_sub(base);
    eprintln!("chfsd RSS: base {base} KiB, peak {peak} KiB, growth {grew} KiB");
    assert!(grew < 64 * 1024, "RSS grew by {grew} KiB");
}
