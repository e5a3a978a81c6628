//! What an open handle stands for: a client descriptor, or a directory
//! listing.

use std::sync::{Arc, Mutex};

use super::types::FileKind;

/// An open file: the client descriptor (replaced if the file is renamed).
pub(super) struct FileH {
    pub(super) ino: u64,
    pub(super) fd: Mutex<i32>,
    pub(super) flags: i32,
    pub(super) append: bool,
    pub(super) sync: bool,
}

/// One entry of a directory listing: name, inode number, type.
pub(super) type DirEnt = (String, u64, FileKind);

/// An open directory: the listing read at offset 0, so offsets stay valid
/// while the directory changes.
pub(super) struct DirH {
    pub(super) entries: Mutex<Option<Vec<DirEnt>>>,
}

/// An open handle.
pub(super) enum Handle {
    File(Arc<FileH>),
    Dir(Arc<DirH>),
}
