//! Scratch directories of the benchmarks, removed when dropped (also when
//! a run fails half-way).

use std::path::{Path, PathBuf};

use crate::error::{BenchError, Result};

/// A directory created for a run and removed, with all it holds, on drop.
#[derive(Debug)]
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    /// Creates `parent/name` (and `parent` if needed). `name` should be
    /// unique to the run (e.g. hold the process id).
    pub fn new(parent: &Path, name: &str) -> Result<Self> {
        let p = parent.join(name);
        std::fs::create_dir_all(&p).map_err(|e| BenchError::io("mkdir", p.display(), e))?;
        Ok(ScratchDir(p))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directory_goes_with_its_guard() {
        let t = tempfile::tempdir().unwrap();
        let d = ScratchDir::new(t.path(), "a/b").unwrap();
        std::fs::write(d.path().join("f"), b"x").unwrap();
        let p = d.path().to_path_buf();
        assert!(p.is_dir());
        drop(d);
        assert!(!p.exists());
        assert!(t.path().join("a").is_dir());
    }
}
