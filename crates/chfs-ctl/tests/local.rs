//! chfsctl and the ch* tools on this host: real chfsd daemons started,
//! used, inspected, stopped and cleaned through the binaries users run.

mod common;

use std::time::Duration;

use chfs_client::{Client, ClientConfig};
use common::*;

fn client(env: &[(String, String)], secret: bool) -> chfs_client::Result<Client> {
    let mut cfg = ClientConfig::from_lookup(|k| {
        if k == "CHFS_SECRET_FILE" && !secret {
            return None;
        }
        var(env, k).map(String::from)
    })?;
    cfg.rpc_timeout = Duration::from_secs(10);
    Client::connect(cfg)
}

fn envs(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

#[test]
fn start_use_status_stop_clean() {
    start_use_status_stop_clean_over(None);
}

/// The same over libfabric's tcp provider: `chfsctl -p ofi+tcp start`
/// hands out `ofi+tcp://` addresses, and the client, the tools, status
/// and stop work through them.
#[test]
fn start_use_status_stop_clean_over_ofi_tcp() {
    if !chfs_fabric::BUILT_WITH_LIBFABRIC {
        chfs_localpool::skip(
            "fabric",
            "start_use_status_stop_clean_over_ofi_tcp",
            "built without libfabric",
        );
        return;
    }
    start_use_status_stop_clean_over(Some("ofi+tcp"));
}

fn start_use_status_stop_clean_over(protocol: Option<&str>) {
    let sc = Scratch::new();
    let s = sc.s();
    let chfsd = chfsd();
    let chfsd = chfsd.to_str().unwrap();
    let ctl = bin("chfsctl");
    let mut base = vec!["-c", &s, "--chfsd", chfsd];
    if let Some(p) = protocol {
        base.extend(["-p", p]);
    }
    let args = |extra: &[&'static str]| {
        let mut v: Vec<&str> = base.clone();
        v.extend_from_slice(extra);
        v
    };

    // A secret is the default (no --secret).
    let out = run(&ctl, &args(&["-n", "3", "-C", "0", "start"]), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let env = eval_env(&text(&out.stdout));
    let servers = var(&env, "CHFS_SERVER")
        .expect("CHFS_SERVER set")
        .to_string();
    assert_eq!(servers.split(',').count(), 3, "{servers}");
    for a in servers.split(',') {
        match protocol {
            Some(p) => assert!(a.starts_with(&format!("{p}://")), "{servers}"),
            None => assert!(!a.contains("://"), "{servers}"),
        }
    }
    // The job gets the client key; the pool secret stays in the scratch
    // directory for the servers and chfsctl. Both are the owner's only.
    let secret_file = var(&env, "CHFS_SECRET_FILE").expect("client key file");
    assert_eq!(
        std::path::Path::new(secret_file),
        sc.scratch().join("chfs.client.key")
    );
    let pool_secret = std::fs::read_to_string(sc.scratch().join("chfs.secret")).unwrap();
    for f in [secret_file.into(), sc.scratch().join("chfs.secret")] {
        let meta = std::fs::metadata(&f).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
            0o600,
            "{f:?}"
        );
    }
    assert!(std::fs::read_to_string(secret_file)
        .unwrap()
        .starts_with("chfs-client-key:"));

    // Three daemons, recorded by PID, bound to CPU 0 (-C 0).
    let pids = recorded_pids(&sc.scratch());
    assert_eq!(pids.len(), 3);
    for p in &pids {
        assert!(chfsd_alive(*p));
        let st = std::fs::read_to_string(format!("/proc/{p}/status")).unwrap();
        let cpus = st
            .lines()
            .find(|l| l.starts_with("Cpus_allowed_list:"))
            .unwrap();
        assert_eq!(cpus.split_whitespace().nth(1), Some("0"), "{cpus}");
    }

    // Only the job's processes (with the secret) get in.
    let e = client(&env, false).err().expect("refused without secret");
    assert_ne!(e.errno(), 0);
    let c = client(&env, true).expect("connect with secret");
    assert_eq!(c.server_count(), 3);
    let fd = c.create("/data", libc::O_WRONLY, 0o644).unwrap();
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    c.write(fd, &payload).unwrap();
    c.close(fd).unwrap();

    // The tools with the evaluated environment.
    let e = envs(&env);
    let out = run(&bin("chlist"), &["-c"], &e);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout).trim(), servers);
    let out = run(&bin("chlist"), &[], &e);
    assert_eq!(text(&out.stdout).lines().count(), 3);
    let out = run(&bin("chmkdir"), &["-p", "/x/y/z"], &e);
    assert_eq!(out.status.code(), Some(0));
    let out = run(&bin("chmkdir"), &["/x"], &e);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("EEXIST"),
        "{}",
        text(&out.stderr)
    );
    let out = run(&bin("chrmdir"), &["/x"], &e);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("ENOTEMPTY"));
    assert!(
        c.stat("/x/y/z").unwrap().is_dir(),
        "refused rmdir lost nothing"
    );
    let out = run(&bin("chrmdir"), &["/x/y/z", "/x/y"], &e);
    assert_eq!(out.status.code(), Some(0));
    let out = run(&bin("chfind"), &["/", "-type", "d"], &e);
    let mut dirs: Vec<_> = text(&out.stdout).lines().map(String::from).collect();
    dirs.sort();
    assert_eq!(dirs, ["/", "/x"]);
    let out = run(&bin("chlist"), &["-c"], &[("CHFS_SERVER", &servers)]);
    assert_ne!(out.status.code(), Some(0), "no secret, no listing");

    // status: every server up, with its host and PID.
    let out = run(
        &ctl,
        &args(&["status"]),
        &[("CHFS_SECRET_FILE", secret_file)],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert_eq!(
        table.lines().filter(|l| l.contains(" up ")).count(),
        3,
        "{table}"
    );
    for p in &pids {
        assert!(table.contains(&p.to_string()), "{table}");
    }
    let total: u64 = table
        .lines()
        .filter(|l| l.contains(" up "))
        .map(|l| l.split_whitespace().nth(3).unwrap().parse::<u64>().unwrap())
        .sum();
    assert!(total >= payload.len() as u64, "{table}");
    // -v: every counter of every server too.
    let out = run(
        &ctl,
        &args(&["-v", "status"]),
        &[("CHFS_SECRET_FILE", secret_file)],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let counters: Vec<String> = text(&out.stdout)
        .lines()
        .filter(|l| l.contains(": requests="))
        .map(str::to_string)
        .collect();
    assert_eq!(counters.len(), 3, "{}", text(&out.stdout));
    for l in &counters {
        for c in ["writes=", "refused=", "denied=", "throttled="] {
            assert!(l.contains(c), "{l}");
        }
    }

    // A second start on the same scratch directory is refused and harms
    // nothing: the pool keeps its secret and client key.
    let key = std::fs::read_to_string(secret_file).unwrap();
    for extra in [&[][..], &["--no-secret"][..]] {
        let out = run(&ctl, &args(&[extra, &["start"]].concat()), &[]);
        assert_eq!(out.status.code(), Some(1));
        assert!(
            text(&out.stderr).contains("already runs"),
            "{}",
            text(&out.stderr)
        );
        assert!(text(&out.stderr).contains("host "), "names the host");
        for p in &pids {
            assert!(chfsd_alive(*p));
        }
        assert_eq!(
            std::fs::read_to_string(sc.scratch().join("chfs.secret")).unwrap(),
            pool_secret
        );
        assert_eq!(std::fs::read_to_string(secret_file).unwrap(), key);
    }
    let mut back = vec![0u8; payload.len()];
    let fd = c.open("/data", libc::O_RDONLY, 0).unwrap();
    assert_eq!(c.read(fd, &mut back).unwrap(), payload.len());
    assert_eq!(back, payload);
    c.close(fd).unwrap();
    drop(c);

    // clean is refused while servers run.
    let out = run(&ctl, &args(&["clean"]), &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("stop it first"));

    // stop: through the pool, then every recorded process is gone.
    let out = run(&ctl, &args(&["stop"]), &[("CHFS_SECRET_FILE", secret_file)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    for p in &pids {
        assert!(!chfsd_alive(*p), "pid {p} still runs");
    }
    assert!(recorded_pids(&sc.scratch()).is_empty());
    let out = run(&ctl, &args(&["status"]), &[("CHFS_SERVER", &servers)]);
    assert_ne!(out.status.code(), Some(0));

    let out = run(&ctl, &args(&["clean"]), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!sc.scratch().exists(), "scratch directory removed");
}

#[test]
fn kill_stops_at_once() {
    let sc = Scratch::new();
    let s = sc.s();
    let chfsd = chfsd();
    let ctl = bin("chfsctl");
    let logs = sc.dir.path().join("logs");
    let a = [
        "-c",
        &s,
        "--chfsd",
        chfsd.to_str().unwrap(),
        "-n",
        "2",
        "-L",
        logs.to_str().unwrap(),
        "-x",
        "CHFS_LOG_LEVEL=debug",
    ];
    let out = run(&ctl, &[&a[..], &["start"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let pids = recorded_pids(&sc.scratch());
    assert_eq!(pids.len(), 2);
    // -L puts the logs there; -x reached the servers (debug logging).
    let log = std::fs::read_to_string(logs.join(format!("chfsd@{}@0.log", hostname()))).unwrap();
    assert!(log.contains("DEBUG"), "{log}");
    let out = run(&ctl, &[&a[..], &["kill"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    for p in &pids {
        assert!(!chfsd_alive(*p));
    }
    assert!(recorded_pids(&sc.scratch()).is_empty());
}

#[test]
fn failed_start_leaves_nothing() {
    // Three "hosts" on loopback; the third cannot bind its port because this
    // test holds it. The port must be free on the other two (another test's
    // server or client may have it there): checked, else another is taken.
    let (_hold, port) = (0..100)
        .find_map(|_| {
            let hold = std::net::TcpListener::bind("127.0.0.3:0").unwrap();
            let port = hold.local_addr().unwrap().port();
            let free = ["127.0.0.1", "127.0.0.2"]
                .iter()
                .all(|h| std::net::TcpListener::bind((*h, port)).is_ok());
            free.then(|| (hold, port.to_string()))
        })
        .expect("a port free on 127.0.0.1-3");
    let sc = Scratch::new();
    let s = sc.s();
    let hf = sc.dir.path().join("hosts");
    std::fs::write(&hf, "127.0.0.1\n127.0.0.2\n127.0.0.3\n").unwrap();
    let chfsd = chfsd();
    let out = run(
        &bin("chfsctl"),
        &[
            "-h",
            hf.to_str().unwrap(),
            "--launcher",
            "local",
            "--port",
            &port,
            "-c",
            &s,
            "--chfsd",
            chfsd.to_str().unwrap(),
            "start",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "nothing to eval on failure");
    for f in ["chfs.secret", "chfs.client.key"] {
        assert!(
            !sc.scratch().join(f).exists(),
            "the generated {f} is removed too"
        );
    }
    let err = text(&out.stderr);
    assert!(err.contains("host 127.0.0.3"), "{err}");
    assert!(err.contains("cannot listen"), "{err}");
    assert!(err.contains("nothing is left running"), "{err}");
    assert!(recorded_pids(&sc.scratch()).is_empty());
    for h in ["127.0.0.1", "127.0.0.2"] {
        assert!(
            std::net::TcpStream::connect(format!("{h}:{port}")).is_err(),
            "server on {h} was stopped"
        );
    }
}

#[test]
fn usage_errors() {
    let ctl = bin("chfsctl");
    for (args, needle) in [
        (&["-N", "v", "start"][..], "-N"),
        (&["-p", "verbs", "start"][..], "protocol"),
        (&["-n", "0", "start"][..], "-n"),
        (
            &["-x", "NO_SUCH_VAR_CHFSCTL", "start"][..],
            "NO_SUCH_VAR_CHFSCTL",
        ),
        (&["-A", "start"][..], "CHFS_SERVER"),
        (&["frobnicate"][..], "frobnicate"),
    ] {
        let out = run(&ctl, args, &[]);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(text(&out.stderr).contains(needle), "{args:?}");
    }
    let out = run(&ctl, &["--help"], &[]);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).contains("eval $(chfsctl"));
    // The action list names every action.
    assert!(
        text(&out.stdout).contains("start | stop | status | kill | clean | rebalance"),
        "{}",
        text(&out.stdout)
    );
    for t in [
        "chlist",
        "chmkdir",
        "chrmdir",
        "chfind",
        "chstagein",
        "chfs",
    ] {
        let out = run(&bin(t), &["--help"], &[]);
        assert_eq!(out.status.code(), Some(0), "{t}");
        assert!(text(&out.stdout).contains(t));
    }
    let out = run(
        &bin("chfind"),
        &["-size", "x"],
        &[("CHFS_SERVER", "127.0.0.1:1")],
    );
    assert_eq!(out.status.code(), Some(2));
    let out = run(&bin("chlist"), &[], &[]);
    assert_ne!(out.status.code(), Some(0));
    assert!(text(&out.stderr).contains("CHFS_SERVER"));
}

#[test]
fn cache_mode_stop_writes_back_and_clean_removes_the_store() {
    let sc = Scratch::new();
    let s = sc.s();
    let backend = sc.dir.path().join("backend");
    std::fs::create_dir(&backend).unwrap();
    let b = backend.to_str().unwrap();
    let chfsd = chfsd();
    let ctl = bin("chfsctl");
    let a = [
        "-c",
        &s,
        "--chfsd",
        chfsd.to_str().unwrap(),
        "-n",
        "2",
        "-b",
        b,
        "--store",
        "posix",
        "-O",
        "--flush-idle-msec 600000",
    ];
    let out = run(&ctl, &[&a[..], &["start"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let env = eval_env(&text(&out.stdout));
    assert_eq!(var(&env, "CHFS_BACKEND_PATH"), Some(b));
    for k in 0..2 {
        let db = sc.scratch().join(format!("chfsd@{}@{k}.db", hostname()));
        assert!(
            db.exists(),
            "{} (persistent store in scratch)",
            db.display()
        );
    }
    let c = client(&env, true).unwrap();
    let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 241) as u8).collect();
    let fd = c.create("/result.dat", libc::O_WRONLY, 0o644).unwrap();
    c.write(fd, &payload).unwrap();
    c.close(fd).unwrap();
    // Flushing waits for a long idle time: the data is dirty until stop.
    let out = run(&ctl, &[&a[..], &["status"]].concat(), &envs(&env));
    assert_eq!(out.status.code(), Some(0));
    let dirty: u64 = text(&out.stdout)
        .lines()
        .filter(|l| l.contains(" up "))
        .map(|l| l.split_whitespace().nth(5).unwrap().parse::<u64>().unwrap())
        .sum();
    assert!(dirty >= payload.len() as u64, "{}", text(&out.stdout));
    assert!(!backend.join("result.dat").exists());
    drop(c);
    let out = run(&ctl, &[&a[..], &["stop"]].concat(), &envs(&env));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(std::fs::read(backend.join("result.dat")).unwrap(), payload);
    assert!(recorded_pids(&sc.scratch()).is_empty());
    let out = run(&ctl, &[&a[..], &["clean"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!sc.scratch().exists());
    assert!(
        backend.join("result.dat").exists(),
        "clean leaves the backend alone"
    );
}

#[test]
fn mount_on_start_unmount_on_stop() {
    let chfuse = bin("chfsctl").with_file_name("chfuse");
    if !chfuse.is_file() {
        chfs_localpool::skip(
            "fuse",
            "mount_on_start_unmount_on_stop",
            "no chfuse binary next to chfsctl (cargo build -p chfs-fuse)",
        );
        return;
    }
    if !std::path::Path::new("/dev/fuse").exists() {
        chfs_localpool::skip(
            "fuse",
            "mount_on_start_unmount_on_stop",
            "/dev/fuse is missing",
        );
        return;
    }
    let sc = Scratch::new();
    let s = sc.s();
    let mnt = sc.dir.path().join("mnt");
    let m = mnt.to_str().unwrap();
    let chfsd = chfsd();
    let ctl = bin("chfsctl");
    let a = [
        "-c",
        &s,
        "-m",
        m,
        "--chfsd",
        chfsd.to_str().unwrap(),
        "--chfuse",
        chfuse.to_str().unwrap(),
        "-n",
        "2",
    ];
    let mounted = || {
        std::fs::read_to_string("/proc/self/mounts")
            .unwrap()
            .lines()
            .any(|l| l.split_whitespace().nth(1) == Some(m))
    };
    let out = run(&ctl, &[&a[..], &["start"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let env = eval_env(&text(&out.stdout));
    // Unmount even if an assertion below fails.
    struct Unmount(String);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("fusermount3")
                .args(["-uz", &self.0])
                .output();
        }
    }
    let _guard = Unmount(m.to_string());
    assert!(mounted(), "chfuse mounted on {m}");
    // chfuse is an application: it has the client key, not the secret.
    let fuse_pid =
        std::fs::read_to_string(sc.scratch().join(format!("chfuse@{}.pid", hostname()))).unwrap();
    let environ = std::fs::read(format!("/proc/{}/environ", fuse_pid.trim())).unwrap();
    let vars: Vec<String> = environ
        .split(|&b| b == 0)
        .map(text)
        .filter(|v| v.starts_with("CHFS_SECRET"))
        .collect();
    assert_eq!(
        vars,
        [format!(
            "CHFS_SECRET_FILE={}",
            sc.scratch().join("chfs.client.key").display()
        )]
    );
    std::fs::create_dir(mnt.join("d")).unwrap();
    std::fs::write(mnt.join("d/f"), b"through the mount").unwrap();
    let c = client(&env, true).unwrap();
    let fd = c.open("/d/f", libc::O_RDONLY, 0).unwrap();
    let mut b = [0u8; 64];
    let n = c.read(fd, &mut b).unwrap();
    assert_eq!(&b[..n], b"through the mount");
    c.close(fd).unwrap();
    drop(c);
    let out = run(&ctl, &[&a[..], &["stop"]].concat(), &envs(&env));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!mounted(), "stop unmounted {m}");
    assert!(recorded_pids(&sc.scratch()).is_empty());
    let out = run(&ctl, &[&a[..], &["clean"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn mpirun_launcher_on_this_host() {
    if std::process::Command::new("mpirun")
        .arg("--version")
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        chfs_localpool::skip(
            "mpi",
            "mpirun_launcher_on_this_host",
            "no mpirun (apt-get install openmpi-bin)",
        );
        return;
    }
    let sc = Scratch::new();
    let s = sc.s();
    let hf = sc.dir.path().join("hosts");
    std::fs::write(&hf, "localhost slots=2\n").unwrap();
    let chfsd = chfsd();
    let ctl = bin("chfsctl");
    let a = [
        "-h",
        hf.to_str().unwrap(),
        "--launcher",
        "mpirun",
        "-c",
        &s,
        "--chfsd",
        chfsd.to_str().unwrap(),
        "-n",
        "2",
    ];
    // Open MPI refuses root unless told.
    let mpi_env = [
        ("OMPI_ALLOW_RUN_AS_ROOT", "1"),
        ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
    ];
    let out = run(&ctl, &[&a[..], &["start"]].concat(), &mpi_env);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let env = eval_env(&text(&out.stdout));
    let pids = recorded_pids(&sc.scratch());
    assert_eq!(pids.len(), 2);
    // The servers outlive the mpirun that started them.
    std::thread::sleep(Duration::from_millis(300));
    for p in &pids {
        assert!(chfsd_alive(*p));
    }
    let c = client(&env, true).unwrap();
    assert_eq!(c.server_count(), 2);
    c.mkdir("/via-mpirun", 0o755).unwrap();
    drop(c);
    let out = run(&ctl, &[&a[..], &["status"]].concat(), &mpi_env);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout)
            .lines()
            .filter(|l| l.contains(" up "))
            .count(),
        2
    );
    let out = run(&ctl, &[&a[..], &["stop"]].concat(), &mpi_env);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    for p in &pids {
        assert!(!chfsd_alive(*p));
    }
    let out = run(&ctl, &[&a[..], &["clean"]].concat(), &mpi_env);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn failed_mount_stops_the_servers() {
    let sc = Scratch::new();
    let s = sc.s();
    // A mount point below a regular file cannot be created.
    let file = sc.dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let m = file.join("mnt");
    let chfsd = chfsd();
    let out = run(
        &bin("chfsctl"),
        &[
            "-c",
            &s,
            "--chfsd",
            chfsd.to_str().unwrap(),
            "-n",
            "2",
            "-m",
            m.to_str().unwrap(),
            "start",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = text(&out.stderr);
    assert!(
        err.contains("host ") && err.contains("cannot mount chfuse on"),
        "{err}"
    );
    assert!(err.contains("stopped the 2 server(s)"), "{err}");
    assert!(recorded_pids(&sc.scratch()).is_empty());
}

/// The CAPACITY column of every `up` line of a status table.
fn capacities(table: &str) -> Vec<u64> {
    table
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some("up"))
        .map(|l| l.split_whitespace().nth(4).unwrap().parse().unwrap())
        .collect()
}

#[test]
fn pmem_store_defaults_to_one_gib_per_server() {
    let sc = Scratch::new();
    let s = sc.s();
    let chfsd = chfsd();
    let ctl = bin("chfsctl");
    let a = [
        "-c",
        &s,
        "--chfsd",
        chfsd.to_str().unwrap(),
        "-n",
        "2",
        "--store",
        "pmem",
    ];
    // No -s: each new store gets 1 GiB, as the original's -s db_size.
    let out = run(&ctl, &[&a[..], &["start"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let env = eval_env(&text(&out.stdout));
    for k in 0..2 {
        let db = sc.scratch().join(format!("chfsd@{}@{k}.db", hostname()));
        assert_eq!(std::fs::metadata(&db).unwrap().len(), 1 << 30, "{db:?}");
    }
    let out = run(&ctl, &[&a[..], &["status"]].concat(), &envs(&env));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let caps = capacities(&text(&out.stdout));
    assert_eq!(caps.len(), 2, "{}", text(&out.stdout));
    for c in caps {
        assert!(c > (1 << 30) - (1 << 20) && c <= 1 << 30, "capacity {c}");
    }
    let out = run(&ctl, &[&a[..], &["stop"]].concat(), &envs(&env));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = run(&ctl, &[&a[..], &["clean"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    // A store created with another size keeps it when the pool is started
    // again on the same scratch directory without -s, with its data.
    let out = run(&ctl, &[&a[..], &["-s", "256M", "start"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let env = eval_env(&text(&out.stdout));
    let c = client(&env, true).unwrap();
    let fd = c.create("/kept", libc::O_WRONLY, 0o644).unwrap();
    c.write(fd, b"persistent").unwrap();
    c.close(fd).unwrap();
    drop(c);
    let out = run(&ctl, &[&a[..], &["stop"]].concat(), &envs(&env));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = run(&ctl, &[&a[..], &["start"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let env = eval_env(&text(&out.stdout));
    let out = run(&ctl, &[&a[..], &["status"]].concat(), &envs(&env));
    let caps = capacities(&text(&out.stdout));
    assert_eq!(caps.len(), 2, "{}", text(&out.stdout));
    for c in caps {
        assert!(
            c > (256 << 20) - (1 << 20) && c <= 256 << 20,
            "capacity {c}"
        );
    }
    let c = client(&env, true).unwrap();
    let fd = c.open("/kept", libc::O_RDONLY, 0).unwrap();
    let mut b = [0u8; 32];
    let n = c.read(fd, &mut b).unwrap();
    assert_eq!(&b[..n], b"persistent");
    c.close(fd).unwrap();
    drop(c);
    let out = run(&ctl, &[&a[..], &["stop"]].concat(), &envs(&env));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = run(&ctl, &[&a[..], &["clean"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn nothing_to_act_on_is_an_error_and_stop_waits_for_unrecorded_servers() {
    let sc = Scratch::new();
    let s = sc.s();
    let wrong = sc.dir.path().join("wrong").to_string_lossy().into_owned();
    let chfsd = chfsd();
    let ctl = bin("chfsctl");
    let a = ["-c", &s, "--chfsd", chfsd.to_str().unwrap(), "-n", "2"];
    let out = run(&ctl, &[&a[..], &["start"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let env = eval_env(&text(&out.stdout));
    let servers = var(&env, "CHFS_SERVER").unwrap().to_string();
    let pids = recorded_pids(&sc.scratch());
    assert_eq!(pids.len(), 2);

    // A wrong -c and no CHFS_SERVER: every action that needs servers says
    // so and fails; the pool keeps running untouched.
    for action in ["stop", "clean", "kill", "status"] {
        let out = run(&ctl, &["-c", &wrong, action], &[]);
        assert_eq!(out.status.code(), Some(1), "{action}");
        let err = text(&out.stderr);
        assert!(err.contains("no server found"), "{action}: {err}");
        assert!(
            err.contains(&wrong),
            "{action} names the scratch directory: {err}"
        );
        assert!(out.stdout.is_empty(), "{action}");
    }
    // Missing -c (the default scratch directory has none of this test's).
    let out = run(&ctl, &["stop"], &[("USER", "chfsctl-test-nobody")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("/tmp/chfsctl-test-nobody"));
    for p in &pids {
        assert!(chfsd_alive(*p), "pid {p} untouched");
    }

    // Only CHFS_SERVER (wrong -c): the servers are asked to stop and stop
    // returns once they have exited.
    // The pool secret (what stops a pool) given as CHFS_SECRET_FILE.
    let secret = sc.scratch().join("chfs.secret");
    let out = run(
        &ctl,
        &["-v", "-c", &wrong, "stop"],
        &[
            ("CHFS_SERVER", &servers),
            ("CHFS_SECRET_FILE", secret.to_str().unwrap()),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    for p in &pids {
        assert!(!chfsd_alive(*p), "pid {p} still runs when stop returned");
    }
    assert!(
        text(&out.stderr).contains("2 server(s) not recorded in"),
        "{}",
        text(&out.stderr)
    );
    // Again: nothing answers and nothing is recorded there.
    let out = run(&ctl, &["-c", &wrong, "stop"], &[("CHFS_SERVER", &servers)]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("no server found") && err.contains("cannot be reached"),
        "{err}"
    );

    // clean with the right -c removes the files, a second clean finds
    // nothing.
    let out = run(&ctl, &[&a[..], &["clean"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!sc.scratch().exists());
    let out = run(&ctl, &[&a[..], &["clean"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("no server found"));
}

#[test]
fn status_aligns_down_servers() {
    let sc = Scratch::new();
    let s = sc.s();
    let chfsd = chfsd();
    let ctl = bin("chfsctl");
    let a = ["-c", &s, "--chfsd", chfsd.to_str().unwrap(), "-n", "3"];
    let out = run(&ctl, &[&a[..], &["start"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let host = hostname();
    let pid0: u32 = std::fs::read_to_string(sc.scratch().join(format!("chfsd@{host}@0.pid")))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: kill(2) on the chfsd this test started (its recorded PID).
    unsafe { libc::kill(pid0 as i32, libc::SIGKILL) };
    let t = std::time::Instant::now();
    while chfsd_alive(pid0) && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = run(&ctl, &[&a[..], &["status"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(1), "a server is down");
    let table = text(&out.stdout);
    let lines: Vec<&str> = table.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(lines.len(), 4, "{table}");
    let header = lines[0];
    // Every column ends where the header's does: PID right-aligned, HOST
    // left-aligned, in every row, up or down.
    let pid_end = header.find("PID").unwrap() + 3;
    let host_at = header.find("HOST").unwrap();
    let mut down = 0;
    for l in &lines[1..] {
        let w: Vec<&str> = l.split_whitespace().collect();
        let host_field = format!("{host}#");
        assert_eq!(l.find(&host_field), Some(host_at), "HOST column:\n{table}");
        let pid = w[8];
        assert!(l[..pid_end].ends_with(pid), "PID column:\n{table}");
        assert_eq!(l.find(w[1]), header.find("STATE"), "STATE column:\n{table}");
        if w[1] == "DOWN" {
            down += 1;
            assert_eq!(w[2..8], ["-"; 6], "no figures for a down server:\n{table}");
            assert_eq!(
                pid,
                pid0.to_string(),
                "the killed server is the down one:\n{table}"
            );
            assert!(w.len() > 10, "the reason after the host:\n{table}");
        }
    }
    assert_eq!(down, 1, "{table}");
    let out = run(&ctl, &[&a[..], &["stop"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = run(&ctl, &[&a[..], &["clean"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

/// `chfsctl stop` of a pool one of whose servers was SIGKILLed returns in
/// a few seconds: the recorded server whose recorded PID is not alive is
/// named as already gone and not contacted, the live one is stopped.
/// Before, stop sent the dead server a status request and then a
/// `Shutdown`, each waiting out the RPC timeout over `ofi+shm` (the hello
/// to a queue nobody reads: 60 s in all), and named it nowhere.
fn stop_with_a_killed_server(protocol: Option<&str>, killed: usize) {
    let sc = Scratch::new();
    let s = sc.s();
    let chfsd = chfsd();
    let chfsd = chfsd.to_str().unwrap();
    let ctl = bin("chfsctl");
    let mut base = vec!["-c", &s, "--chfsd", chfsd];
    if let Some(p) = protocol {
        base.extend(["-p", p]);
    }
    let out = run(&ctl, &[&base[..], &["-n", "2", "start"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let host = hostname();
    let file = |k: usize, ext: &str| {
        std::fs::read_to_string(sc.scratch().join(format!("chfsd@{host}@{k}.{ext}")))
            .unwrap()
            .trim()
            .to_string()
    };
    let dead: u32 = file(killed, "pid").parse().unwrap();
    let dead_addr = file(killed, "addr");
    let live: u32 = file(1 - killed, "pid").parse().unwrap();
    assert!(chfsd_alive(dead) && chfsd_alive(live));
    // Over ofi+shm, the killed server's queue file kept open here, as a
    // client of it would keep it mapped: it stays, and a hello to it
    // cannot be refused at once (it would wait out the RPC timeout).
    let held: Vec<std::fs::File> = shm_files_of(dead)
        .iter()
        .map(|f| std::fs::File::open(format!("/dev/shm/{f}")).unwrap())
        .collect();
    assert_eq!(held.is_empty(), protocol != Some("ofi+shm"));
    // SAFETY: kill(2) on the chfsd this test started (its recorded PID).
    unsafe { libc::kill(dead as i32, libc::SIGKILL) };
    assert!(chfsd_ends(dead), "pid {dead} survived SIGKILL");

    // status does not ask it either: it is "not running", at once.
    let t = std::time::Instant::now();
    let out = tool(&ctl, &[&base[..], &["status"]].concat(), &[])
        .env_remove("CHFS_RPC_TIMEOUT_MSEC")
        .output()
        .expect("run chfsctl status");
    let took = t.elapsed();
    let listing = text(&out.stdout);
    eprintln!("chfsctl status with server {killed} killed: {took:?}\n{listing}");
    assert!(
        listing
            .lines()
            .any(|l| l.contains(&dead_addr) && l.contains("not running")),
        "{listing}\n{}",
        text(&out.stderr)
    );
    assert!(
        took < Duration::from_secs(10),
        "chfsctl status took {took:?} (a dead server's timeout waited out?)"
    );
    drop(held);

    let t = std::time::Instant::now();
    let out = tool(&ctl, &[&base[..], &["stop"]].concat(), &[])
        .env_remove("CHFS_RPC_TIMEOUT_MSEC")
        .output()
        .expect("run chfsctl stop");
    let took = t.elapsed();
    let err = text(&out.stderr);
    eprintln!(
        "chfsctl stop over {} with server {killed} killed: {took:?}, exit {:?}\n{err}",
        protocol.unwrap_or("tcp"),
        out.status.code()
    );
    let live_gone = chfsd_ends(live);
    // Not left for others either way (both recorded processes ended).
    for p in [dead, live] {
        for f in shm_files_of(p) {
            let _ = std::fs::remove_file(format!("/dev/shm/{f}"));
        }
    }
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(live_gone, "the live server (pid {live}) still runs");
    assert!(
        err.contains(&format!("pid {dead}")) && err.contains(&dead_addr),
        "stop names the dead server: {err}"
    );
    assert!(err.contains("already"), "{err}");
    assert!(
        took < Duration::from_secs(10),
        "chfsctl stop took {took:?} (a dead server's timeouts waited out?)"
    );
    assert!(recorded_pids(&sc.scratch()).is_empty());
    let out = run(&ctl, &[&base[..], &["clean"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn stop_skips_a_killed_server_over_ofi_shm() {
    if common::fabric_built("stop_skips_a_killed_server_over_ofi_shm") {
        // The first server (the pool's leader) killed.
        stop_with_a_killed_server(Some("ofi+shm"), 0);
    }
}

#[test]
fn stop_skips_a_killed_server_over_tcp() {
    stop_with_a_killed_server(None, 1);
}

/// A server that does not answer (SIGSTOPped) fails its status request
/// within `CHFS_RPC_TIMEOUT_MSEC`: stop names it (exit 1), does not ask it
/// to stop, stops it by its recorded PID and stops the others all the
/// same. Before, stop waited chfsctl's own 30 s for each request whatever
/// CHFS_RPC_TIMEOUT_MSEC said, and exited 0.
#[test]
fn stop_names_a_server_that_does_not_answer() {
    let sc = Scratch::new();
    let s = sc.s();
    let chfsd = chfsd();
    let ctl = bin("chfsctl");
    let a = ["-c", &s, "--chfsd", chfsd.to_str().unwrap(), "-n", "2"];
    let out = run(&ctl, &[&a[..], &["start"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let host = hostname();
    let pid = |k: usize| -> u32 {
        std::fs::read_to_string(sc.scratch().join(format!("chfsd@{host}@{k}.pid")))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let (live, hung) = (pid(0), pid(1));
    // SAFETY: kill(2) on the chfsd this test started (its recorded PID).
    unsafe { libc::kill(hung as i32, libc::SIGSTOP) };
    let t = std::time::Instant::now();
    let out = run(
        &ctl,
        &[&a[..], &["stop"]].concat(),
        &[("CHFS_RPC_TIMEOUT_MSEC", "2000")],
    );
    let took = t.elapsed();
    eprintln!("chfsctl stop with a stopped server: {took:?}");
    let (live_gone, hung_gone) = (chfsd_ends(live), chfsd_ends(hung));
    if !hung_gone {
        // SAFETY: as above.
        unsafe { libc::kill(hung as i32, libc::SIGKILL) };
    }
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("pid {hung}")) && err.contains("not asked to stop"),
        "{err}"
    );
    assert!(live_gone, "the answering server (pid {live}) still runs");
    assert!(hung_gone, "the stopped server (pid {hung}) still runs");
    // 2 s for the status request, 5 s between SIGTERM and SIGKILL.
    assert!(took < Duration::from_secs(20), "chfsctl stop took {took:?}");
    let out = run(&ctl, &[&a[..], &["clean"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

/// A `CHFS_RPC_TIMEOUT_MSEC` that is not a number is a usage error (exit
/// 2, the variable named) for every action, and nothing is started.
/// Before, chfsctl ignored the variable whatever it held.
#[test]
fn a_bad_rpc_timeout_is_a_usage_error() {
    let sc = Scratch::new();
    let s = sc.s();
    let chfsd = chfsd();
    let ctl = bin("chfsctl");
    let a = ["-c", &s, "--chfsd", chfsd.to_str().unwrap()];
    for bad in ["abc", "30s"] {
        for action in ["start", "stop", "status", "rebalance"] {
            let out = run(
                &ctl,
                &[&a[..], &[action]].concat(),
                &[("CHFS_RPC_TIMEOUT_MSEC", bad)],
            );
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{action} with {bad}: {err}");
            assert!(
                err.contains("CHFS_RPC_TIMEOUT_MSEC") && err.contains(bad),
                "{action}: {err}"
            );
            assert!(out.stdout.is_empty(), "{action}");
            assert!(recorded_pids(&sc.scratch()).is_empty(), "{action}");
        }
    }
}

#[test]
fn scratch_default_without_user_is_the_account_name() {
    let name = std::process::Command::new("id")
        .arg("-un")
        .output()
        .unwrap();
    let name = text(&name.stdout).trim().to_string();
    let out = tool(&bin("chfsctl"), &["-v", "status"], &[])
        .env_remove("USER")
        .env_remove("LOGNAME")
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert!(err.contains(&format!("scratch /tmp/{name}\n")), "{err}");
}

/// Files in /dev/shm named after process `pid` (libfabric's shm provider
/// names an endpoint's queue file `PID:N:M`).
fn shm_files_of(pid: u32) -> Vec<String> {
    let prefix = format!("{pid}:");
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// Runs a tool to its end and returns its PID (the tool checked to have
/// succeeded).
fn run_recorded(prog: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> (u32, String) {
    let child = tool(prog, args, env)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn tool");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait tool");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{} {args:?}: {}",
        prog.display(),
        text(&out.stderr)
    );
    (pid, text(&out.stdout))
}

/// Every process that used `ofi+shm` leaves nothing in /dev/shm when it
/// exits normally: chfsctl's start and stop, the tools (Rust clients,
/// one moving a 1 MiB file by RMA), and the servers stopped by `chfsctl
/// stop`. libfabric's shm provider keeps an endpoint's queue in a 16 MiB
/// file it unlinks only when the endpoint closes, and the client's shared
/// endpoint is never closed: each of these processes left its file.
#[test]
fn processes_over_ofi_shm_leave_no_queue_files() {
    if !common::fabric_built("processes_over_ofi_shm_leave_no_queue_files") {
        return;
    }
    let sc = Scratch::new();
    let s = sc.s();
    let chfsd = chfsd();
    let chfsd = chfsd.to_str().unwrap();
    let ctl = bin("chfsctl");
    let base = ["-c", &s, "--chfsd", chfsd, "-p", "ofi+shm"];
    // Each process's files, looked at as soon as it ended: the next
    // process's first shm endpoint removes queue files nobody uses.
    let mut left = Vec::new();
    let (pid, out) = run_recorded(&ctl, &[&base[..], &["-n", "2", "start"]].concat(), &[]);
    left.push(("chfsctl start", pid, shm_files_of(pid)));
    let env = eval_env(&out);
    let servers = recorded_pids(&sc.scratch());
    assert_eq!(servers.len(), 2);
    for p in &servers {
        assert!(!shm_files_of(*p).is_empty(), "chfsd {p} has a queue file");
    }
    let e = envs(&env);
    let data = sc.scratch().join("in.dat");
    std::fs::write(&data, vec![7u8; 1 << 20]).unwrap();
    for (name, args) in [
        ("chmkdir", vec!["/d"]),
        ("chstagein", vec![data.to_str().unwrap()]),
        ("chlist", vec![]),
    ] {
        let (pid, _) = run_recorded(&bin(name), &args, &e);
        left.push((name, pid, shm_files_of(pid)));
    }
    let c = client(&env, true).expect("connect");
    assert_eq!(c.stat(data.to_str().unwrap()).unwrap().size, 1 << 20);
    drop(c);
    let secret = var(&env, "CHFS_SECRET_FILE").unwrap();
    let (pid, _) = run_recorded(
        &ctl,
        &[&base[..], &["stop"]].concat(),
        &[("CHFS_SECRET_FILE", secret)],
    );
    left.push(("chfsctl stop", pid, shm_files_of(pid)));
    for p in &servers {
        assert!(!chfsd_alive(*p), "chfsd {p} still runs");
        left.push(("chfsd", *p, shm_files_of(*p)));
    }
    left.retain(|(_, _, f)| !f.is_empty());
    // Not left for others either way (every recorded process has ended).
    for (_, _, files) in &left {
        for f in files {
            let _ = std::fs::remove_file(format!("/dev/shm/{f}"));
        }
    }
    assert!(left.is_empty(), "queue files left in /dev/shm: {left:?}");
    let out = run(&ctl, &[&base[..], &["clean"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

/// A queue file as libfabric 1.17's shm provider starts one (version 4,
/// flags, the creator's PID), named after `pid`, at `/dev/shm/PID:0:0`.
fn fake_queue_file(pid: u32) -> std::path::PathBuf {
    let path = std::path::PathBuf::from(format!("/dev/shm/{pid}:0:0"));
    let mut head = vec![4u8, 0, 1, 0];
    head.extend_from_slice(&(pid as i32).to_ne_bytes());
    head.resize(4096, 0);
    std::fs::write(&path, head).unwrap();
    path
}

/// A PID no process here has, from `from` on.
fn unused_pid(from: u32) -> u32 {
    (from..)
        .find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
        .unwrap()
}

/// A process killed by a signal cannot unlink its `ofi+shm` queue file at
/// exit: the next process's first shm endpoint removes the queue files
/// that no process has open or mapped (a SIGKILLed chfsd's, a dead
/// process's of another PID), and only those: the live chfsd's stays, and
/// so does one held open by a process whose PID names no process here (as
/// one in another PID namespace sharing /dev/shm would be). Before, only a
/// file named with the new process's own PID was removed.
#[test]
fn queue_files_nobody_uses_are_removed_by_the_next_shm_process() {
    if !common::fabric_built("queue_files_nobody_uses_are_removed_by_the_next_shm_process") {
        return;
    }
    let sc = Scratch::new();
    let s = sc.s();
    let chfsd = chfsd();
    let chfsd = chfsd.to_str().unwrap();
    let ctl = bin("chfsctl");
    let base = ["-c", &s, "--chfsd", chfsd, "-p", "ofi+shm"];
    let (_, out) = run_recorded(&ctl, &[&base[..], &["-n", "2", "start"]].concat(), &[]);
    let env = eval_env(&out);
    let secret = var(&env, "CHFS_SECRET_FILE").unwrap().to_string();
    let servers = var(&env, "CHFS_SERVER").unwrap().to_string();
    let addr_pid = |a: &str| -> u32 {
        // ofi+shm://x<hex of "fi_shm://PID:N:M\0">
        let hex = a.strip_prefix("ofi+shm://x").unwrap();
        let raw: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let name = String::from_utf8_lossy(&raw).into_owned();
        let name = name.trim_end_matches('\0');
        let rest = name.strip_prefix("fi_shm://").unwrap();
        rest.split(':').next().unwrap().parse().unwrap()
    };
    let (live_addr, killed_addr) = servers.split_once(',').unwrap();
    let (live, killed) = (addr_pid(live_addr), addr_pid(killed_addr));
    assert!(chfsd_alive(killed));
    // (Looked at before the kill: after it, another test's shm process,
    // run meanwhile, may already have removed it, as it should.)
    assert!(!shm_files_of(killed).is_empty(), "the chfsd's queue file");
    // SAFETY: kill(2) of a recorded chfsd's PID.
    assert_eq!(unsafe { libc::kill(killed as i32, libc::SIGKILL) }, 0);
    assert!(chfsd_ends(killed));
    // Stale, and held open by a process whose PID names nothing here.
    let stale = fake_queue_file(unused_pid(40_000 + std::process::id() % 10_000 * 3));
    let held_pid = unused_pid(stale_pid(&stale) + 1);
    let held = fake_queue_file(held_pid);
    let mut holder = std::process::Command::new("sleep")
        .arg("60")
        .stdin(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&held)
                .unwrap(),
        )
        .spawn()
        .unwrap();
    let (_, listed) = run_recorded(
        &bin("chlist"),
        &[],
        &[("CHFS_SERVER", live_addr), ("CHFS_SECRET_FILE", &secret)],
    );
    let state = (
        shm_files_of(killed),
        stale.exists(),
        held.exists(),
        shm_files_of(live).len(),
    );
    // Cleaned up whatever the outcome (the holder by its PID).
    let _ = holder.kill();
    let _ = holder.wait();
    for f in shm_files_of(killed) {
        let _ = std::fs::remove_file(format!("/dev/shm/{f}"));
    }
    let _ = std::fs::remove_file(&stale);
    let _ = std::fs::remove_file(&held);
    assert!(listed.contains(live_addr), "{listed}");
    assert_eq!(
        state,
        (Vec::new(), false, true, 1),
        "(the killed chfsd's files, the stale file, the held one, the live chfsd's files)"
    );
    // The live one stopped by SIGTERM (`chfsctl stop` would first try to
    // stop the pool's killed member) unlinks its file as it exits.
    assert!(chfsd_alive(live));
    // SAFETY: kill(2) of a recorded chfsd's PID.
    assert_eq!(unsafe { libc::kill(live as i32, libc::SIGTERM) }, 0);
    assert!(chfsd_ends(live));
    let left = shm_files_of(live);
    for f in &left {
        let _ = std::fs::remove_file(format!("/dev/shm/{f}"));
    }
    assert_eq!(left, Vec::<String>::new(), "a SIGTERMed chfsd's files");
}

fn stale_pid(path: &std::path::Path) -> u32 {
    let name = path.file_name().unwrap().to_str().unwrap();
    name.split(':').next().unwrap().parse().unwrap()
}

/// A queue file named with the PID of the process that scans /dev/shm is
/// removed only if nobody uses it: one held open, still empty (as a
/// process of another PID namespace sharing /dev/shm, with this PID, has
/// its queue file between creating and sizing it), stays. Before, a file
/// named with the scanner's own PID whose header did not name that PID
/// (an empty one: no header at all) was removed without asking whether
/// anyone used it.
#[test]
fn a_queue_file_in_use_named_with_the_scanners_pid_stays() {
    if !common::fabric_built("a_queue_file_in_use_named_with_the_scanners_pid_stays") {
        return;
    }
    use std::io::Write;
    let sc = Scratch::new();
    let s = sc.s();
    let chfsd = chfsd();
    let chfsd = chfsd.to_str().unwrap();
    let ctl = bin("chfsctl");
    let base = ["-c", &s, "--chfsd", chfsd, "-p", "ofi+shm"];
    let (_, out) = run_recorded(&ctl, &[&base[..], &["-n", "1", "start"]].concat(), &[]);
    let env = eval_env(&out);
    let e = envs(&env);
    // chlist, its PID known before it runs: `exec` keeps the shell's.
    let chlist = bin("chlist");
    let mut child = tool(
        std::path::Path::new("sh"),
        &["-c", "read _ && exec \"$0\"", chlist.to_str().unwrap()],
        &e,
    )
    .stdin(std::process::Stdio::piped())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("spawn sh");
    let pid = child.id();
    let path = std::path::PathBuf::from(format!("/dev/shm/{pid}:9:0"));
    // Created and held open (for writing, as shm_open does), not sized.
    let held = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .expect("create the held queue file");
    let mut go = child.stdin.take().unwrap();
    go.write_all(b"\n").unwrap();
    drop(go);
    let listed = child.wait_with_output().expect("wait chlist");
    let kept = path.exists();
    drop(held);
    let _ = std::fs::remove_file(&path);
    for f in shm_files_of(pid) {
        let _ = std::fs::remove_file(format!("/dev/shm/{f}"));
    }
    let secret = var(&env, "CHFS_SECRET_FILE").unwrap();
    let out = run(
        &ctl,
        &[&base[..], &["stop"]].concat(),
        &[("CHFS_SECRET_FILE", secret)],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(listed.status.code(), Some(0), "{}", text(&listed.stderr));
    assert!(
        kept,
        "a queue file held open was removed by the scanner {pid}"
    );
}
