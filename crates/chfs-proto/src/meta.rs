//! The 64-byte metadata record kept with every chunk (seed design: mode, uid,
//! gid, size, chunk size, mtime, ctime), versioned.
//!
//! Layout (little-endian):
//!
//! | offset | field      | type | notes                                        |
//! |-------:|------------|------|----------------------------------------------|
//! | 0      | version    | u16  | [`META_VERSION`]                              |
//! | 2      | flags      | u16  | `FLAG_*`                                      |
//! | 4      | mode       | u32  | file type and permission bits (`st_mode`)    |
//! | 8      | uid        | u32  |                                              |
//! | 12     | gid        | u32  |                                              |
//! | 16     | size       | u64  | file size (chunk 0 only; data chunks: 0)     |
//! | 24     | chunk_size | u32  | bytes per chunk of this file                 |
//! | 28     | rdev       | u32  | device number of device special files; the   |
//! |        |            |      | epoch of regular files ([`Meta::epoch`])     |
//! | 32     | mtime      | i64  | ns since the epoch                           |
//! | 40     | ctime      | i64  | ns since the epoch                           |
//! | 48     | atime      | i64  | ns since the epoch                           |
//! | 56     | fileid     | u32  | incarnation id; data chunks carry it too     |
//! | 60     | crc        | u32  | checksum slot for persistent engines         |

use crate::ProtoError;

/// Encoded size of a [`Meta`].
pub const META_LEN: usize = 64;
/// Current record version.
pub const META_VERSION: u16 = 1;

/// The entry was modified in the cache and must be flushed to the backend.
pub const FLAG_DIRTY: u16 = 1;
/// The entry is a cached copy of a backend file (chunks missing here are
/// read through from the backend).
pub const FLAG_CACHED: u16 = 2;
/// Entry of a backend file whose chunk-0 bytes have not been fetched yet.
pub const FLAG_PARTIAL: u16 = 4;
/// A removed backend entry, kept so the backend copy stays hidden (cache
/// mode, "keep" policy). Never returned to clients.
pub const FLAG_WHITEOUT: u16 = 8;
/// A directory entry that exists only in the backend (readdir results).
pub const FLAG_BACKEND_ONLY: u16 = 16;
/// A cached copy of a backend file (`FLAG_CACHED`) that was written in the
/// cache since it was imported: a chunk of it missing from a replaced
/// server cannot be fetched again from the backend (it may have been
/// changed here and lost before it was flushed).
pub const FLAG_MODIFIED: u16 = 32;
/// A regular file that may have lost chunks: a server that held some of
/// them restarted with an empty store after the file's epoch (set on the
/// entry by its server when the pool records the replacement). A chunk of
/// it that no server holds reads as EIO, not as a hole, wherever renames
/// or rebalancing move its chunks. Cleared when the file is cut to zero.
pub const FLAG_DAMAGED: u16 = 64;
/// A regular file some of whose data chunks may lie past its size: a write
/// that failed part way (ENOSPC, a server down) stored chunks after the
/// one that failed, and the size was not grown over them. Its removal
/// asks every server for its data chunks, not only the owners of the
/// chunks below the size, so their space comes back.
pub const FLAG_STRAY: u16 = 128;

/// The largest file size (`off_t`'s largest value): a request for a larger
/// size is refused with EFBIG.
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;

/// File metadata as stored with a chunk and carried on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Meta {
    /// `FLAG_*` bits.
    pub flags: u16,
    /// `st_mode`: file type and permissions.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// File size (meaningful in chunk 0).
    pub size: u64,
    /// Chunk size of the file.
    pub chunk_size: u32,
    /// Device number of device special files. Regular files keep their
    /// epoch here ([`Meta::epoch`]); read it through [`Meta::device`].
    pub rdev: u32,
    /// Modification time, ns since the epoch.
    pub mtime: i64,
    /// Status change time, ns since the epoch.
    pub ctime: i64,
    /// Access time, ns since the epoch.
    pub atime: i64,
    /// Incarnation id chosen at create; a data chunk whose id differs from
    /// its file's is stale and reads as a hole.
    pub fileid: u32,
    /// Checksum slot (used by persistent engines; 0 on the wire).
    pub crc: u32,
}

