//! Secure by default: a pool started by `chfsctl start` without options
//! answers only processes holding its client key (what start exports as
//! CHFS_SECRET_FILE), and only chfsctl, with the pool secret in its
//! scratch directory, may stop it or grow it. Through the real tools.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use chfs_client::{Client, ClientConfig};
use common::*;

fn envs(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// A client configured as the tools are: from these variables only.
fn connect(env: &[(&str, &str)]) -> chfs_client::Result<Client> {
    let mut cfg = ClientConfig::from_lookup(|k| {
        env.iter()
            .find(|(a, _)| *a == k)
            .map(|(_, v)| v.to_string())
    })?;
    cfg.rpc_timeout = Duration::from_secs(10);
    Client::connect(cfg)
}

fn mode(p: &Path) -> u32 {
    std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(p).unwrap().permissions()) & 0o777
}

/// Runs chfsd by hand (foreground) with `env` and `args`; returns its exit
/// status and error output. A chfsd still running after 20 s is killed (by
/// its PID) and fails the test.
fn chfsd_by_hand(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut c = tool(&chfsd(), args, env)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    loop {
        if let Some(st) = c.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(&mut c.stderr.take().unwrap(), &mut err).unwrap();
            return (st.code(), err);
        }
        if t.elapsed() > Duration::from_secs(20) {
            let _ = c.kill();
            let _ = c.wait();
            panic!("chfsd {args:?} kept running: it was let into the pool");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn default_start_admits_only_the_jobs_processes() {
    let sc = Scratch::new();
    let s = sc.s();
    let chfsd = chfsd();
    let ctl = bin("chfsctl");
    let (chstagein, chfs) = (bin("chstagein"), bin("chfs"));
    let a = ["-c", &s, "--chfsd", chfsd.to_str().unwrap(), "-n", "2"];

    let out = run(&ctl, &[&a[..], &["start"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        !text(&out.stderr).contains("warning"),
        "{}",
        text(&out.stderr)
    );
    let env = eval_env(&text(&out.stdout));
    let servers = var(&env, "CHFS_SERVER").unwrap().to_string();
    let key_file = var(&env, "CHFS_SECRET_FILE").expect("CHFS_SECRET_FILE exported");

    // The job gets the client key; the pool secret stays in the scratch
    // directory, both readable by their owner only; the secret is on no
    // command line and in nothing start printed or exported.
    assert_eq!(Path::new(key_file), sc.scratch().join("chfs.client.key"));
    let secret_path = sc.scratch().join("chfs.secret");
    assert_eq!(mode(&secret_path), 0o600);
    assert_eq!(mode(Path::new(key_file)), 0o600);
    let secret = std::fs::read_to_string(&secret_path).unwrap();
    let secret = secret.trim();
    assert_eq!(secret.len(), 64, "256 bits in hex: {secret}");
    let key = std::fs::read_to_string(key_file).unwrap();
    assert!(key.starts_with("chfs-client-key:"), "{key}");
    assert!(!key.contains(secret));
    assert!(!text(&out.stdout).contains(secret));
    let pids = recorded_pids(&sc.scratch());
    assert_eq!(pids.len(), 2);
    for p in &pids {
        let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).unwrap();
        let environ = std::fs::read(format!("/proc/{p}/environ")).unwrap();
        for (what, b) in [("command line", cmdline), ("environment", environ)] {
            assert!(!text(&b).contains(secret), "chfsd {p}'s {what}");
            assert!(!text(&b).contains(&key[16..80]), "chfsd {p}'s {what}");
        }
    }

    let input = sc.dir.path().join("input.dat");
    let payload: Vec<u8> = (0..150_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(&input, &payload).unwrap();
    let input_s = input.to_str().unwrap();

    // Without the key: no write (chstagein), no listing (chfind, chlist),
    // no read (the client library every tool and the C API use), no
    // write-back (chfs): each refused with EACCES, nothing stored.
    let open: &[(&str, &str)] = &[("CHFS_SERVER", &servers)];
    for (prog, args) in [
        (&chstagein, &[input_s][..]),
        (&bin("chfind"), &["/"][..]),
        (&bin("chlist"), &[][..]),
        (&chfs, &["sync"][..]),
    ] {
        let out = run(prog, args, open);
        assert_ne!(out.status.code(), Some(0), "{} {args:?}", prog.display());
        assert!(
            text(&out.stderr).contains("EACCES"),
            "{} {args:?}: {}",
            prog.display(),
            text(&out.stderr)
        );
    }
    // Nor a mount (chfuse) without the key.
    if Path::new("/dev/fuse").exists() {
        let mnt = sc.dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let out = run(&sibling("chfuse"), &[mnt.to_str().unwrap()], open);
        let mounted = std::fs::read_to_string("/proc/self/mounts")
            .unwrap()
            .lines()
            .any(|l| l.split_whitespace().nth(1) == mnt.to_str());
        if mounted {
            let _ = Command::new("fusermount3")
                .args(["-uz", mnt.to_str().unwrap()])
                .output();
        }
        assert!(!mounted, "chfuse mounted the pool without the key");
        assert_ne!(out.status.code(), Some(0));
        assert!(
            text(&out.stderr).contains("EACCES"),
            "{}",
            text(&out.stderr)
        );
    } else {
        chfs_localpool::skip("fuse", "the chfuse part", "/dev/fuse is missing");
    }
    let e = connect(open).err().expect("refused without the key");
    assert_eq!(e.errno(), libc::EACCES, "{e}");
    assert!(e.to_string().contains("CHFS_SECRET_FILE"), "{e}");
    // Nor with a key of another pool.
    let other = sc.dir.path().join("other.key");
    std::fs::write(
        &other,
        chfs_proto::handshake::Credential::client_key_file(b"another pool"),
    )
    .unwrap();
    let e = connect(&[
        ("CHFS_SERVER", &servers),
        ("CHFS_SECRET_FILE", other.to_str().unwrap()),
    ])
    .err()
    .expect("refused with another pool's key");
    assert_eq!(e.errno(), libc::EACCES, "{e}");

    // With the exported key: write, list, read.
    let e = envs(&env);
    let out = run(&chstagein, &[input_s], &e);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = run(&bin("chfind"), &["/", "-type", "f"], &e);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), input_s);
    let c = connect(&e).expect("the key lets the job in");
    let fd = c.open(input_s, libc::O_RDONLY, 0).unwrap();
    let mut back = vec![0u8; payload.len() + 1];
    assert_eq!(c.read(fd, &mut back).unwrap(), payload.len());
    assert_eq!(&back[..payload.len()], &payload[..]);
    c.close(fd).unwrap();
    let out = run(&chfs, &["sync"], &e);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    // ...but not stop the pool or move its files: EPERM, servers up.
    let err = c.shutdown_servers().unwrap_err();
    assert_eq!(err.errno(), libc::EPERM, "{err}");
    let err = c.rebalance().unwrap_err();
    assert_eq!(err.errno(), libc::EPERM, "{err}");
    drop(c);
    // chfsctl stop holding only the key (not the -c of start): refused.
    let wrong = sc.dir.path().join("wrong");
    let out = run(
        &ctl,
        &["-c", wrong.to_str().unwrap(), "--timeout", "5", "stop"],
        &e,
    );
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("refused to stop") && err.contains("EPERM"),
        "{err}"
    );
    for p in &pids {
        assert!(chfsd_alive(*p), "pid {p} still serves");
    }

    // Join: a chfsd started by hand without the secret is refused, and so
    // is one given the client key (what a job's environment holds).
    let first = servers.split(',').next().unwrap();
    let join = ["--host", "127.0.0.1:0", "--join", first];
    let (code, err) = chfsd_by_hand(&join, &[]);
    assert_ne!(code, Some(0));
    assert!(
        err.contains("cannot join") && err.contains("EACCES"),
        "{err}"
    );
    let (code, err) = chfsd_by_hand(&join, &[("CHFS_SECRET_FILE", key_file)]);
    assert_ne!(code, Some(0));
    assert!(err.contains("client key"), "{err}");
    let c = connect(&e).unwrap();
    assert_eq!(c.servers().len(), 2, "{:?}", c.servers());
    drop(c);
    let out = run(&bin("chlist"), &[], &e);
    assert_eq!(text(&out.stdout).lines().count(), 2);

    // chfsctl with the -c of start stops the pool (the job's environment
    // holds the key only: chfsctl uses the secret in the scratch
    // directory), and clean removes the secret and the key.
    let out = run(&ctl, &[&a[..], &["stop"]].concat(), &e);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    for p in &pids {
        assert!(!chfsd_alive(*p), "pid {p} still runs");
    }
    let out = run(&ctl, &[&a[..], &["-v", "clean"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!sc.scratch().exists(), "secret and key removed");
}

#[test]
fn no_secret_warns_and_leaves_the_pool_open() {
    let sc = Scratch::new();
    let s = sc.s();
    let chfsd = chfsd();
    let ctl = bin("chfsctl");
    let a = ["-c", &s, "--chfsd", chfsd.to_str().unwrap()];
    // What an earlier pool left in the scratch directory is removed.
    std::fs::create_dir_all(sc.scratch()).unwrap();
    for f in ["chfs.secret", "chfs.client.key"] {
        std::fs::write(sc.scratch().join(f), "stale\n").unwrap();
    }
    let out = run(&ctl, &[&a[..], &["--no-secret", "start"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("warning")
            && err.contains("--no-secret")
            && err.contains("open to every local and remote process"),
        "{err}"
    );
    for f in ["chfs.secret", "chfs.client.key"] {
        assert!(!sc.scratch().join(f).exists(), "{f} left");
    }
    // A shell that held an earlier pool's key forgets it.
    let sh = Command::new("sh")
        .args([
            "-c",
            r#"eval "$1"; echo "file=${CHFS_SECRET_FILE-unset} secret=${CHFS_SECRET-unset}""#,
            "sh",
            &text(&out.stdout),
        ])
        .env("CHFS_SECRET_FILE", "/old/key")
        .env("CHFS_SECRET", "old")
        .output()
        .unwrap();
    assert_eq!(text(&sh.stdout), "file=unset secret=unset\n");
    let env = eval_env(&text(&out.stdout));
    assert!(var(&env, "CHFS_SECRET_FILE").is_none());
    let servers = var(&env, "CHFS_SERVER").unwrap().to_string();
    let pids = recorded_pids(&sc.scratch());

    // Any process gets in, and may even stop the pool.
    let c = connect(&[("CHFS_SERVER", &servers)]).expect("an open pool");
    let fd = c.create("/open", libc::O_WRONLY, 0o644).unwrap();
    c.write(fd, b"anyone").unwrap();
    c.close(fd).unwrap();
    let out = run(&bin("chfind"), &["/"], &[("CHFS_SERVER", &servers)]);
    assert!(text(&out.stdout).lines().any(|l| l == "/open"));
    c.shutdown_servers().unwrap();
    drop(c);
    let t = Instant::now();
    while pids.iter().any(|p| chfsd_alive(*p)) {
        assert!(t.elapsed() < Duration::from_secs(10), "servers stopped");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = run(&ctl, &[&a[..], &["clean"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    // --secret is still accepted (a secret is the default); with
    // --no-secret it is a contradiction.
    let out = run(
        &ctl,
        &[&a[..], &["--secret", "--no-secret", "start"]].concat(),
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("cannot be used with"));
}

#[test]
fn adding_servers_takes_the_pool_secret() {
    // Two pools' worth of scratch directories on this host: the pool's
    // (-c S1) and the added server's (-c S2).
    let sc1 = Scratch::new();
    let sc2 = Scratch::new();
    let (s1, s2) = (sc1.s(), sc2.s());
    let chfsd = chfsd();
    let ctl = bin("chfsctl");
    let d = chfsd.to_str().unwrap();
    // --secret, which asked for a secret before it was the default, is
    // still accepted.
    let out = run(&ctl, &["-c", &s1, "--chfsd", d, "--secret", "start"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let env = eval_env(&text(&out.stdout));
    let e = envs(&env);

    // The job's environment (the client key) cannot grow the pool.
    let out = run(&ctl, &["-c", &s2, "--chfsd", d, "-A", "start"], &e);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("client key") && err.contains("-c"), "{err}");
    assert!(recorded_pids(&sc2.scratch()).is_empty());

    // With the pool secret (the first pool's file) the new server joins
    // and gets the secret and the key in its own scratch directory.
    let secret = sc1.scratch().join("chfs.secret");
    let mut e2 = e.clone();
    e2.retain(|(k, _)| *k != "CHFS_SECRET_FILE");
    e2.push(("CHFS_SECRET_FILE", secret.to_str().unwrap()));
    let out = run(&ctl, &["-c", &s2, "--chfsd", d, "-A", "start"], &e2);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let env3 = eval_env(&text(&out.stdout));
    assert_eq!(var(&env3, "CHFS_SERVER").unwrap().split(',').count(), 2);
    assert_eq!(
        std::fs::read(sc2.scratch().join("chfs.secret")).unwrap(),
        std::fs::read(&secret).unwrap()
    );
    assert_eq!(
        std::fs::read(var(&env3, "CHFS_SECRET_FILE").unwrap()).unwrap(),
        std::fs::read(var(&env, "CHFS_SECRET_FILE").unwrap()).unwrap(),
        "the same pool, the same client key"
    );
    let c = connect(&envs(&env3)).unwrap();
    assert_eq!(c.servers().len(), 2);
    drop(c);

    // Stop through the first scratch directory: its server by PID and the
    // pool (the added server too) through its secret.
    let pids: Vec<u32> = [&sc1, &sc2]
        .iter()
        .flat_map(|s| recorded_pids(&s.scratch()))
        .collect();
    assert_eq!(pids.len(), 2);
    let out = run(&ctl, &["-c", &s1, "stop"], &envs(&env3));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // The first by its recorded PID: gone when stop returns; the added one
    // (recorded in the other scratch directory) once its port closed, and
    // its process ends right after.
    assert!(!chfsd_alive(pids[0]), "pid {} still runs", pids[0]);
    assert!(chfsd_ends(pids[1]), "pid {} still runs", pids[1]);
}

#[test]
fn no_launcher_command_line_carries_the_secret() {
    // A remote shell that records every command line it is given, then
    // runs the command here: what ssh (and, with the same scripts, mpirun
    // and srun) would put on the hosts' command lines.
    let sc = Scratch::new();
    let s = sc.s();
    let log = sc.dir.path().join("rsh.log");
    let rsh = sc.dir.path().join("fake-rsh");
    std::fs::write(
        &rsh,
        format!(
            "#!/bin/sh\nprintf '%s\\n' \"$*\" >> '{}'\nshift\nexec sh -c \"$1\"\n",
            log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&rsh, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let hf = sc.dir.path().join("hosts");
    std::fs::write(&hf, "localhost\n").unwrap();
    let chfsd = chfsd();
    let ctl = bin("chfsctl");
    let a = [
        "-h",
        hf.to_str().unwrap(),
        "--rsh",
        rsh.to_str().unwrap(),
        "-c",
        &s,
        "--chfsd",
        chfsd.to_str().unwrap(),
        "-n",
        "2",
    ];
    let out = run(&ctl, &[&a[..], &["start"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let env = eval_env(&text(&out.stdout));
    let secret = std::fs::read_to_string(sc.scratch().join("chfs.secret")).unwrap();
    let key = std::fs::read_to_string(sc.scratch().join("chfs.client.key")).unwrap();
    let c = connect(&envs(&env)).expect("the pool started through the remote shell");
    assert_eq!(c.servers().len(), 2);
    drop(c);
    let out = run(&ctl, &[&a[..], &["stop"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let lines = std::fs::read_to_string(&log).unwrap();
    assert!(
        lines.contains("chfs.secret"),
        "the secret was placed: {lines}"
    );
    assert!(lines.contains("--secret-file"), "{lines}");
    assert!(
        !lines.contains(secret.trim()),
        "the secret on a command line"
    );
    assert!(
        !lines.contains(&key[16..80]),
        "the client key on a command line"
    );
}
