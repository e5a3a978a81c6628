//! Hostfiles, shell quoting and launchers: how chfsctl runs a command on a
//! host of the job through the cluster's own machinery (ssh, `mpirun`,
//! `srun`).

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::error::CtlError;

/// How commands reach the hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LauncherKind {
    /// `ssh HOST sh -c '...'` (the command is configurable with `--rsh`).
    Ssh,
    /// `mpirun -np 1 --host HOST sh -c '...'`.
    Mpirun,
    /// `srun -N 1 -n 1 -w HOST --overlap sh -c '...'`.
    Srun,
    /// Runs every host's command on this host (`sh -c '...'`): for tests
    /// and for several servers on one machine.
    #[value(hide = true)]
    Local,
}

/// A configured launcher.
#[derive(Debug, Clone)]
pub struct Launcher {
    /// Kind.
    pub kind: LauncherKind,
    /// Remote shell command for [`LauncherKind::Ssh`] (program and leading
    /// arguments), e.g. `ssh -F /path/config`.
    pub rsh: Vec<String>,
    /// Connection timeout handed to ssh (`ConnectTimeout`).
    pub connect_timeout: Duration,
}

impl Launcher {
    /// The command that runs `script` with `sh` on `host`.
    pub fn command(&self, host: &str, script: &str) -> Command {
        match self.kind {
            LauncherKind::Ssh => {
                let (prog, args) = self
                    .rsh
                    .split_first()
                    .map_or(("ssh", &[][..]), |(p, a)| (p.as_str(), a));
                let mut c = Command::new(prog);
                c.args(args);
                if Path::new(prog).file_name().is_some_and(|n| n == "ssh") {
                    c.args([
                        "-o",
                        "BatchMode=yes",
                        "-o",
                        &format!("ConnectTimeout={}", self.connect_timeout.as_secs().max(1)),
                    ]);
                }
                c.arg(host).arg(format!("sh -c {}", quote(script)));
                c
            }
            LauncherKind::Mpirun => {
                let mut c = Command::new("mpirun");
                c.args(["-np", "1", "--host", host, "sh", "-c", script]);
                c
            }
            LauncherKind::Srun => {
                let mut c = Command::new("srun");
                c.args([
                    "-N",
                    "1",
                    "-n",
                    "1",
                    "-w",
                    host,
                    "--overlap",
                    "sh",
                    "-c",
                    script,
                ]);
                c
            }
            LauncherKind::Local => {
                let mut c = Command::new("sh");
                c.args(["-c", script]);
                c
            }
        }
    }

