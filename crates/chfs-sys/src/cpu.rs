//! CPU affinity: which CPUs the calling thread may run on, and which one it
//! runs on now.

use std::io;

/// CPUs an affinity set can name (`CPU_SETSIZE`).
pub const SETSIZE: usize = libc::CPU_SETSIZE as usize;

/// CPUs configured on this machine (`sysconf(_SC_NPROCESSORS_CONF)`),
/// between 1 and [`SETSIZE`]: every CPU below it can be given to
/// [`pin_current_thread`].
pub fn configured() -> usize {
    // SAFETY: sysconf reads a system constant and touches no memory of ours.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    n.clamp(1, SETSIZE as libc::c_long) as usize
}

/// Lets the calling thread run on `cpu` only (`sched_setaffinity(2)`).
/// EINVAL when `cpu` is not below [`SETSIZE`] or not online, as the
/// kernel answers for a set with no usable CPU.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    if cpu >= SETSIZE {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: cpu_set_t is plain data, set up by CPU_ZERO/CPU_SET (cpu is
    // below CPU_SETSIZE, checked above) before the call, which only reads
    // the size given.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// How many CPUs the calling thread may run on (`sched_getaffinity(2)`).
pub fn allowed_count() -> io::Result<usize> {
    // SAFETY: sched_getaffinity fills the zeroed set it is given, of the
    // size passed; CPU_COUNT only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(libc::CPU_COUNT(&set) as usize)
    }
}

/// The CPUs the calling thread may run on, in increasing order
/// (`sched_getaffinity(2)`).
pub fn allowed() -> io::Result<Vec<usize>> {
    // SAFETY: sched_getaffinity fills the zeroed set it is given, of the
    // size passed; CPU_ISSET only reads it, for CPUs below CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((0..SETSIZE).filter(|&c| libc::CPU_ISSET(c, &set)).collect())
    }
}

/// The CPU the calling thread runs on (`sched_getcpu(3)`: vDSO, no system
/// call); None where the kernel cannot tell.
#[inline]
pub fn current() -> Option<usize> {
    // SAFETY: sched_getcpu takes no arguments and touches no memory.
    usize::try_from(unsafe { libc::sched_getcpu() }).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_thread_runs_on_its_cpu() {
        assert!(configured() >= 1);
        let cpus: Vec<usize> = (0..configured()).collect();
        // On its own thread: the test harness's threads keep their sets.
        std::thread::spawn(move || {
            let before = allowed_count().unwrap();
            assert!(before >= 1);
            assert_eq!(allowed().unwrap().len(), before);
            let mut pinned = 0;
            for cpu in cpus {
                // A CPU may be offline or outside this process's cgroup.
                if pin_current_thread(cpu).is_err() {
                    continue;
                }
                assert_eq!(allowed_count().unwrap(), 1);
                assert_eq!(current(), Some(cpu));
                pinned += 1;
            }
            assert!(pinned >= 1, "no CPU could be pinned to");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_cpu_beyond_the_set_is_refused() {
        let e = pin_current_thread(SETSIZE).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    }
}
