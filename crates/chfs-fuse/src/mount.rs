//! Mounting, serving and unmounting.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use chfs_client::{Client, ClientConfig};
use fuser::{Config, MountOption, Session, SessionACL};
use tracing::{debug, info, warn};

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::core::Core;
use crate::fs::{ChfsFs, FsOptions};

/// Errors of mounting and serving.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MountError {
    /// The client could not be configured or connected.
    #[error("cannot connect to the chfs servers: {0}")]
    Client(#[from] chfs_client::Error),
    /// The mount point is unusable.
    #[error("mount point {path}: {source}")]
    MountPoint {
        /// The mount point.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The kernel mount or the FUSE session failed.
    #[error("FUSE {what}: {source}")]
    Fuse {
        /// Step that failed.
        what: &'static str,
        /// Cause.
        source: std::io::Error,
    },
}

/// Everything `chfuse` needs to mount.
#[derive(Debug, Clone)]
pub struct MountConfig {
    /// Where to mount.
    pub mountpoint: PathBuf,
    /// Kernel cache and I/O behaviour.
    pub fs: FsOptions,
    /// Let other users use the mount (`allow_other`; non-root users need
    /// `user_allow_other` in /etc/fuse.conf).
    pub allow_other: bool,
    /// Let the kernel check permission bits (`default_permissions`).
    pub default_permissions: bool,
    /// Read-only mount.
    pub read_only: bool,
    /// Threads reading kernel requests (default: one per CPU, at least 2).
    pub threads: usize,
    /// Kernel read-ahead of the mount in KiB (set through
    /// /sys/class/bdi when permitted; 0 = leave the kernel's 128 KiB).
    pub read_ahead_kb: u32,
    /// Client configuration (`CHFS_SERVER`, ...).
    pub client: ClientConfig,
}

impl MountConfig {
    /// Defaults for `mountpoint`, with the client configured from the
    /// environment.
    pub fn from_env(mountpoint: impl Into<PathBuf>) -> Result<Self, MountError> {
        Ok(Self {
            mountpoint: mountpoint.into(),
            fs: FsOptions::default(),
            // SAFETY: geteuid cannot fail and touches no memory.
            allow_other: unsafe { libc::geteuid() } == 0,
            default_permissions: true,
            read_only: false,
            threads: std::thread::available_parallelism()
                .map_or(2, |n| n.get())
                .max(2),
            read_ahead_kb: 1024,
            client: ClientConfig::from_env()?,
        })
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

/// Unmounts a FUSE mount: `umount2` as root, `fusermount3 -u` otherwise;
/// `lazy` detaches it even while in use (also clears a stale mount whose
/// daemon died).
pub fn unmount(mountpoint: &Path, lazy: bool) -> std::io::Result<()> {
    if is_root() {
        let c = CString::new(mountpoint.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        let flags = if lazy { libc::MNT_DETACH } else { 0 };
        // SAFETY: `c` is a valid NUL-terminated string for the call.
        if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
            return Ok(());
        }
        return Err(std::io::Error::last_os_error());
    }
    let mut cmd = Command::new("fusermount3");
    cmd.arg("-u").arg("-q");
    if lazy {
        cmd.arg("-z");
    }
    let st = cmd
        .arg("--")
        .arg(mountpoint)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    if st.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "fusermount3 -u failed ({st})"
        )))
    }
}

/// Checks the mount point; a stale FUSE mount left by a crashed daemon
/// (ENOTCONN, or briefly ECANCELED/ECONNABORTED) is detached first.
pub fn prepare_mountpoint(mp: &Path) -> Result<PathBuf, MountError> {
    let err = |source| MountError::MountPoint {
        path: mp.to_path_buf(),
        source,
    };
    match std::fs::metadata(mp) {
        // ENOTCONN: the daemon is gone. Just after it died with io_uring
        // queues, requests fail with ECANCELED/ECONNABORTED for a moment
        // until the kernel has torn the rings down.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED)
            ) =>
        {
            warn!(mountpoint = %mp.display(), "clearing a stale mount");
            unmount(mp, true).map_err(err)?;
        }
        Err(e) => return Err(err(e)),
        Ok(m) if !m.is_dir() => return Err(err(std::io::Error::from_raw_os_error(libc::ENOTDIR))),
        Ok(_) => {}
    }
    std::fs::canonicalize(mp).map_err(err)
}

/// Sets the read-ahead of the FUSE mount at `mp` (its backing device is
/// found in /proc/self/mountinfo, so no request reaches the file system).
/// The kernel offers FUSE file systems 128 KiB; 1 MiB lets sequential reads
/// travel as 1 MiB requests. Needs root.
pub fn set_read_ahead(mp: &Path, kb: u32) -> std::io::Result<()> {
    let want = mp.to_string_lossy().replace(' ', "\\040");
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let dev = info
        .lines()
        .rev()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .find(|f| f.len() > 4 && f[4] == want)
        .map(|f| f[2].to_string())
        .ok_or_else(|| std::io::Error::other("mount not found in mountinfo"))?;
    std::fs::write(
        format!("/sys/class/bdi/{dev}/read_ahead_kb"),
        format!("{kb}\n"),
    )
}