    /// Runs `script` on `host`, feeding `stdin`; returns its standard
    /// output, or an error naming the host with the command's error output.
    pub fn run(&self, host: &str, script: &str, stdin: &[u8]) -> Result<String, CtlError> {
        let mut cmd = self.command(host, script);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| CtlError::Host {
            host: host.to_string(),
            message: format!("cannot run {:?}: {e}", cmd.get_program()),
        })?;
        if let Some(mut i) = child.stdin.take() {
            let _ = i.write_all(stdin);
        }
        let out = child.wait_with_output().map_err(|e| CtlError::Host {
            host: host.to_string(),
            message: format!("waiting for the launcher: {e}"),
        })?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let err = err.trim();
            return Err(CtlError::Host {
                host: host.to_string(),
                message: format!(
                    "{} ({})",
                    if err.is_empty() {
                        "command failed"
                    } else {
                        err
                    },
                    match out.status.code() {
                        Some(255) if self.kind == LauncherKind::Ssh =>
                            "ssh exit status 255: host unreachable or login refused".to_string(),
                        Some(c) => format!("exit status {c}"),
                        None => "killed by a signal".to_string(),
                    }
                ),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs `script` on `host` as a step that stays alive after this call
    /// returns: for launchers whose remote processes end with the launch
    /// (`srun`: when a job step ends, Slurm kills every process left in it,
    /// daemons included, under `proctrack/cgroup`). `script` must print a
    /// line `READY_MARK payload` once its work is done, then keep running as
    /// long as what it started should live (see [`hold_script`]).
    ///
    /// The launcher runs in its own process group with standard input from
    /// `/dev/null` and its standard output and error appended to `log` on
    /// this host, so it survives the caller, holds none of the caller's
    /// pipes (`$(chfsctl start)` returns) and never writes to a closed pipe.
    /// Returns the payload; on failure (the launcher exited first, or no
    /// answer within `timeout`) an error naming the host with what the
    /// launcher wrote.
    pub fn run_held(
        &self,
        host: &str,
        script: &str,
        log: &Path,
        timeout: Duration,
    ) -> Result<String, CtlError> {
        let herr = |message: String| CtlError::Host {
            host: host.to_string(),
            message,
        };
        // Appended to (a refused start leaves a running server's record
        // alone); only what this launch writes is read.
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| herr(format!("cannot create {}: {e}", log.display())))?;
        let from = out
            .metadata()
            .map_err(|e| herr(format!("{}: {e}", log.display())))?
            .len() as usize;
        let read = || {
            let b = std::fs::read(log).unwrap_or_default();
            String::from_utf8_lossy(b.get(from..).unwrap_or_default()).into_owned()
        };
        let err = out
            .try_clone()
            .map_err(|e| herr(format!("{}: {e}", log.display())))?;
        let mut cmd = self.command(host, script);
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        let mut child = cmd
            .spawn()
            .map_err(|e| herr(format!("cannot run {:?}: {e}", cmd.get_program())))?;
        let deadline = std::time::Instant::now() + timeout;
        let ready = |text: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(READY_MARK))
                .map(|p| p.trim().to_string())
        };
        loop {
            let exited = child
                .try_wait()
                .map_err(|e| herr(format!("waiting for the launcher: {e}")))?;
            if let Some(p) = ready(&read()) {
                return Ok(p);
            }
            let what = match exited {
                Some(st) => match st.code() {
                    Some(c) => format!("exit status {c}"),
                    None => "killed by a signal".to_string(),
                },
                None if std::time::Instant::now() >= deadline => {
                    // SIGTERM makes srun cancel its step (or its pending
                    // allocation); then make sure it is gone.
                    // SAFETY: kill(2) on the PID of our own unreaped child.
                    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
                    std::thread::sleep(Duration::from_millis(500));
                    let _ = child.kill();
                    let _ = child.wait();
                    format!("no answer within {} s", timeout.as_secs())
                }
                None => {
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            };
            let text = read();
            let text = text.trim();
            return Err(herr(format!(
                "{} ({what}; launcher output in {})",
                if text.is_empty() {
                    "command failed"
                } else {
                    text
                },
                log.display()
            )));
        }
    }

    /// Runs one command per item in parallel (one thread each); results in
    /// the order of `jobs`.
    pub fn run_all(&self, jobs: &[(String, String, Vec<u8>)]) -> Vec<Result<String, CtlError>> {
        std::thread::scope(|s| {
            let hs: Vec<_> = jobs
                .iter()
                .map(|(h, script, input)| s.spawn(move || self.run(h, script, input)))
                .collect();
            hs.into_iter()
                .zip(jobs)
                .map(|(h, (host, _, _))| {
                    h.join().unwrap_or_else(|_| {
                        Err(CtlError::Host {
                            host: host.clone(),
                            message: "launcher thread panicked".into(),
                        })
                    })
                })
                .collect()
        })
    }
}

/// The line prefix with which a [`hold_script`] reports that its work is
/// done.
pub const READY_MARK: &str = "CHFSCTL-READY";

/// Wraps `body` (a script that starts a daemon and prints what to report,
/// such as `chfsd --daemon`'s address) for [`Launcher::run_held`]: runs it,
/// prints `READY_MARK` and its output, then stays alive, with its output
/// closed, while the process recorded in `pid_file` is a live `comm`.
pub fn hold_script(body: &str, pid_file: &str, comm: &str) -> String {
    format!(
        r#"r=$(
{body}
) || exit $?
echo "{READY_MARK} $r"
exec </dev/null >/dev/null 2>&1
p=$(cat {pf})
while [ -n "$p" ] && [ "$(cat /proc/$p/comm 2>/dev/null)" = {comm} ] && ! grep -q '^State:[[:space:]]*Z' /proc/$p/status; do sleep 1; done
exit 0
"#,
        pf = quote(pid_file),
        comm = quote(comm),
    )
}

