//! The subcommands that were programs of their own (`chfs-demo`,
//! `chfuse-bench`, `chfs-store-bench`, chfs-store's `server_bench` example,
//! `chfs-cache-bench`), run end to end with tiny sizes: each prints its
//! table and leaves nothing behind. Needs `chfsd` built (`cargo build -p
//! chfs-server`); `fuse` also `chfuse` (`cargo build -p chfs-fuse`) and
//! FUSE 3.

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_chfs-bench");

/// Runs `chfs-bench ARGS` with CHFS_SERVER unset; returns (stdout, stderr)
/// after checking that it succeeded.
fn bench(args: &[&str], env: &[(&str, &str)]) -> (String, String) {
    let mut c = Command::new(BIN);
    c.args(args).env_remove("CHFS_SERVER");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "chfs-bench {args:?}:\n{o}\n{e}");
    (o, e)
}

fn empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).unwrap().next().is_none()
}

fn demo(reference: &Path, extra: &[&str]) -> (String, String) {
    let r = reference.to_str().unwrap();
    let mut args = vec!["demo", "-n", "2", "-s", "4", "-f", "50", "--reference", r];
    args.extend(extra);
    // A credential of some other pool: not the demo's.
    let (o, e) = bench(&args, &[("CHFS_SECRET_FILE", "/nonexistent/other.key")]);
    assert!(o.contains("all bytes verified"), "{o}");
    (o, e)
}

/// The demo's pool has a secret by default (the demo connects with the
/// pool's client key, whatever credential the environment holds);
/// `--no-secret` warns.
#[test]
fn the_demo_pool_has_a_secret_unless_told_otherwise() {
    let reference = tempfile::tempdir().unwrap();
    let (out, err) = demo(reference.path(), &[]);
    assert!(
        out.contains("pool secret on") && out.contains("chfs.client.key"),
        "{out}"
    );
    assert!(!err.contains("warning"), "{err}");
    let (out, err) = demo(reference.path(), &["--no-secret"]);
    assert!(!out.contains("pool secret on"), "{out}");
    assert!(
        err.contains("warning") && err.contains("open to every local and remote process"),
        "{err}"
    );
    assert!(empty(reference.path()));
}

/// The demo's table: a line per phase with both sides and the ratio, as
/// scripts/demo.sh prints it.
#[test]
fn the_demo_prints_its_table() {
    let reference = tempfile::tempdir().unwrap();
    let (out, _) = demo(reference.path(), &[]);
    let header = out
        .lines()
        .find(|l| l.starts_with("phase"))
        .unwrap_or_else(|| panic!("no table in\n{out}"));
    assert!(
        header.contains("chfs-rs") && header.contains("ratio"),
        "{header}"
    );
    for phase in [
        "write 1 MiB",
        "read 1 MiB",
        "write 47,008 B",
        "read 47,008 B",
        "create",
        "stat",
        "unlink",
    ] {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{phase} ")))
            .unwrap_or_else(|| panic!("no {phase:?} in\n{out}"));
        assert!(line.trim_end().ends_with('x'), "{line}");
    }
    assert!(
        out.contains("stat of a 4 GiB file with 64 KiB chunks: 1 round trip(s)"),
        "{out}"
    );
}

#[test]
fn store_compares_the_engines_with_mem() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().to_str().unwrap();
    let (out, _) = bench(
        &[
            "store",
            "--mib",
            "2",
            "--chunk",
            "65536",
            "--entries",
            "40",
            "--rounds",
            "1",
            "--shm",
            p,
            "--disk",
            p,
            "--pmem-disk",
        ],
        &[],
    );
    for engine in ["mem ", "pmem (", "posix ("] {
        assert!(
            out.lines().any(|l| l.starts_with(engine)),
            "no {engine:?} in\n{out}"
        );
    }
    assert!(out.contains("mem engine measured in the same run"), "{out}");
    assert!(empty(d.path()));
}

#[test]
fn store_servers_compares_the_engines_through_chfsd() {
    let (out, _) = bench(
        &[
            "store-servers",
            "--mib",
            "4",
            "--files",
            "20",
            "--rounds",
            "1",
        ],
        &[],
    );
    assert!(out.contains("through chfsd"), "{out}");
    for engine in ["mem ", "pmem (", "posix ("] {
        assert!(
            out.lines().any(|l| l.starts_with(engine)),
            "no {engine:?} in\n{out}"
        );
    }
}

#[test]
fn store_rss_reports_the_servers_memory() {
    let d = tempfile::tempdir().unwrap();
    let (out, _) = bench(
        &[
            "store-rss",
            "--gib",
            "0",
            "--dir",
            d.path().to_str().unwrap(),
        ],
        &[],
    );
    assert!(out.contains("chfsd RSS base"), "{out}");
    assert!(empty(d.path()));
}

#[test]
fn cache_times_stage_in_write_back_and_flushing() {
    let d = tempfile::tempdir().unwrap();
    let (out, _) = bench(
        &[
            "cache",
            "--servers",
            "2",
            "--files",
            "2",
            "--file-mib",
            "1",
            "--foreground-mib",
            "8",
            "--dir",
            d.path().to_str().unwrap(),
        ],
        &[],
    );
    for want in [
        "stage-in (backend -> cache)",
        "write-back (chfs_sync after writing)",
        "flushing disabled",
        "idle flushing",
        "flush at once",
    ] {
        assert!(out.contains(want), "no {want:?} in\n{out}");
    }
    assert!(empty(d.path()));
}

