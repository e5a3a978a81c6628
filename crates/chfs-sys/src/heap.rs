//! The C heap (glibc malloc): how much it holds free, and giving that
//! back to the system; the process's resident memory.
//!
//! Elsewhere (another C library) nothing is known: [`free_bytes`] is 0
//! and [`trim`] does nothing.

/// Bytes the heap holds free (`mallinfo2().fordblks`: freed memory not
/// yet given back to the system, in every arena).
pub fn free_bytes() -> usize {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallinfo2 only reads the allocator's statistics (under
        // its locks) and returns them by value.
        unsafe { libc::mallinfo2() }.fordblks
    }
    #[cfg(not(target_env = "gnu"))]
    {
        0
    }
}

/// The process's resident memory in bytes (`/proc/self/statm`; 0 if it
/// cannot be read).
pub fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * crate::map::page_size() as u64)
}

/// Gives the heap's free memory back to the system (`malloc_trim(0)`:
/// the top of the heap is shrunk and whole free pages within it are
/// released with MADV_DONTNEED); true if any was. Every allocation in the
/// process waits meanwhile (it holds the arenas' locks): call it when
/// the process is otherwise idle.
pub fn trim() -> bool {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: malloc_trim takes the allocator's own locks and changes
        // nothing a live allocation owns.
        unsafe { libc::malloc_trim(0) != 0 }
    }
    #[cfg(not(target_env = "gnu"))]
    {
        false
    }
}