/// Quotes `s` for a POSIX shell (single quotes; bare when safe).
pub fn quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"@%+=:,./-_".contains(&b))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Reads a hostfile: one host per line; blank lines and `#` comments are
/// ignored, as is anything after the first word (such as MPI's `slots=N`).
/// A host listed twice gets two servers.
pub fn parse_hostfile(text: &str) -> Result<Vec<String>, CtlError> {
    let mut hosts = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        let Some(h) = line.split_whitespace().next() else {
            continue;
        };
        if h.starts_with('-')
            || !h
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        {
            return Err(CtlError::Usage(format!(
                "hostfile line {}: {h:?} is not a host name",
                n + 1
            )));
        }
        hosts.push(h.to_string());
    }
    if hosts.is_empty() {
        return Err(CtlError::Usage("the hostfile lists no host".into()));
    }
    Ok(hosts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(quote("a/b-c"), "a/b-c");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("a b;c"), "'a b;c'");
        let out = Command::new("sh")
            .args(["-c", &format!("printf %s {}", quote("x'y $HOME \"z"))])
            .output()
            .unwrap();
        assert_eq!(out.stdout, b"x'y $HOME \"z");
    }

    #[test]
    fn hostfiles() {
        let h = parse_hostfile("# nodes\nn1 slots=4\n\n  n2\nn1\n").unwrap();
        assert_eq!(h, ["n1", "n2", "n1"]);
        assert!(parse_hostfile("# none\n").is_err());
        assert!(parse_hostfile("n1;rm\n").is_err());
    }

    fn argv(l: &Launcher, host: &str, script: &str) -> Vec<String> {
        let c = l.command(host, script);
        std::iter::once(c.get_program())
            .chain(c.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn launcher_commands() {
        let mut l = Launcher {
            kind: LauncherKind::Ssh,
            rsh: vec!["ssh".into(), "-F".into(), "/cfg".into()],
            connect_timeout: Duration::from_secs(7),
        };
        assert_eq!(
            argv(&l, "n1", "echo 'a b'"),
            [
                "ssh",
                "-F",
                "/cfg",
                "-o",
                "BatchMode=yes",
                "-o",
                "ConnectTimeout=7",
                "n1",
                r"sh -c 'echo '\''a b'\'''"
            ]
        );
        l.kind = LauncherKind::Mpirun;
        assert_eq!(
            argv(&l, "n2", "x"),
            ["mpirun", "-np", "1", "--host", "n2", "sh", "-c", "x"]
        );
        l.kind = LauncherKind::Srun;
        assert_eq!(
            argv(&l, "n3", "x"),
            [
                "srun",
                "-N",
                "1",
                "-n",
                "1",
                "-w",
                "n3",
                "--overlap",
                "sh",
                "-c",
                "x"
            ]
        );
        // A custom remote shell that is not ssh gets no ssh options.
        l.kind = LauncherKind::Ssh;
        l.rsh = vec!["rsh".into()];
        assert_eq!(argv(&l, "n4", "x"), ["rsh", "n4", "sh -c x"]);
    }

    #[test]
    fn held_launch_outlives_the_call() {
        let l = Launcher {
            kind: LauncherKind::Local,
            rsh: vec![],
            connect_timeout: Duration::from_secs(1),
        };
        let dir = tempfile::tempdir().unwrap();
        let pf = dir.path().join("d.pid");
        let log = dir.path().join("d.srun");
        // A "daemon" (sleep) started in the background; the body reports
        // "ready-addr" and returns.
        let body = format!(
            "sleep 30 </dev/null >/dev/null 2>&1 & echo $! > {}; echo ready-addr",
            quote(pf.to_str().unwrap())
        );
        let script = hold_script(&body, pf.to_str().unwrap(), "sleep");
        let t = std::time::Instant::now();
        let got = l
            .run_held("h1", &script, &log, Duration::from_secs(10))
            .unwrap();
        assert_eq!(got, "ready-addr");
        assert!(t.elapsed() < Duration::from_secs(5));
        let pid: i32 = std::fs::read_to_string(&pf)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: kill(2) on the sleep this test started.
        assert_eq!(unsafe { libc::kill(pid, 0) }, 0, "daemon alive");
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        // A failing body: the error names the host, carries its message and
        // points at the launcher's output; earlier runs' output is ignored.
        let e = l
            .run_held(
                "h2",
                &hold_script("echo nope >&2; exit 3", "/nonexistent", "x"),
                &log,
                Duration::from_secs(10),
            )
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("host h2") && e.contains("nope") && e.contains("exit status 3"),
            "{e}"
        );
        assert!(!e.contains("ready-addr"), "{e}");
        let e = l
            .run_held("h3", "sleep 30", &log, Duration::from_secs(1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no answer within 1 s"), "{e}");
    }

    #[test]
    fn failures_name_the_host() {
        let l = Launcher {
            kind: LauncherKind::Local,
            rsh: vec![],
            connect_timeout: Duration::from_secs(1),
        };
        assert_eq!(l.run("h", "cat", b"in").unwrap(), "in");
        let e = l.run("h7", "echo boom >&2; exit 3", b"").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("host h7") && msg.contains("boom") && msg.contains("3"),
            "{msg}"
        );
    }
}