#[test]
fn fuse_compares_the_mount_with_the_native_client() {
    if !(Path::new("/dev/fuse").exists() && Command::new("fusermount3").arg("-V").output().is_ok())
    {
        chfs_localpool::skip("fuse", "fuse", "no /dev/fuse or fusermount3");
        return;
    }
    let chfuse = Path::new(BIN).with_file_name("chfuse");
    if !chfuse.is_file() {
        let why = format!("{} not built (cargo build -p chfs-fuse)", chfuse.display());
        chfs_localpool::skip("fuse", "fuse", &why);
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let (out, _) = bench(
        &[
            "fuse",
            "--size-mib",
            "4",
            "--block-kib",
            "256",
            "--files",
            "20",
            "--reference",
            d.path().to_str().unwrap(),
        ],
        &[],
    );
    for want in [
        "(no FUSE)",
        "native client",
        "chfuse mount",
        "mount / native:",
    ] {
        assert!(out.contains(want), "no {want:?} in\n{out}");
    }
    assert!(empty(d.path()));
}

/// Unlike the IO500 phases, which stop cleanly at a signal, the other
/// subcommands keep the default disposition: SIGTERM ends them at once.
#[test]
fn a_signal_ends_the_other_subcommands_at_once() {
    use std::os::unix::process::ExitStatusExt;
    use std::time::{Duration, Instant};
    let d = tempfile::tempdir().unwrap();
    let p = d.path().to_str().unwrap();
    let mut child = Command::new(BIN)
        .args(["store", "--mib", "64", "--rounds", "1000", "--shm", p])
        .args(["--disk", p])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: kill(2) on the PID of our own child, which has not been
    // waited for yet.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            panic!("still running 10 s after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
}

#[test]
fn floor_measures_each_transport_and_a_servers_no_op() {
    let (o, _) = bench(&["floor", "--rounds", "300"], &[]);
    let figure = |line: &str| -> Vec<f64> {
        let l = o
            .lines()
            .find(|l| l.contains(line))
            .unwrap_or_else(|| panic!("no {line:?} in\n{o}"));
        l.split(|c: char| c.is_whitespace() || c == ',')
            .filter_map(|w| w.parse::<f64>().ok())
            .collect()
    };
    let two_cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) > 1;
    for kind in ["Unix socket ", "TCP "] {
        let f = figure(&format!("ping-pong, {kind}"));
        assert_eq!(f.len(), if two_cpus { 2 } else { 1 }, "{o}");
        assert!(f.iter().all(|&us| us > 0.0 && us < 100_000.0), "{o}");
    }
    let rpc = figure("chfsd no-op");
    assert_eq!(rpc.len(), 3, "{o}");
    assert!(rpc.iter().all(|&us| us > 0.0 && us < 100_000.0), "{o}");
}

#[test]
fn scale_counts_what_each_server_serves() {
    let (o, _) = bench(
        &[
            "scale",
            "--servers",
            "4",
            "--clients",
            "8",
            "--files",
            "10",
            "--lookup",
            "direct,auto",
        ],
        &[],
    );
    let (direct, relayed) = o
        .split_once("lookups: auto")
        .unwrap_or_else(|| panic!("no relayed run in\n{o}"));
    // (busiest server, owner of the shared file, all servers)
    let row = |section: &str, name: &str| -> Vec<Option<u64>> {
        let l = section
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in\n{o}"));
        l.split_whitespace()
            .skip(3)
            .take(3)
            .map(|w| w.parse().ok())
            .collect()
    };
    // Direct: each client opens its 4096-byte file (one lookup, which
    // brings the bytes: CHFS_OPEN_DATA), stats and reads it: two
    // requests. The shared file's owner serves all of them; one file each
    // spreads them over the servers.
    assert_eq!(
        row(direct, "storm-shared"),
        [Some(16), Some(16), Some(16)],
        "{o}"
    );
    assert_eq!(row(direct, "open-shared")[1], Some(8), "{o}");
    let distinct = row(direct, "storm-distinct");
    assert_eq!(distinct[2], Some(16), "{o}");
    assert!(distinct[0] < Some(16), "{o}");
    assert_eq!(distinct[1], None, "{o}");
    // Relay groups of 2 (the square root of 4): the owner serves the
    // lookups of its own group's 4 clients and one for the other group.
    let open = row(relayed, "open-shared");
    assert!(open[1].unwrap() <= 8 / 2 + 2, "{o}");
    // 8 x 10 creates, stats and unlinks, and the directories.
    assert!(row(direct, "mdtest-easy")[2] >= Some(240), "{o}");
    let conns = direct
        .lines()
        .find_map(|l| l.strip_prefix("connections per server: "))
        .unwrap_or_else(|| panic!("{o}"));
    let (lo, hi) = conns.split_once('-').unwrap();
    // Every client reached the shared file's owner: at least 8 clients
    // plus the leader there; nobody holds more than every process and the
    // other servers.
    let (lo, hi): (u64, u64) = (lo.parse().unwrap(), hi.parse().unwrap());
    assert!(hi >= 9 && lo <= hi && hi <= 8 + 1 + 3 + 8, "{o}");
}
