//! Hostfiles, shell quoting and launchers: how chfsctl runs a command on a
//! host of the job through the cluster's own machinery (ssh, `mpirun`,
//! `srun`).

use std::io::Write;
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