impl Meta {
    /// File type bits of the mode.
    pub fn file_type(&self) -> u32 {
        self.mode & libc::S_IFMT
    }
    /// Is this a directory?
    pub fn is_dir(&self) -> bool {
        self.file_type() == libc::S_IFDIR
    }
    /// Is this a regular file?
    pub fn is_reg(&self) -> bool {
        self.file_type() == libc::S_IFREG
    }
    /// Is this a symbolic link?
    pub fn is_symlink(&self) -> bool {
        self.file_type() == libc::S_IFLNK
    }

    /// Device number (`st_rdev`): that of a device special file, 0 for
    /// anything else.
    pub fn device(&self) -> u32 {
        match self.file_type() {
            libc::S_IFCHR | libc::S_IFBLK => self.rdev,
            _ => 0,
        }
    }

    /// The epoch of a regular file: the server list version its entry's
    /// server held when the file was created or truncated to zero (0 for
    /// anything else, and for files created before epochs existed). A
    /// server whose store replaced a lost one at a later version (see
    /// [`crate::ring::ServerList::since`]) cannot tell a hole in such a
    /// file from a chunk it lost, and says so (EIO).
    pub fn epoch(&self) -> u32 {
        if self.is_reg() {
            self.rdev
        } else {
            0
        }
    }

    /// Sets the epoch of a regular file (a no-op for anything else).
    pub fn set_epoch(&mut self, epoch: u64) {
        if self.is_reg() {
            self.rdev = u32::try_from(epoch).unwrap_or(u32::MAX);
        }
    }

    /// Encodes the record into exactly 64 bytes.
    pub fn encode_into(&self, out: &mut [u8; META_LEN]) {
        out[0..2].copy_from_slice(&META_VERSION.to_le_bytes());
        out[2..4].copy_from_slice(&self.flags.to_le_bytes());
        out[4..8].copy_from_slice(&self.mode.to_le_bytes());
        out[8..12].copy_from_slice(&self.uid.to_le_bytes());
        out[12..16].copy_from_slice(&self.gid.to_le_bytes());
        out[16..24].copy_from_slice(&self.size.to_le_bytes());
        out[24..28].copy_from_slice(&self.chunk_size.to_le_bytes());
        out[28..32].copy_from_slice(&self.rdev.to_le_bytes());
        out[32..40].copy_from_slice(&self.mtime.to_le_bytes());
        out[40..48].copy_from_slice(&self.ctime.to_le_bytes());
        out[48..56].copy_from_slice(&self.atime.to_le_bytes());
        out[56..60].copy_from_slice(&self.fileid.to_le_bytes());
        out[60..64].copy_from_slice(&self.crc.to_le_bytes());
    }

    /// Encodes the record.
    pub fn encode(&self) -> [u8; META_LEN] {
        let mut b = [0u8; META_LEN];
        self.encode_into(&mut b);
        b
    }

    /// Decodes a record, refusing unknown versions.
    pub fn decode(b: &[u8]) -> Result<Self, ProtoError> {
        if b.len() < META_LEN {
            return Err(ProtoError::Truncated {
                needed: META_LEN - b.len(),
            });
        }
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(a)
        };
        let version = u16_at(0);
        if version != META_VERSION {
            return Err(ProtoError::Malformed(format!(
                "metadata record version {version}"
            )));
        }
        Ok(Self {
            flags: u16_at(2),
            mode: u32_at(4),
            uid: u32_at(8),
            gid: u32_at(12),
            size: u64_at(16),
            chunk_size: u32_at(24),
            rdev: u32_at(28),
            mtime: u64_at(32) as i64,
            ctime: u64_at(40) as i64,
            atime: u64_at(48) as i64,
            fileid: u32_at(56),
            crc: u32_at(60),
        })
    }
}

/// Current wall-clock time in ns since the epoch.
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(flags: u16, mode: u32, uid: u32, gid: u32, size: u64, cs: u32, rdev: u32,
                      mt: i64, ct: i64, at: i64, fid: u32, crc: u32) {
            let m = Meta { flags, mode, uid, gid, size, chunk_size: cs, rdev, mtime: mt, ctime: ct,
                           atime: at, fileid: fid, crc };
            prop_assert_eq!(Meta::decode(&m.encode()).unwrap(), m);
        }
    }

    #[test]
    fn unknown_version_refused() {
        let mut b = Meta::default().encode();
        b[0] = 9;
        assert!(Meta::decode(&b).is_err());
    }
}
