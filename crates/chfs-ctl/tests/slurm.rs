//! chfsctl with `--launcher srun` against a real Slurm: a one-node cluster
//! (munged, slurmctld, slurmd from Debian's `slurm-wlm` packages) brought up
//! by the test in a temporary directory, on non-default ports, and torn down
//! by recorded PID.
//!
//! When the cgroup v1 freezer hierarchy is mounted, the cluster tracks
//! processes with `proctrack/cgroup` as production clusters do: every
//! process of a job step, daemons included, is killed when the step ends,
//! so the servers only survive `chfsctl start` if their steps last.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chfs_client::{Client, ClientConfig};
use common::*;

fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"])
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file());
    found
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("0.0.0.0:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A one-node Slurm cluster on this host, with an allocation of the node
/// (as an `salloc` or a batch script has). Its daemons are stopped by PID
/// and the allocation cancelled on drop.
struct Slurm {
    dir: tempfile::TempDir,
    conf: PathBuf,
    host: String,
    job: String,
    cgroup: bool,
    /// munged, slurmctld, slurmd (stopped in reverse order).
    daemons: Vec<(&'static str, Child)>,
    /// One cluster at a time in this test binary: with proctrack/cgroup,
    /// the tasks of a step of one cluster were killed while another
    /// cluster (same node name, same cgroup hierarchy) ran its steps.
    _one_at_a_time: std::sync::MutexGuard<'static, ()>,
}

/// Held by the running cluster (see `Slurm::_one_at_a_time`).
static CLUSTER: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Slurm {
    /// Brings the cluster up; None (with the reason printed) when Slurm is
    /// not installed or this is not root.
    fn start(test: &str) -> Option<Self> {
        let mut bins = Vec::new();
        for b in [
            "munged",
            "slurmctld",
            "slurmd",
            "srun",
            "salloc",
            "scontrol",
            "squeue",
            "sinfo",
        ] {
            match find_program(b) {
                Some(p) => bins.push(p),
                None => {
                    chfs_localpool::skip(
                        "slurm",
                        test,
                        &format!("no {b} (apt-get install slurmd slurmctld slurm-client munge)"),
                    );
                    return None;
                }
            }
        }
        // SAFETY: getuid cannot fail.
        if unsafe { libc::getuid() } != 0 {
            chfs_localpool::skip("slurm", test, "slurmd must run as root to launch job steps");
            return None;
        }
        let one_at_a_time = CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
        let dir = tempfile::Builder::new()
            .prefix("chfs-slurm-")
            .tempdir()
            .unwrap();
        let d = dir.path();
        let host = hostname();
        let mut s = Slurm {
            conf: d.join("slurm.conf"),
            dir,
            host,
            job: String::new(),
            cgroup: Path::new("/sys/fs/cgroup/freezer/tasks").exists(),
            daemons: Vec::new(),
            _one_at_a_time: one_at_a_time,
        };
        let d = s.dir.path().to_path_buf();
        for sub in ["state", "spool", "munge"] {
            std::fs::create_dir(d.join(sub)).unwrap();
        }
        // munged: its own key and socket.
        let key = d.join("munge/munge.key");
        let mut k = vec![0u8; 1024];
        std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom").unwrap(), &mut k)
            .unwrap();
        std::fs::write(&key, &k).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let sock = d.join("munge/munge.sock");
        let p = |x: &Path| x.to_str().unwrap().to_string();
        s.spawn(
            "munged",
            Command::new(&bins[0]).args([
                "-F",
                &format!("--socket={}", p(&sock)),
                &format!("--key-file={}", p(&key)),
                &format!("--pid-file={}", p(&d.join("munge/munged.pid"))),
                &format!("--log-file={}", p(&d.join("munge/munged.log"))),
                &format!("--seed-file={}", p(&d.join("munge/munged.seed"))),
            ]),
        );
        wait_for(Duration::from_secs(10), "munged's socket", || sock.exists());

        let proctrack = if s.cgroup {
            std::fs::write(
                d.join("cgroup.conf"),
                "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nConstrainCores=no\nConstrainRAMSpace=no\n",
            )
            .unwrap();
            "proctrack/cgroup"
        } else {
            "proctrack/linuxproc"
        };
        eprintln!("slurm test cluster with {proctrack} in {}", d.display());
        let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get());
        // Job ids of concurrent test clusters differ (their cgroups too).
        let first_job = 1000 + (std::process::id() % 100_000) * 10;
        let conf = format!(
            "ClusterName=chfstest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock}
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
MailProg=/bin/true
ProctrackType={proctrack}
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
FirstJobId={first_job}
NodeName={host} NodeAddr=127.0.0.1 CPUs={ncpu} State=UNKNOWN
PartitionName=chfs Nodes={host} Default=YES MaxTime=INFINITE State=UP
",
            host = s.host,
            ctld_port = free_port(),
            d_port = free_port(),
            sock = p(&sock),
            dir = p(&d),
        );
        std::fs::write(&s.conf, conf).unwrap();
        let c = p(&s.conf);
        s.spawn(
            "slurmctld",
            Command::new(&bins[1]).args(["-D", "-i", "-f", &c]),
        );
        s.spawn(
            "slurmd",
            Command::new(&bins[2]).args(["-D", "-N", &s.host.clone(), "-f", &c]),
        );
        let host = s.host.clone();
        wait_for(Duration::from_secs(30), "the node to be idle", || {
            let out = s
                .cmd("sinfo")
                .args(["-h", "-n", &host, "-o", "%T"])
                .output();
            out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "idle")
        });
        // An allocation of the node, as a batch job or salloc has.
        let out = s
            .cmd("salloc")
            .args(["--no-shell", "-N", "1", "-w", &host, "-J", "chfsctl-test"])
            .args(["--immediate=20"])
            .output()
            .unwrap();
        let err = text(&out.stderr);
        s.job = err
            .split_whitespace()
            .skip_while(|w| *w != "allocation")
            .nth(1)
            .unwrap_or_else(|| panic!("salloc: {err}"))
            .to_string();
        Some(s)
    }

    fn spawn(&mut self, name: &'static str, cmd: &mut Command) {
        let log = std::fs::File::create(self.dir.path().join(format!("{name}.out"))).unwrap();
        let child = cmd
            .env("SLURM_CONF", &self.conf)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        self.daemons.push((name, child));
    }

    /// A Slurm client command of this cluster, outside the allocation.
    fn cmd(&self, prog: &str) -> Command {
        let mut c = Command::new(find_program(prog).unwrap());
        c.env("SLURM_CONF", &self.conf)
            .env_remove("SLURM_JOB_ID")
            .env_remove("SLURM_JOBID");
        c
    }

    /// The environment of a process inside the allocation.
    fn job_env(&self) -> Vec<(&str, &str)> {
        vec![
            ("SLURM_CONF", self.conf.to_str().unwrap()),
            ("SLURM_JOB_ID", &self.job),
            ("SLURM_JOB_NODELIST", &self.host),
        ]
    }

    /// Running steps of the allocation.
    fn steps(&self) -> Vec<String> {
        let out = self
            .cmd("squeue")
            .args(["-h", "-s", "-j", &self.job, "-o", "%i %j"])
            .output()
            .unwrap();
        text(&out.stdout).lines().map(String::from).collect()
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        if !self.job.is_empty() {
            let _ = self.cmd("scancel").arg(&self.job).output();
            std::thread::sleep(Duration::from_millis(500));
        }
        while let Some((name, mut child)) = self.daemons.pop() {
            // SAFETY: kill(2) on the PID of our own unreaped child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let t = Instant::now();
            while child.try_wait().ok().flatten().is_none() {
                if t.elapsed() > Duration::from_secs(10) {
                    eprintln!("cleanup: {name} (pid {}) ignored SIGTERM", child.id());
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

fn wait_for(limit: Duration, what: &str, mut ok: impl FnMut() -> bool) {
    let t = Instant::now();
    while !ok() {
        assert!(t.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn client(env: &[(String, String)]) -> Client {
    let mut cfg = ClientConfig::from_lookup(|k| var(env, k).map(String::from)).unwrap();
    cfg.rpc_timeout = Duration::from_secs(10);
    Client::connect(cfg).unwrap()
}

#[test]
fn srun_launcher_in_an_allocation() {
    let Some(slurm) = Slurm::start("srun_launcher_in_an_allocation") else {
        return;
    };
    let sc = Scratch::new();
    let s = sc.s();
    let chfsd = chfsd();
    let ctl = bin("chfsctl");
    let chfuse = ctl.with_file_name("chfuse");
    let mnt = sc.dir.path().join("mnt");
    let m = mnt.to_str().unwrap();
    let fuse = chfuse.is_file() && Path::new("/dev/fuse").exists();
    if !fuse {
        eprintln!("no chfuse binary or /dev/fuse: testing without -m");
    }
    let mut a = vec![
        "--launcher",
        "srun",
        "-c",
        &s,
        "--chfsd",
        chfsd.to_str().unwrap(),
    ];
    if fuse {
        a.extend(["-m", m, "--chfuse", chfuse.to_str().unwrap()]);
    }
    let args = |extra: &[&'static str]| [&a[..], extra].concat();
    let job_env = slurm.job_env();

    // Outside an allocation srun would make a job of every command.
    let out = run(
        &ctl,
        &args(&["start"]),
        &[("SLURM_CONF", slurm.conf.to_str().unwrap())],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("SLURM_JOB_ID"));

    // No hostfile: a server on every node of the allocation (here 2 on
    // this one).
    let t = Instant::now();
    let out = run(&ctl, &args(&["-n", "2", "start"]), &job_env);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    eprintln!("chfsctl start through srun: {:?}", t.elapsed());
    let env = eval_env(&text(&out.stdout));
    // Unmount even if an assertion below fails.
    struct Unmount(String);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("fusermount3").args(["-uz", &self.0]).output();
        }
    }
    let _guard = fuse.then(|| Unmount(m.to_string()));
    let servers = var(&env, "CHFS_SERVER").unwrap().to_string();
    assert_eq!(servers.split(',').count(), 2, "{servers}");
    assert!(
        servers.split(',').all(|a| a.starts_with(&slurm.host)),
        "{servers}"
    );
    let secret_file = var(&env, "CHFS_SECRET_FILE").unwrap().to_string();
    let pids = recorded_pids(&sc.scratch());
    assert_eq!(pids.len(), 2);
    // Every server (and chfuse) keeps a step of the job running...
    let steps = slurm.steps();
    assert_eq!(steps.len(), if fuse { 3 } else { 2 }, "{steps:?}");
    // ... and is in it: with proctrack/cgroup, in the step's cgroup.
    if slurm.cgroup {
        for p in &pids {
            let cg = std::fs::read_to_string(format!("/proc/{p}/cgroup")).unwrap();
            let job = format!("/job_{}/step_", slurm.job);
            assert!(
                cg.lines()
                    .any(|l| l.contains(":freezer:") && l.contains(&job)),
                "chfsd {p} runs in a step of job {}: {cg}",
                slurm.job
            );
        }
    }
    // The servers outlive chfsctl and the sruns' return.
    std::thread::sleep(Duration::from_millis(1500));
    for p in &pids {
        assert!(chfsd_alive(*p), "chfsd {p} survived its launch");
    }
    let c = client(&env);
    assert_eq!(c.server_count(), 2);
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let fd = c.create("/via-srun", libc::O_WRONLY, 0o644).unwrap();
    c.write(fd, &payload).unwrap();
    c.close(fd).unwrap();
    if fuse {
        assert_eq!(std::fs::read(mnt.join("via-srun")).unwrap(), payload);
        std::fs::write(mnt.join("from-mount"), b"through chfuse").unwrap();
    }
    let fd = c.open("/via-srun", libc::O_RDONLY, 0).unwrap();
    let mut back = vec![0u8; payload.len()];
    assert_eq!(c.read(fd, &mut back).unwrap(), payload.len());
    assert_eq!(back, payload);
    c.close(fd).unwrap();
    if fuse {
        let fd = c.open("/from-mount", libc::O_RDONLY, 0).unwrap();
        let mut b = [0u8; 64];
        let n = c.read(fd, &mut b).unwrap();
        assert_eq!(&b[..n], b"through chfuse");
        c.close(fd).unwrap();
    }
    drop(c);

    // status through srun steps.
    let out = run(
        &ctl,
        &args(&["status"]),
        &[&job_env[..], &[("CHFS_SECRET_FILE", &secret_file)]].concat(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert_eq!(table.lines().filter(|l| l.contains(" up ")).count(), 2);
    for p in &pids {
        assert!(table.contains(&p.to_string()), "{table}");
    }

    // A second start is refused (the step's exit status reaches chfsctl)
    // and harms nothing.
    let out = run(&ctl, &args(&["start"]), &job_env);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("already runs"));
    for p in &pids {
        assert!(chfsd_alive(*p));
    }

    // stop: servers gone, and with them their steps.
    let env_s = envs(&env);
    let mut e = job_env.clone();
    e.extend(env_s.iter().copied());
    let out = run(&ctl, &args(&["stop"]), &e);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    for p in &pids {
        assert!(!chfsd_alive(*p), "pid {p} still runs");
    }
    assert!(recorded_pids(&sc.scratch()).is_empty());
    if fuse {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        assert!(!mounts
            .lines()
            .any(|l| l.split_whitespace().nth(1) == Some(m)));
    }
    wait_for(Duration::from_secs(5), "the steps to end", || {
        slurm.steps().is_empty()
    });

    // kill: SIGKILL by recorded PID; the step ends too.
    let out = run(&ctl, &args(&["-M", "start"]), &job_env);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let pids = recorded_pids(&sc.scratch());
    assert_eq!(pids.len(), 1);
    assert_eq!(slurm.steps().len(), 1);
    let out = run(&ctl, &args(&["-M", "kill"]), &job_env);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!chfsd_alive(pids[0]));
    wait_for(Duration::from_secs(5), "the step to end", || {
        slurm.steps().is_empty()
    });

    let out = run(&ctl, &args(&["clean"]), &job_env);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!sc.scratch().exists(), "scratch directory removed");
}

fn envs(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// The launcher-rank rule (`chfs_ctl::rank`) under a real Slurm, through
/// chstagein's per-rank reports: the tasks of `srun -n 2` share the files;
/// a batch script of a 2-task job, and a shell a task runs, are one
/// process staging everything (unless `CHFS_MPI=1`).
#[test]
fn stagein_ranks_are_srun_tasks_not_batch_scripts() {
    let Some(slurm) = Slurm::start("stagein_ranks_are_srun_tasks_not_batch_scripts") else {
        return;
    };
    let sc = Scratch::new();
    let pool = chfs_localpool::LocalPool::start(2).unwrap();
    let server = pool.server_string();
    let chstagein = bin("chstagein");
    let st = chstagein.to_str().unwrap();
    // A local tree of 1 directory and 12 files.
    let tree = |name: &str| {
        let d = sc.dir.path().join(name);
        std::fs::create_dir_all(&d).unwrap();
        for i in 0..12 {
            std::fs::write(d.join(format!("f{i:02}")), vec![i as u8; 1000 + i]).unwrap();
        }
        d.to_str().unwrap().to_string()
    };
    let total: u64 = (0..12u64).map(|i| 1000 + i).sum();
    let srun = |args: &[&str], env: &[(&str, &str)]| {
        let mut c = Command::new(find_program("srun").unwrap());
        c.args(["--overlap", "-O", "-N", "1", "-w", &slurm.host])
            .args(args)
            .env("CHFS_SERVER", &server)
            .env_remove("CHFS_MPI")
            .env_remove("CHFIND_MPI");
        for (k, v) in slurm.job_env().into_iter().chain(env.iter().copied()) {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        let err = text(&out.stderr);
        eprintln!("srun {args:?}: {:?}\n{err}", out.status.code());
        assert!(out.status.success(), "{err}");
        stage_reports(&err, "chstagein")
    };

    // The two tasks of an srun step: 13 items (the directory and its
    // files), shared out, every byte once.
    let d = tree("step");
    let r = srun(&["-n", "2", st, "-v", &d], &[]);
    let who: Vec<&str> = r.iter().map(|(w, ..)| w.as_str()).collect();
    assert_eq!(who, ["chstagein[0/2]", "chstagein[1/2]"], "{r:?}");
    assert_eq!(r.iter().map(|x| x.1).sum::<usize>(), 13, "{r:?}");
    assert_eq!(r.iter().map(|x| x.2).sum::<u64>(), total, "{r:?}");

    // A shell each task runs carries the task's variables: the chstagein
    // it starts is one process (each stages everything) ...
    let d = tree("shell");
    let cmd = format!("{st} -v {d}");
    let r = srun(&["-n", "2", "sh", "-c", &cmd], &[]);
    assert_eq!(r.len(), 2, "{r:?}");
    for x in &r {
        assert_eq!(x.0, "chstagein", "{r:?}");
        assert_eq!(x.2, total, "{r:?}");
    }
    // ... unless asked to be a rank.
    let d = tree("asked");
    let cmd = format!("{st} -v {d}");
    let r = srun(&["-n", "2", "sh", "-c", &cmd], &[("CHFS_MPI", "1")]);
    let who: Vec<&str> = r.iter().map(|(w, ..)| w.as_str()).collect();
    assert_eq!(who, ["chstagein[0/2]", "chstagein[1/2]"], "{r:?}");
    assert_eq!(r.iter().map(|x| x.2).sum::<u64>(), total, "{r:?}");

    // A batch script of a 2-task job (SLURM_PROCID=0, SLURM_NTASKS=2):
    // one process. Waits at most 90 s for the node (the test's own
    // allocation holds one CPU of it).
    let d = tree("batch");
    let out_file = sc.dir.path().join("batch.out");
    let script = format!("env | grep '^SLURM_' | sort; {st} -v {d}");
    let mut child = slurm
        .cmd("sbatch")
        .args(["--wait", "-O", "-n", "2", "-N", "1", "-w", &slurm.host])
        .args(["-J", "chstagein-batch", "-o", out_file.to_str().unwrap()])
        .args(["--wrap", &script])
        .env("CHFS_SERVER", &server)
        .env_remove("CHFS_MPI")
        .env_remove("CHFIND_MPI")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if t.elapsed() > Duration::from_secs(90) {
            let _ = slurm
                .cmd("scancel")
                .args(["-n", "chstagein-batch"])
                .output();
            // SAFETY: kill(2) on the PID of our own unreaped child.
            unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let Some(status) = status else {
        chfs_localpool::skip(
            "slurm",
            "the batch script part",
            "the batch job did not start within 90 s (no free CPU next to the allocation)",
        );
        return;
    };
    let out = std::fs::read_to_string(&out_file).unwrap_or_default();
    eprintln!("sbatch: {status:?}\n{out}");
    assert!(status.success(), "{out}");
    assert!(out.contains("SLURM_NTASKS=2"), "{out}");
    let r = stage_reports(&out, "chstagein");
    assert_eq!(r.len(), 1, "{out}");
    assert_eq!(r[0].0, "chstagein", "{out}");
    assert_eq!((r[0].1, r[0].2), (1, total), "{out}");
}
