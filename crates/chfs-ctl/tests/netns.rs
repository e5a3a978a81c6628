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
    /// One simulated cluster at a time in this process: its names (bridge,
    /// namespaces, veths) come from the process id, so the tests of this
    /// binary running in parallel collided ("RTNETLINK answers: File
    /// exists" in CI). Released after `drop` removed everything.
    _one: std::sync::MutexGuard<'static, ()>,
}

/// See [`Net::_one`].
static ONE_NET: std::sync::Mutex<()> = std::sync::Mutex::new(());

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
        // A test that failed while holding it poisoned it; the names are
        // free again once its Net was dropped.
        let one = ONE_NET.lock().unwrap_or_else(|e| e.into_inner());
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
            _one: one,
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

/// The content of a file the helper writes: `len` bytes (150,000 unless
/// `CHFS_TEST_SIZE` says otherwise), a pattern of `seed`.
fn helper_data(seed: u32) -> Vec<u8> {
    let len: u32 = std::env::var("CHFS_TEST_SIZE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(150_000);
    (0..len).map(|i| ((i * 7 + seed) % 253) as u8).collect()
}

/// Run on a simulated host (through ssh) by the tests below: writes,
/// reads or renames a file with the client library, as a job's process
/// would; or (`probe:HOST`) asks the server of host HOST for its status and
/// the entry of a path it owns for its metadata, and prints how each
/// ended and how long it took.
#[test]
#[ignore = "helper run by multi_host_pool_over_ssh on the simulated hosts"]
fn remote_io_helper() {
    let Ok(op) = std::env::var("CHFS_TEST_IO") else {
        return;
    };
    let c = chfs_client::Client::from_env().unwrap();
    let (what, path) = op.split_once(':').unwrap();
    let seed = path.len() as u32;
    match what {
        "write" => {
            let data = helper_data(seed);
            let fd = c.create(path, libc::O_WRONLY, 0o644).unwrap();
            assert_eq!(c.write(fd, &data).unwrap(), data.len());
            c.close(fd).unwrap();
        }
        "read" => {
            let data = helper_data(seed);
            let fd = c.open(path, libc::O_RDONLY, 0).unwrap();
            let mut b = vec![0u8; data.len() + 10];
            let n = c.read(fd, &mut b).unwrap();
            assert!(b[..n] == data[..], "content read on this host");
            println!("READ-OK {n}");
        }
        "readas" => {
            // readas:/NEW:/OLD reads /NEW expecting what was written as /OLD.
            let (path, old) = path.split_once(':').unwrap();
            let data = helper_data(old.len() as u32);
            let fd = c.open(path, libc::O_RDONLY, 0).unwrap();
            let mut b = vec![0u8; data.len() + 10];
            let n = c.read(fd, &mut b).unwrap();
            assert!(b[..n] == data[..], "content read on this host");
            println!("READ-OK {n}");
        }
        "rename" => {
            let (from, to) = path.split_once(':').unwrap();
            c.rename(from, to).unwrap();
            println!("RENAMED");
        }
        "probe" => {
            let host = path;
            let servers = c.servers();
            let idx = servers
                .iter()
                .position(|a| a.contains(&format!("{host}:")))
                .unwrap_or_else(|| panic!("no server of {host} in {servers:?}"));
            let p = (0..10_000)
                .map(|i| format!("/probe{i}"))
                .find(|p| c.entry_servers(p).unwrap().0 == idx)
                .expect("a path the server owns");
            if let Ok(sync) = std::env::var("CHFS_TEST_SYNC") {
                // Sessions open with every server (the host is there),
                // then the test takes it away and says go.
                let sync = std::path::Path::new(&sync);
                assert!(c.server_status().iter().all(|(_, r)| r.is_ok()));
                assert_eq!(c.stat(&p).unwrap_err().errno(), libc::ENOENT);
                std::fs::write(sync.join("ready"), b"").unwrap();
                let t = Instant::now();
                while !sync.join("go").exists() {
                    assert!(t.elapsed() < Duration::from_secs(60), "no go");
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            let t = Instant::now();
            let status = c.server_status();
            let (_, r) = &status[idx];
            println!(
                "STATUS {} {}",
                r.as_ref().err().map_or(0, |e| e.errno()),
                t.elapsed().as_millis()
            );
            let t = Instant::now();
            let r = c.stat(&p);
            println!(
                "STAT {} {}",
                r.err().map_or(0, |e| e.errno()),
                t.elapsed().as_millis()
            );
        }
        _ => panic!("bad op {op}"),
    }
}

/// `probe:HOST` run on `on` through the helper: the errno and
/// milliseconds of the status and the stat it printed. With `mid`, the
/// helper first opens its sessions with every server, then `mid` runs
/// (taking the host away), then the helper probes.
fn probe(
    net: &Net,
    on: &str,
    env: &[(String, String)],
    helper: &str,
    host: &str,
    mid: Option<&dyn Fn()>,
) -> Vec<(i32, u64)> {
    let mut penv = env.to_vec();
    penv.push(("CHFS_TEST_IO".into(), format!("probe:{host}")));
    let out = match mid {
        None => net.on(on, &penv, helper),
        Some(mid) => {
            let sync = tempfile::Builder::new()
                .prefix("chfs-probe-")
                .tempdir()
                .unwrap();
            penv.push((
                "CHFS_TEST_SYNC".into(),
                sync.path().to_string_lossy().into_owned(),
            ));
            std::thread::scope(|s| {
                let run = s.spawn(|| net.on(on, &penv, helper));
                let t = Instant::now();
                while !sync.path().join("ready").exists() && !run.is_finished() {
                    assert!(t.elapsed() < Duration::from_secs(60), "helper not ready");
                    std::thread::sleep(Duration::from_millis(20));
                }
                mid();
                std::fs::write(sync.path().join("go"), b"").unwrap();
                run.join().unwrap()
            })
        }
    };
    assert!(out.status.success(), "the probe failed");
    let got: Vec<(i32, u64)> = text(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("STATUS ") || l.starts_with("STAT "))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[1].parse().unwrap(), f[2].parse().unwrap())
        })
        .collect();
    assert_eq!(got.len(), 2, "{}", text(&out.stdout));
    got
}

