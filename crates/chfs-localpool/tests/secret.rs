//! Local pools with a secret: the library on request
//! ([`PoolOptions::with_new_secret`]), the `chfs-localpool` program by
//! default (`--no-secret` with a warning). Needs `chfsd` built
//! (`cargo build -p chfs-server`).

use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use chfs_client::{Client, ClientConfig};
use chfs_localpool::{LocalPool, PoolOptions};

const BIN: &str = env!("CARGO_BIN_EXE_chfs-localpool");

fn connect(servers: &str, secret_file: Option<&Path>) -> chfs_client::Result<Client> {
    let mut cfg = ClientConfig::from_lookup(|k| match k {
        "CHFS_SERVER" => Some(servers.to_string()),
        "CHFS_SECRET_FILE" => secret_file.map(|p| p.display().to_string()),
        _ => None,
    })?;
    cfg.rpc_timeout = Duration::from_secs(10);
    Client::connect(cfg)
}

fn mode(p: &Path) -> u32 {
    std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(p).unwrap().permissions()) & 0o777
}

/// Writes and reads back a file.
fn use_pool(c: &Client, path: &str) {
    let fd = c.create(path, libc::O_WRONLY, 0o644).unwrap();
    c.write(fd, b"local pool").unwrap();
    c.close(fd).unwrap();
    let fd = c.open(path, libc::O_RDONLY, 0).unwrap();
    let mut b = [0u8; 32];
    let n = c.read(fd, &mut b).unwrap();
    assert_eq!(&b[..n], b"local pool");
    c.close(fd).unwrap();
}

#[test]
fn library_pools_are_open_unless_given_a_secret() {
    let open = LocalPool::start(1).expect("start chfsd (cargo build -p chfs-server)");
    assert!(open.secret().is_none() && open.client_key_file().is_none());
    use_pool(&connect(&open.server_string(), None).unwrap(), "/open");
    drop(open);

    let pool = LocalPool::start_with(
        PoolOptions {
            servers: 2,
            ..Default::default()
        }
        .with_new_secret(),
    )
    .unwrap();
    let (secret, key) = (pool.secret_file().unwrap(), pool.client_key_file().unwrap());
    assert_eq!((mode(&secret), mode(&key)), (0o600, 0o600));
    assert_eq!(
        std::fs::read_to_string(&secret).unwrap().trim(),
        pool.secret().unwrap()
    );
    assert_eq!(pool.secret().unwrap().len(), 64);
    let s = pool.server_string();
    let e = connect(&s, None).err().expect("refused without the key");
    assert_eq!(e.errno(), libc::EACCES, "{e}");
    let c = connect(&s, Some(&key)).unwrap();
    use_pool(&c, "/keyed");
    assert_eq!(c.shutdown_servers().unwrap_err().errno(), libc::EPERM);
    drop(c);
    // The pool secret lets chfsd in: a server restarted in the pool joins.
    let mut pool = pool;
    pool.restart(1).unwrap();
    assert_eq!(connect(&s, Some(&key)).unwrap().servers().len(), 2);
    let dir = pool.log_dir().to_path_buf();
    drop(pool);
    assert!(!dir.exists(), "secret and key removed with the pool");
}

/// Starts `chfs-localpool ARGS` without a command; returns the child and
/// the two lines it printed for `eval`.
fn serve(args: &[&str]) -> (std::process::Child, Vec<String>) {
    let mut child = Command::new(BIN)
        .args(args)
        .env_remove("CHFS_SECRET")
        .env_remove("CHFS_SECRET_FILE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let lines = (0..2)
        .map(|_| {
            let mut l = String::new();
            out.read_line(&mut l).unwrap();
            l.trim_end().to_string()
        })
        .collect();
    (child, lines)
}

/// Stops a `serve`d pool (SIGTERM to the child's PID); returns its error
/// output.
fn stop(mut child: std::process::Child) -> String {
    // SAFETY: kill(2) on the PID of the child this test spawned and has not
    // reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = child.wait().unwrap();
    assert!(st.success(), "{st}");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    err
}

/// The value of `K` in a line `K=V; export K;`.
fn value<'a>(line: &'a str, k: &str) -> &'a str {
    line.strip_prefix(&format!("{k}="))
        .and_then(|r| r.strip_suffix(&format!("; export {k};")))
        .unwrap_or_else(|| panic!("{k} in {line:?}"))
}

#[test]
fn the_program_generates_a_secret_by_default() {
    let (child, lines) = serve(&["-n", "2"]);
    let servers = value(&lines[0], "CHFS_SERVER").to_string();
    let key = Path::new(value(&lines[1], "CHFS_SECRET_FILE")).to_path_buf();
    assert!(std::fs::read_to_string(&key)
        .unwrap()
        .starts_with("chfs-client-key:"));
    assert_eq!(mode(&key), 0o600);
    let e = connect(&servers, None)
        .err()
        .expect("refused without the key");
    assert_eq!(e.errno(), libc::EACCES, "{e}");
    use_pool(&connect(&servers, Some(&key)).unwrap(), "/f");
    let err = stop(child);
    assert!(!err.contains("warning"), "{err}");
    assert!(!key.exists(), "key removed with the pool");

    // A command gets the client key (and not the caller's credential).
    let out = Command::new(BIN)
        .args(["-n", "1", "--", "sh", "-c"])
        .arg(r#"head -c 16 "$CHFS_SECRET_FILE"; echo " secret=${CHFS_SECRET-unset}""#)
        .env_remove("CHFS_SECRET")
        .env("CHFS_SECRET_FILE", "/stale/key")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "chfs-client-key: secret=unset\n"
    );
}

#[test]
fn no_secret_warns_and_leaves_the_pool_open() {
    let (child, lines) = serve(&["-n", "1", "--no-secret"]);
    let servers = value(&lines[0], "CHFS_SERVER").to_string();
    assert_eq!(lines[1], "unset CHFS_SECRET_FILE CHFS_SECRET;");
    use_pool(&connect(&servers, None).unwrap(), "/anyone");
    let err = stop(child);
    assert!(
        err.contains("warning") && err.contains("open to every local and remote process"),
        "{err}"
    );
}
