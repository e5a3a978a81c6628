//! Kernel requests served, counted by FUSE opcode (issue 25: what one
//! operation costs through the mount). Both transports count each request
//! they take from the kernel, answered or not; chfuse logs the counts on
//! SIGUSR1 and at unmount (`mount::serve`).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// FUSE opcodes (include/uapi/linux/fuse.h).
pub mod op {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const DESTROY: u32 = 38;
    pub const BATCH_FORGET: u32 = 42;
    pub const RENAME2: u32 = 45;
}

/// The name of a FUSE opcode, as the kernel's tracepoints print it.
pub fn op_name(opcode: u32) -> Option<&'static str> {
    use op::*;
    Some(match opcode {
        LOOKUP => "LOOKUP",
        FORGET => "FORGET",
        GETATTR => "GETATTR",
        SETATTR => "SETATTR",
        READLINK => "READLINK",
        SYMLINK => "SYMLINK",
        MKNOD => "MKNOD",
        MKDIR => "MKDIR",
        UNLINK => "UNLINK",
        RMDIR => "RMDIR",
        RENAME => "RENAME",
        LINK => "LINK",
        OPEN => "OPEN",
        READ => "READ",
        WRITE => "WRITE",
        STATFS => "STATFS",
        RELEASE => "RELEASE",
        FSYNC => "FSYNC",
        SETXATTR => "SETXATTR",
        GETXATTR => "GETXATTR",
        LISTXATTR => "LISTXATTR",
        REMOVEXATTR => "REMOVEXATTR",
        FLUSH => "FLUSH",
        OPENDIR => "OPENDIR",
        READDIR => "READDIR",
        RELEASEDIR => "RELEASEDIR",
        FSYNCDIR => "FSYNCDIR",
        ACCESS => "ACCESS",
        CREATE => "CREATE",
        DESTROY => "DESTROY",
        BATCH_FORGET => "BATCH_FORGET",
        RENAME2 => "RENAME2",
        _ => return None,
    })
}

/// Opcodes below this are counted one by one; the rest together as
/// "OTHER" (the kernel sends none of them to chfuse today).
const SLOTS: usize = 64;

/// Requests served, by opcode.
pub struct Requests {
    by_op: [AtomicU64; SLOTS],
}

impl Default for Requests {
    fn default() -> Self {
        Requests {
            by_op: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Requests {
    /// Counts one request with `opcode`.
    pub fn count(&self, opcode: u32) {
        let slot = (opcode as usize).min(SLOTS - 1);
        self.by_op[slot].fetch_add(1, Ordering::Relaxed);
    }

    /// The requests served so far with `opcode`.
    pub fn get(&self, opcode: u32) -> u64 {
        self.by_op[(opcode as usize).min(SLOTS - 1)].load(Ordering::Relaxed)
    }

    /// The non-zero counts, by opcode name ("OP<n>" for an opcode without
    /// a name here, "OTHER" for opcodes of 63 and above).
    pub fn snapshot(&self) -> Vec<(String, u64)> {
        let mut v = Vec::new();
        for (i, c) in self.by_op.iter().enumerate() {
            let n = c.load(Ordering::Relaxed);
            if n == 0 {
                continue;
            }
            let name = match op_name(i as u32) {
                Some(s) => s.to_string(),
                None if i == SLOTS - 1 => "OTHER".to_string(),
                None => format!("OP{i}"),
            };
            v.push((name, n));
        }
        v
    }
}

/// `NAME=count` pairs separated by spaces, in opcode order.
impl fmt::Display for Requests {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (name, n) in self.snapshot() {
            if !first {
                f.write_str(" ")?;
            }
            first = false;
            write!(f, "{name}={n}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_opcode_and_prints_names() {
        let r = Requests::default();
        r.count(op::GETATTR);
        r.count(op::CREATE);
        r.count(op::CREATE);
        r.count(7);
        r.count(4096);
        assert_eq!(r.get(op::CREATE), 2);
        assert_eq!(r.get(op::LOOKUP), 0);
        assert_eq!(r.to_string(), "GETATTR=1 OP7=1 CREATE=2 OTHER=1");
    }
}