#[test]
fn multi_host_pool_over_ssh() {
    multi_host_pool(None);
}

/// The same over libfabric's tcp provider (`chfsctl -p ofi+tcp`): the
/// servers are known by `ofi+tcp://IP:PORT` addresses of their hosts,
/// clients of other hosts move 1 MiB chunks by RMA, servers forward to
/// each other across hosts (a rebalance's and a rename's moved chunks),
/// and a host that goes away gives an errno within the clients' timeout.
#[test]
fn multi_host_pool_over_ssh_ofi_tcp() {
    if common::fabric_built("multi_host_pool_over_ssh_ofi_tcp") {
        multi_host_pool(Some("ofi+tcp"));
    }
}

fn multi_host_pool(protocol: Option<&str>) {
    let name = match protocol {
        None => "multi_host_pool_over_ssh".to_string(),
        Some(p) => format!("multi_host_pool_over_ssh over {p}"),
    };
    if let Some(why) = skip_reason() {
        chfs_localpool::skip("netns", &name, &why);
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
    let mut start = vec!["-s", "256M"];
    if let Some(p) = protocol {
        start.extend(["-p", p]);
    }
    start.push("start");
    let out = ctl_run(&hf12, &start, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let env = eval_env(&text(&out.stdout));
    let servers = var(&env, "CHFS_SERVER").unwrap().to_string();
    let addrs: Vec<&str> = servers.split(',').collect();
    assert_eq!(addrs.len(), 2, "{servers}");
    // Each server at its own host's address (of its fabric endpoint, not
    // of a loopback or another interface).
    let scheme = protocol.map_or(String::new(), |p| format!("{p}://"));
    for h in [h1, h2] {
        assert!(
            addrs
                .iter()
                .any(|a| a.starts_with(&format!("{scheme}{h}:"))),
            "{servers}"
        );
    }
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
    // Over the fabric: 1 MiB chunks, so that data moves by RMA (a
    // chunk's data is larger than a message), in files that span servers.
    let mut env = env;
    if protocol.is_some() {
        env.push(("CHFS_CHUNK_SIZE".into(), (1 << 20).to_string()));
    }
    let mut wenv = env.clone();
    wenv.push(("CHFS_TEST_IO".into(), "write:/from-h1.dat".into()));
    let out = net.on(h1, &wenv, &helper);
    assert!(out.status.success());
    let mut renv = env.clone();
    renv.push(("CHFS_TEST_IO".into(), "read:/from-h1.dat".into()));
    let out = net.on(h2, &renv, &helper);
    assert!(out.status.success() && text(&out.stdout).contains("READ-OK 150000"));
    if protocol.is_some() {
        // Files of several chunks over both servers, and of one chunk
        // larger than a message, written on one host and read on the other.
        for (size, path) in [
            (3 * (1 << 20) + 100, "/big-h1.dat"),
            (200 << 10, "/mid-h1.dat"),
        ] {
            let mut wenv = env.clone();
            wenv.push(("CHFS_TEST_SIZE".into(), size.to_string()));
            wenv.push(("CHFS_TEST_IO".into(), format!("write:{path}")));
            assert!(net.on(h1, &wenv, &helper).status.success());
            let mut renv = env.clone();
            renv.push(("CHFS_TEST_SIZE".into(), size.to_string()));
            renv.push(("CHFS_TEST_IO".into(), format!("read:{path}")));
            let out = net.on(h2, &renv, &helper);
            assert!(text(&out.stdout).contains(&format!("READ-OK {size}")));
        }
    }
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
    let mut join = vec!["-A"];
    if let Some(p) = protocol {
        join.extend(["-p", p]);
    }
    join.push("start");
    let out = ctl_run(&hf3, &join, &env);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let mut env3 = eval_env(&text(&out.stdout));
    if protocol.is_some() {
        env3.push(("CHFS_CHUNK_SIZE".into(), (1 << 20).to_string()));
    }
    let servers3 = var(&env3, "CHFS_SERVER").unwrap().to_string();
    assert_eq!(servers3.split(',').count(), 3, "{servers3}");
    assert!(servers3.contains(&format!("{scheme}{h3}:")), "{servers3}");
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
    if protocol.is_some() {
        // The rebalance moved 1 MiB chunks between hosts (AdoptChunk);
        // renames move them again to the new names' owners (PutChunk),
        // server to server across hosts; all read back from another host.
        for (size, path) in [
            (3 * (1 << 20) + 100, "/big-h1.dat"),
            (200 << 10, "/mid-h1.dat"),
        ] {
            let to = path.replace("-h1", "-renamed");
            let mut e = env3.clone();
            e.push(("CHFS_TEST_SIZE".into(), size.to_string()));
            e.push(("CHFS_TEST_IO".into(), format!("readas:{path}:{path}")));
            let out = net.on(h3, &e, &helper);
            assert!(text(&out.stdout).contains(&format!("READ-OK {size}")));
            let mut e = env3.clone();
            e.push(("CHFS_TEST_IO".into(), format!("rename:{path}:{to}")));
            assert!(net.on(h2, &e, &helper).status.success());
            let mut e = env3.clone();
            e.push(("CHFS_TEST_SIZE".into(), size.to_string()));
            e.push(("CHFS_TEST_IO".into(), format!("readas:{to}:{path}")));
            let out = net.on(h1, &e, &helper);
            assert!(text(&out.stdout).contains(&format!("READ-OK {size}")));
        }
        // Every server pulled data by RMA (clients' writes, chunks moved
        // to it by its peers).
        let out = ctl_run(&hf123, &["-v", "status"], &env3);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let counters = text(&out.stdout);
        let pulls: Vec<u64> = counters
            .lines()
            .filter_map(|l| l.split(" rma_pulls=").nth(1))
            .map(|v| v.split_whitespace().next().unwrap().parse().unwrap())
            .collect();
        assert!(
            pulls.len() == 3 && pulls.iter().all(|&n| n > 0),
            "{counters}"
        );

        // A host that goes away (its link down, then its server stopped
        // with SIGSTOP): a client on another host gets an errno for what
        // that server holds within its timeout, never a hang; and is
        // served again once the host is back.
        let timeout_ms = 3000;
        let mut penv = env3.clone();
        penv.push(("CHFS_RPC_TIMEOUT_MSEC".into(), timeout_ms.to_string()));
        let ns3 = net.namespaces[2].clone();
        let pid3: u32 = std::fs::read_dir(sc.scratch())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|n| n.starts_with(&format!("chfsd@{h3}@")) && n.ends_with(".pid"))
            .and_then(|n| std::fs::read_to_string(sc.scratch().join(n)).ok())
            .and_then(|p| p.trim().parse().ok())
            .expect("the pid of the server of host 3");
        assert!(chfsd_alive(pid3));
        let within = |what: &str, got: &[(i32, u64)]| {
            for &(errno, ms) in got {
                // (ENOENT: the stat was answered)
                assert!(
                    errno != 0 && errno != libc::ENOENT,
                    "{what}: answered by an unreachable server"
                );
                assert!(
                    ms < timeout_ms + 2000,
                    "{what}: an errno after {ms} ms, timeout {timeout_ms} ms"
                );
            }
        };
        let down = || sh(&["ip", "-n", &ns3, "link", "set", "eth0", "down"]).unwrap();
        let up = || sh(&["ip", "-n", &ns3, "link", "set", "eth0", "up"]).unwrap();
        // SAFETY: signals to the server this test started, by its
        // recorded PID, checked to be a chfsd above.
        let stop = || unsafe { libc::kill(pid3 as i32, libc::SIGSTOP) };
        // SAFETY: as above.
        let cont = || unsafe { libc::kill(pid3 as i32, libc::SIGCONT) };
        let served = |got: &[(i32, u64)]| {
            assert!(
                got.iter()
                    .all(|&(errno, _)| errno == 0 || errno == libc::ENOENT),
                "{got:?}"
            )
        };
        // A client that starts while the host is away (its handshakes),
        // and one whose sessions were open when it went away.
        down();
        let got = probe(&net, h1, &penv, &helper, h3, None);
        up();
        within("link down", &got);
        served(&probe(&net, h2, &penv, &helper, h3, None));
        let got = probe(&net, h1, &penv, &helper, h3, Some(&down));
        up();
        within("link down, sessions open", &got);
        served(&probe(&net, h1, &penv, &helper, h3, None));
        stop();
        let got = probe(&net, h2, &penv, &helper, h3, None);
        cont();
        within("server stopped", &got);
        let got = probe(
            &net,
            h2,
            &penv,
            &helper,
            h3,
            Some(&|| {
                stop();
            }),
        );
        cont();
        within("server stopped, sessions open", &got);
        served(&probe(&net, h1, &penv, &helper, h3, None));
    }

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
    // (A moment to exit after its port closed; not the 10 s of a send
    // to a client gone while the server was stopped, which it waited for.)
    let t = Instant::now();
    for p in &pids {
        while chfsd_alive(*p) && t.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!chfsd_alive(*p), "pid {p} still runs");
    }
    let out = ctl_run(&hf123, &["clean"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!sc.scratch().exists());
}
