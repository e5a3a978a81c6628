//! A test binary of its own: it needs a process that has opened no shm
//! endpoint yet.

use chfs_fabric::{Config, Endpoint, Protocol, BUILT_WITH_LIBFABRIC};

/// A file that libfabric's shm provider left in /dev/shm for an endpoint
/// of a process that ended without closing it, named with the PID this
/// process now has, no longer makes this process's first shm endpoint
/// fail with EBUSY ("fi_endpoint: Device or resource busy", seen in CI
/// once such files had accumulated).
#[test]
fn a_dead_process_s_shm_queue_with_this_pid_is_cleared() {
    if !BUILT_WITH_LIBFABRIC {
        chfs_localpool::skip(
            "fabric",
            "a_dead_process_s_shm_queue_with_this_pid_is_cleared",
            "built without libfabric (libfabric-dev)",
        );
        return;
    }
    let stale = std::path::PathBuf::from(format!("/dev/shm/{}:0:0", std::process::id()));
    std::fs::write(&stale, vec![0u8; 4096]).unwrap();
    let ep = Endpoint::open(&Config::new(Protocol::Shm));
    let ok = ep.is_ok();
    drop(ep);
    // (the provider's own file, or the stale one if it was not cleared)
    let _ = std::fs::remove_file(&stale);
    assert!(
        ok,
        "no shm endpoint with a stale queue file named with this PID"
    );
}