/// Blocks SIGINT/SIGTERM/SIGHUP (unmount) and SIGUSR1 (log the kernel
/// requests served) in the calling thread (and in the threads it starts
/// afterwards), so that one thread can wait for them.
pub fn block_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
        libc::sigaddset(&mut set, libc::SIGUSR1);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Moves request traffic to FUSE over io_uring when the kernel granted it
/// at INIT (`granted`; `threads` serving threads spread over the per-CPU
/// queues, at least one per queue); otherwise /dev/fuse stays the
/// transport. Returns the transport's name.
fn start_rings(
    core: &Arc<Core>,
    granted: &AtomicBool,
    session: &Session<ChfsFs>,
    threads: usize,
) -> &'static str {
    if !core.options().cpu_lanes {
        // Off for every thread, whatever CHFS_CPU_LANES says (its default
        // would still give the pinned ring threads lanes).
        core.client().set_cpu_lanes(chfs_client::CpuLanes::Never);
    }
    if !granted.load(Ordering::Relaxed) {
        return "/dev/fuse";
    }
    let fd = match session.as_fd().try_clone_to_owned() {
        Ok(fd) => fd,
        Err(e) => {
            warn!(error = %e, "FUSE over io_uring not started");
            return "/dev/fuse";
        }
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    match crate::ring::start(core.clone(), fd, threads.div_ceil(cpus).max(1)) {
        Ok(n) => {
            debug!(threads = n, "FUSE over io_uring");
            if core.options().cpu_lanes {
                core.client().set_cpu_lanes(chfs_client::CpuLanes::Always);
            }
            "io_uring"
        }
        Err(e) => {
            warn!(error = %e, "FUSE over io_uring not started; serving /dev/fuse");
            "/dev/fuse"
        }
    }
}

/// Mounts the pool and serves it until it is unmounted (by a signal, by
/// `fusermount3 -u` or `umount`). `ready` runs once the mount is live.
pub fn serve(cfg: MountConfig, ready: impl FnOnce()) -> Result<(), MountError> {
    let set = block_signals();
    let mp = prepare_mountpoint(&cfg.mountpoint)?;
    let mut ccfg = cfg.client.clone();
    // The kernel sends the mount's reads; the client's strided read-ahead
    // (CHFS_READ_AHEAD) is for the native and C API paths.
    ccfg.read_ahead = 0;
    let client = Client::connect(ccfg)?;
    let fs = ChfsFs::new(client, cfg.fs.clone());
    let core = fs.core().clone();
    let granted = fs.uring_granted();
    let mut opts = vec![
        MountOption::FSName("chfs".into()),
        MountOption::Subtype("chfs".into()),
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::NoAtime,
    ];
    if cfg.default_permissions {
        opts.push(MountOption::DefaultPermissions);
    }
    opts.push(if cfg.read_only {
        MountOption::RO
    } else {
        MountOption::RW
    });
    let mut fc = Config::default();
    fc.mount_options = opts;
    fc.acl = if cfg.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    fc.n_threads = Some(cfg.threads.max(1));
    fc.clone_fd = true;
    let session = Session::new(fs, &mp, &fc).map_err(|source| MountError::Fuse {
        what: "mount",
        source,
    })?;
    let transport = start_rings(&core, &granted, &session, cfg.threads);
    if transport == "io_uring" {
        // The /dev/fuse threads `session.run` starts from this thread (they
        // inherit its policy) then read only FORGET and INTERRUPT: a FORGET
        // (one per unlink) no longer preempts the process that sent it.
        crate::ring::batch_policy();
    }
    info!(mountpoint = %mp.display(), threads = cfg.threads, transport, "mounted");
    if cfg.read_ahead_kb > 0 {
        if let Err(e) = set_read_ahead(&mp, cfg.read_ahead_kb) {
            debug!(error = %e, "read-ahead left at the kernel default");
        }
    }
    let sig_mp = mp.clone();
    let sig_core = core.clone();
    std::thread::Builder::new()
        .name("chfuse-signals".into())
        .spawn(move || loop {
            let mut sig = 0;
            // SAFETY: `set` is an initialised signal set; `sig` is a valid out pointer.
            if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                continue;
            }
            if sig == libc::SIGUSR1 {
                info!(requests = %sig_core.requests(), "kernel requests served");
                continue;
            }
            info!(signal = sig, "unmounting on signal");
            if let Err(e) = unmount(&sig_mp, false) {
                warn!(error = %e, "unmount failed (busy?); detaching lazily");
                if let Err(e) = unmount(&sig_mp, true) {
                    warn!(error = %e, "lazy unmount failed");
                }
            }
        })
        .map_err(|source| MountError::Fuse {
            what: "signal thread",
            source,
        })?;
    ready();
    session.run().map_err(|source| MountError::Fuse {
        what: "session",
        source,
    })?;
    info!(requests = %core.requests(), "kernel requests served");
    info!(mountpoint = %mp.display(), "unmounted");
    Ok(())
}
