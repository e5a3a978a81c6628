//! The demo program end to end, tiny: its pool has a secret by default
//! (the demo connects with the pool's client key, whatever credential the
//! environment holds), `--no-secret` warns. Needs `chfsd` built
//! (`cargo build -p chfs-server`).

use std::process::Command;

fn demo(extra: &[&str]) -> (String, String) {
    let reference = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_chfs-demo"))
        .args(["-n", "2", "-s", "4", "-f", "50", "--reference"])
        .arg(reference.path())
        .args(extra)
        // A credential of some other pool: not the demo's.
        .env("CHFS_SECRET_FILE", "/nonexistent/other.key")
        .env_remove("CHFS_SERVER")
        .output()
        .unwrap();
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{o}\n{e}");
    assert!(o.contains("all bytes verified"), "{o}");
    (o, e)
}

#[test]
fn the_demo_pool_has_a_secret_unless_told_otherwise() {
    let (out, err) = demo(&[]);
    assert!(
        out.contains("pool secret on") && out.contains("chfs.client.key"),
        "{out}"
    );
    assert!(!err.contains("warning"), "{err}");
    let (out, err) = demo(&["--no-secret"]);
    assert!(!out.contains("pool secret on"), "{out}");
    assert!(
        err.contains("warning") && err.contains("open to every local and remote process"),
        "{err}"
    );
}
