//! Several hosts on this machine: network namespaces joined by a bridge,
//! each with its own sshd (throwaway keys), driven by chfsctl through real
//! ssh. Needs root, `ip netns` and openssh-server; skipped (with the reason
//! printed) otherwise. Everything it creates is removed on drop, even when
//! the test fails: servers by recorded PID, sshd by PID, namespaces, the
//! bridge and the temporary directory.

mod common;

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const SSHD: &str = "/usr/sbin/sshd";

fn sh(cmd: &[&str]) -> Result<(), String> {
    let out = Command::new(cmd[0])
        .args(&cmd[1..])
        .output()
        .map_err(|e| format!("{}: {e}", cmd.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "{}: {}",
            cmd.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// The simulated cluster.
struct Net {
    tmp: tempfile::TempDir,
    bridge: Option<String>,
    namespaces: Vec<String>,
    sshd: Vec<Child>,
    hosts: Vec<String>,
    subnet: String,
}

impl Drop for Net {
    fn drop(&mut self) {
        for c in &mut self.sshd {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in &self.namespaces {
            let _ = sh(&["ip", "netns", "del", ns]);
        }
        if let Some(b) = &self.bridge {
            let _ = sh(&["ip", "link", "del", b]);
        }
    }
}

fn skip_reason() -> Option<String> {
    // SAFETY: geteuid cannot fail and touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (network namespaces need root)".into());
    }
    if Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        return Some("`ip netns` is not available".into());
    }
    if !Path::new(SSHD).exists() || Command::new("ssh").arg("-V").output().is_err() {
        return Some("openssh-server/ssh not installed (apt-get install openssh-server)".into());
    }
    None
}

impl Net {
    /// `n` hosts at 10.201.X.11.. (X from this process id), each in its own
    /// namespace with an sshd.
    fn new(n: usize) -> Result<Net, String> {
        let id = std::process::id();
        // A /24 not used on this machine (another run may hold one).
        let used = Command::new("ip")
            .args(["-4", "-o", "addr"])
            .output()
            .map(|o| text(&o.stdout))
            .unwrap_or_default();
        let x = (0..200)
            .map(|k| 20 + (id + k) % 200)
            .find(|x| !used.contains(&format!("10.201.{x}.")))
            .ok_or("no free 10.201.X.0/24 subnet")?;
        let mut net = Net {
            tmp: tempfile::Builder::new()
                .prefix("chfsctl-netns-")
                .tempdir()
                .map_err(|e| e.to_string())?,
            bridge: None,
            namespaces: Vec::new(),
            sshd: Vec::new(),
            hosts: Vec::new(),
            subnet: format!("10.201.{x}"),
        };
        let t = net.tmp.path().to_path_buf();
        let p = |f: &str| t.join(f).to_string_lossy().into_owned();
        for k in ["hostkey", "userkey"] {
            sh(&["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", &p(k)])?;
        }
        std::fs::copy(p("userkey.pub"), p("authorized_keys")).map_err(|e| e.to_string())?;
        std::fs::write(
            p("ssh_config"),
            format!(
                "Host *\n  User root\n  IdentityFile {}\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n",
                p("userkey")
            ),
        )
        .map_err(|e| e.to_string())?;
        std::fs::create_dir_all("/run/sshd").map_err(|e| e.to_string())?;
        let bridge = format!("chb{id}");
        sh(&["ip", "link", "add", &bridge, "type", "bridge"])?;
        net.bridge = Some(bridge.clone());
        sh(&[
            "ip",
            "addr",
            "add",
            &format!("{}.1/24", net.subnet),
            "dev",
            &bridge,
        ])?;
        sh(&["ip", "link", "set", &bridge, "up"])?;
        for k in 1..=n {
            let ns = format!("chfsct{id}h{k}");
            sh(&["ip", "netns", "add", &ns])?;
            net.namespaces.push(ns.clone());
            let veth = format!("chv{id}h{k}");
            sh(&[
                "ip", "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ])?;
            sh(&["ip", "link", "set", &veth, "master", &bridge, "up"])?;
            let addr = format!("{}.{}", net.subnet, 10 + k);
            sh(&[
                "ip",
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                "eth0",
            ])?;
            sh(&["ip", "-n", &ns, "link", "set", "eth0", "up"])?;
            sh(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
            let cfg = p(&format!("sshd_config{k}"));
            std::fs::write(
                &cfg,
                format!(
                    "Port 22\nListenAddress {addr}\nHostKey {}\nAuthorizedKeysFile {}\nPermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPidFile none\n",
                    p("hostkey"),
                    p("authorized_keys")
                ),
            )
            .map_err(|e| e.to_string())?;
            let log =
                std::fs::File::create(p(&format!("sshd{k}.log"))).map_err(|e| e.to_string())?;
            let child = Command::new("ip")
                .args(["netns", "exec", &ns, SSHD, "-D", "-e", "-f", &cfg])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .map_err(|e| format!("sshd: {e}"))?;
            net.sshd.push(child);
            net.hosts.push(addr.clone());
            let sa: SocketAddr = format!("{addr}:22").parse().unwrap();
            let start = Instant::now();
            while TcpStream::connect_timeout(&sa, Duration::from_millis(200)).is_err() {
                if start.elapsed() > Duration::from_secs(10) {
                    return Err(format!("sshd in {ns} did not start"));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(net)
    }

    fn rsh(&self) -> String {
        format!("ssh -F {}", self.tmp.path().join("ssh_config").display())
    }

    fn hostfile(&self, name: &str, hosts: &[&str]) -> PathBuf {
        let f = self.tmp.path().join(name);
        std::fs::write(
            &f,
            hosts.iter().map(|h| format!("{h}\n")).collect::<String>(),
        )
        .unwrap();
        f
    }

    /// Runs `cmd` on `host` through ssh with the pool's environment.
    fn on(&self, host: &str, env: &[(String, String)], cmd: &str) -> std::process::Output {
        let vars: String = env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
        let out = Command::new("ssh")
            .args(["-F", self.tmp.path().join("ssh_config").to_str().unwrap()])
            .args(["-o", "BatchMode=yes", host])
            .arg(format!("{vars}{cmd}"))
            .output()
            .unwrap();
        eprintln!(
            "[{host}] $ {cmd}\n  -> {:?}\n  {}\n  {}",
            out.status.code(),
            text(&out.stdout).trim_end(),
            text(&out.stderr).trim_end()
        );
        out
    }
}

/// Run on a simulated host (through ssh) by the test below: writes or reads
/// a file with the client library, as a job's process would.
#[test]
#[ignore = "helper run by multi_host_pool_over_ssh on the simulated hosts"]
fn remote_io_helper() {
    let Ok(op) = std::env::var("CHFS_TEST_IO") else {
        return;
    };
    let c = chfs_client::Client::from_env().unwrap();
    let data: Vec<u8> = (0..150_000u32).map(|i| (i * 7 % 253) as u8).collect();
    let (what, path) = op.split_once(':').unwrap();
    match what {
        "write" => {
            let fd = c.create(path, libc::O_WRONLY, 0o644).unwrap();
            c.write(fd, &data).unwrap();
            c.close(fd).unwrap();
        }
        "read" => {
            let fd = c.open(path, libc::O_RDONLY, 0).unwrap();
            let mut b = vec![0u8; data.len() + 10];
            let n = c.read(fd, &mut b).unwrap();
            assert_eq!(&b[..n], &data[..], "content read on this host");
            println!("READ-OK {n}");
        }
        _ => panic!("bad op {op}"),
    }
}

#[test]
fn multi_host_pool_over_ssh() {
    if let Some(why) = skip_reason() {
        chfs_localpool::skip("netns", "multi_host_pool_over_ssh", &why);
        return;
    }
    let net = match Net::new(3) {
        Ok(n) => n,
        Err(e) => panic!("cannot build the simulated cluster: {e}"),
    };
    // Dropped before `net`: kills any server left behind by recorded PID.
    let sc = Scratch::new();
    let s = sc.s();
    let chfsd = chfsd();
    let ctl = bin("chfsctl");
    let rsh = net.rsh();
    let (h1, h2, h3) = (
        net.hosts[0].as_str(),
        net.hosts[1].as_str(),
        net.hosts[2].as_str(),
    );
    let hf12 = net.hostfile("hosts12", &[h1, h2]);
    let hf3 = net.hostfile("hosts3", &[h3]);
    let hf123 = net.hostfile("hosts123", &[h1, h2, h3]);
    let common = |hf: &Path| -> Vec<String> {
        [
            "-h",
            hf.to_str().unwrap(),
            "--rsh",
            &rsh,
            "-c",
            &s,
            "--chfsd",
            chfsd.to_str().unwrap(),
            "--timeout",
            "5",
        ]
        .iter()
        .map(|x| x.to_string())
        .collect()
    };
    let ctl_run = |hf: &Path, extra: &[&str], env: &[(String, String)]| {
        let mut a = common(hf);
        a.extend(extra.iter().map(|x| x.to_string()));
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        run(
            &ctl,
            &a,
            &env.iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect::<Vec<_>>(),
        )
    };

    // start on two hosts (with a per-pool secret, the default).
    let out = ctl_run(&hf12, &["-s", "256M", "start"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let env = eval_env(&text(&out.stdout));
    let servers = var(&env, "CHFS_SERVER").unwrap().to_string();
    let addrs: Vec<&str> = servers.split(',').collect();
    assert_eq!(addrs.len(), 2, "{servers}");
    assert!(
        addrs.iter().any(|a| a.starts_with(&format!("{h1}:"))),
        "{servers}"
    );
    assert!(
        addrs.iter().any(|a| a.starts_with(&format!("{h2}:"))),
        "{servers}"
    );
    assert!(var(&env, "CHFS_SECRET_FILE").is_some());
    // Without the client key a process of a host is refused.
    let out = net.on(
        h2,
        &[("CHFS_SERVER".to_string(), servers.clone())],
        &bin("chlist").display().to_string(),
    );
    assert!(
        !out.status.success() && text(&out.stderr).contains("EACCES"),
        "{}",
        text(&out.stderr)
    );

    // Write on host 1, read on host 2 (client library and tools, through
    // ssh inside each namespace).
    let me = std::env::current_exe().unwrap();
    let helper = format!(
        "{} --ignored --exact remote_io_helper --nocapture",
        me.display()
    );
    let mut wenv = env.clone();
    wenv.push(("CHFS_TEST_IO".into(), "write:/from-h1.dat".into()));
    let out = net.on(h1, &wenv, &helper);
    assert!(out.status.success());
    let mut renv = env.clone();
    renv.push(("CHFS_TEST_IO".into(), "read:/from-h1.dat".into()));
    let out = net.on(h2, &renv, &helper);
    assert!(out.status.success() && text(&out.stdout).contains("READ-OK 150000"));
    let out = net.on(
        h1,
        &env,
        &format!("{} -p /made/on/h1", bin("chmkdir").display()),
    );
    assert!(out.status.success());
    let out = net.on(h2, &env, &format!("{} / -type d", bin("chfind").display()));
    assert!(text(&out.stdout).lines().any(|l| l == "/made/on/h1"));

    // status names every server with its host.
    let out = ctl_run(&hf12, &["status"], &env);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert_eq!(
        table.lines().filter(|l| l.contains(" up ")).count(),
        2,
        "{table}"
    );
    assert!(table.contains(&format!("{h1}#0")) && table.contains(&format!("{h2}#0")));

    // -A: a third host joins the running pool.
    let out = ctl_run(&hf3, &["-A", "start"], &env);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let env3 = eval_env(&text(&out.stdout));
    let servers3 = var(&env3, "CHFS_SERVER").unwrap().to_string();
    assert_eq!(servers3.split(',').count(), 3, "{servers3}");
    assert!(servers3.contains(&format!("{h3}:")));
    let out = net.on(h3, &env3, &bin("chlist").display().to_string());
    assert_eq!(text(&out.stdout).lines().count(), 3);
    let mut wenv = env3.clone();
    wenv.push(("CHFS_TEST_IO".into(), "write:/from-h3.dat".into()));
    assert!(net.on(h3, &wenv, &helper).status.success());
    let mut renv = env3.clone();
    renv.push(("CHFS_TEST_IO".into(), "read:/from-h3.dat".into()));
    let out = net.on(h1, &renv, &helper);
    assert!(text(&out.stdout).contains("READ-OK 150000"));
    // -A rebalanced: what was written before the host joined is found
    // through the grown pool, from the new host too.
    let mut renv = env3.clone();
    renv.push(("CHFS_TEST_IO".into(), "read:/from-h1.dat".into()));
    let out = net.on(h3, &renv, &helper);
    assert!(text(&out.stdout).contains("READ-OK 150000"));
    let out = net.on(h3, &env3, &format!("{} / -type d", bin("chfind").display()));
    assert!(text(&out.stdout).lines().any(|l| l == "/made/on/h1"));
    let out = ctl_run(&hf3, &["rebalance"], &env3);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("3 server(s)"));

    // A host that cannot be reached: a clear error naming it, found when
    // the secret is handed out, before any server starts; the secret
    // given to the reachable host is removed again.
    let sc2 = Scratch::new();
    let s2 = sc2.s();
    let dead = format!("{}.99", net.subnet);
    let hfd = net.hostfile("hosts-dead", &[h1, &dead]);
    let out = run(
        &ctl,
        &[
            "-h",
            hfd.to_str().unwrap(),
            "--rsh",
            &rsh,
            "-c",
            &s2,
            "--chfsd",
            chfsd.to_str().unwrap(),
            "--timeout",
            "2",
            "start",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains(&format!("host {dead}")), "{err}");
    assert!(err.contains("unreachable"), "{err}");
    assert!(out.stdout.is_empty());
    assert!(
        recorded_pids(&sc2.scratch()).is_empty(),
        "no leftover server"
    );
    for f in ["chfs.secret", "chfs.client.key"] {
        assert!(!sc2.scratch().join(f).exists(), "{f} left behind");
    }

    // stop: all three hosts, every recorded process gone.
    let pids = recorded_pids(&sc.scratch());
    assert_eq!(pids.len(), 3);
    let out = ctl_run(&hf123, &["stop"], &env3);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    for p in &pids {
        assert!(!chfsd_alive(*p), "pid {p} still runs");
    }
    let out = ctl_run(&hf123, &["clean"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!sc.scratch().exists());
}
