//! libchfs through the path C users take: the library, header and chfs.pc
//! are installed into a temporary PREFIX by `scripts/install-capi.sh`, C
//! programs from `tests/c/` are compiled with
//! `cc $(pkg-config --cflags --libs chfs)` and run against real `chfsd`
//! servers (the ones installed in PREFIX/bin).
//!
//! Needs: cc, pkg-config, nm, readelf; `chfsd` built (`cargo build -p
//! chfs-server`).

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use chfs_client::Client;
use chfs_localpool::{LocalPool, PoolOptions};
use common::{check, clean, protocols, run, rust_client, Prefix, CRATE};

fn server_requests(c: &Client) -> u64 {
    c.server_status()
        .into_iter()
        .map(|(a, s)| s.unwrap_or_else(|e| panic!("status of {a}: {e}")).requests)
        .sum()
}

/// Declared `chfs_*` functions of a C header (comments removed).
fn header_functions(h: &str) -> BTreeSet<String> {
    let mut code = String::new();
    let mut rest = h;
    while let Some(i) = rest.find("/*") {
        code.push_str(&rest[..i]);
        rest = rest[i..].find("*/").map_or("", |j| &rest[i + j + 2..]);
    }
    code.push_str(rest);
    let mut out = BTreeSet::new();
    let b = code.as_bytes();
    let mut i = 0;
    while let Some(j) = code[i..].find("chfs_") {
        let start = i + j;
        let mut end = start;
        while end < b.len() && (b[end].is_ascii_alphanumeric() || b[end] == b'_') {
            end += 1;
        }
        let mut k = end;
        while k < b.len() && b[k] == b' ' {
            k += 1;
        }
        let ident_start =
            start == 0 || !(b[start - 1].is_ascii_alphanumeric() || b[start - 1] == b'_');
        if ident_start && k < b.len() && b[k] == b'(' {
            out.insert(code[start..end].to_string());
        }
        i = end;
    }
    out
}

#[test]
fn installed_tree_header_and_exported_symbols_match() {
    let p = Prefix::install();
    let version = env!("CARGO_PKG_VERSION");
    let lib = p.path().join("lib");
    for f in ["bin/chfsd", "include/chfs.h", "lib/pkgconfig/chfs.pc"] {
        assert!(p.path().join(f).is_file(), "{f} not installed");
    }
    let real = lib.join(format!("libchfs.so.{version}"));
    assert!(real.is_file());
    assert_eq!(
        std::fs::read_link(lib.join("libchfs.so.0")).unwrap(),
        PathBuf::from(format!("libchfs.so.{version}"))
    );
    assert_eq!(
        std::fs::read_link(lib.join("libchfs.so")).unwrap(),
        PathBuf::from("libchfs.so.0")
    );
    assert_eq!(p.pkg_config(&["--modversion"]), version);

    let dynamic =
        String::from_utf8(check(Command::new("readelf").arg("-d").arg(&real)).stdout).unwrap();
    assert!(
        dynamic.contains("Library soname: [libchfs.so.0]"),
        "{dynamic}"
    );
    for line in dynamic.lines().filter(|l| l.contains("(NEEDED)")) {
        assert!(
            [
                "libc.so",
                "libgcc_s.so",
                "ld-linux",
                "libm.so",
                "libpthread.so",
                "libdl.so"
            ]
            .iter()
            .any(|s| line.contains(s)),
            "unexpected dependency: {line}"
        );
    }

    // Exported functions == declared functions, and nothing else exported.
    let nm = String::from_utf8(
        check(Command::new("nm").args(["-D", "--defined-only"]).arg(&real)).stdout,
    )
    .unwrap();
    let mut exported = BTreeSet::new();
    for l in nm.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() == 3 && matches!(f[1], "T" | "W" | "i") {
            assert!(f[2].starts_with("chfs_"), "undocumented export {}", f[2]);
            exported.insert(f[2].to_string());
        }
    }
    let header = std::fs::read_to_string(p.path().join("include/chfs.h")).unwrap();
    let declared = header_functions(&header);
    assert_eq!(
        declared, exported,
        "chfs.h declarations vs exported symbols"
    );
    assert!(declared.len() >= 44, "{declared:?}");

    // Every CHFS signature, redeclared verbatim, agrees with chfs.h and links.
    let tmp = tempfile::tempdir().unwrap();
    let exe = p.cc("signatures", tmp.path());
    check(&mut clean(&exe));

    // The header also works from C++.
    let flags = p.pkg_config(&["--cflags", "--libs"]);
    let cxx = tmp.path().join("cxx_header");
    check(
        Command::new("c++")
            .args(["-Wall", "-Wextra", "-Werror", "-o"])
            .arg(&cxx)
            .arg(Path::new(CRATE).join("tests/c/cxx_header.cc"))
            .args(flags.split_whitespace()),
    );
    let out = check(&mut clean(&cxx));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "cxx_header: ok\n");
}

#[test]
fn every_function_against_real_servers() {
    let p = Prefix::install();
    let tmp = tempfile::tempdir().unwrap();
    let exe = p.cc("api_test", tmp.path());
    for protocol in protocols("every_function_against_real_servers") {
        every_function_over(&p, &exe, protocol);
    }
}

fn every_function_over(p: &Prefix, exe: &Path, protocol: Option<&str>) {
    let tmp = tempfile::tempdir().unwrap();
    let pool = p.pool_over(3, protocol);
    if protocol.is_some() {
        assert!(pool.server_string().starts_with("ofi+"));
    }
    let local = tmp.path().join("local");
    std::fs::create_dir(&local).unwrap();
    let out = check(
        clean(exe)
            .env("CHFS_SERVER", &pool.addrs()[0])
            .env("CHFS_RPC_TIMEOUT_MSEC", "10000")
            .arg(pool.server_string())
            .arg("3")
            .arg(&local),
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "api_test: ok\n");
    assert!(
        out.stderr.is_empty(),
        "library printed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn open_and_create_take_chfs_flags_by_default_and_open2_flags_on_request() {
    let p = Prefix::install();
    let tmp = tempfile::tempdir().unwrap();
    let exe = p.cc("flags_test", tmp.path());
    let pool = p.pool(2);
    for (mode, posix) in [("chfs", None), ("chfs", Some("0")), ("posix", Some("1"))] {
        let mut c = clean(&exe);
        c.env("CHFS_SERVER", pool.server_string()).arg(mode);
        if let Some(v) = posix {
            c.env("CHFS_POSIX_FLAGS", v);
        }
        let out = check(&mut c);
        assert_eq!(String::from_utf8_lossy(&out.stdout), "flags_test: ok\n");
        assert!(
            out.stderr.is_empty(),
            "library printed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn binary_keeps_running_when_only_the_library_is_swapped() {
    let a = Prefix::install();
    let tmp = tempfile::tempdir().unwrap();
    let exe = a.cc("writer", tmp.path());
    let dynamic =
        String::from_utf8(check(Command::new("readelf").arg("-d").arg(&exe)).stdout).unwrap();
    assert!(
        dynamic.contains("Shared library: [libchfs.so.0]"),
        "program must depend on the soname: {dynamic}"
    );
    let pool = a.pool(2);
    let run_writer = |ld: Option<&Path>| {
        let mut c = clean(&exe);
        c.env("CHFS_SERVER", pool.server_string())
            .args(["/swap", "0", "1", "1000", "3"]);
        if let Some(d) = ld {
            c.env("LD_LIBRARY_PATH", d);
        }
        run(&mut c)
    };
    assert!(run_writer(None).status.success());

    // Another build of the library in another tree; the first one removed.
    let b = Prefix::install();
    for f in std::fs::read_dir(a.path().join("lib")).unwrap() {
        let f = f.unwrap().path();
        if f.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("libchfs.so")
        {
            std::fs::remove_file(f).unwrap();
        }
    }
    let out = run_writer(None);
    assert!(!out.status.success(), "ran without any libchfs.so.0");
    let out = run_writer(Some(&b.path().join("lib")));
    assert!(
        out.status.success(),
        "with the swapped library: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let verify = check(
        clean(&exe)
            .env("CHFS_SERVER", pool.server_string())
            .env("LD_LIBRARY_PATH", b.path().join("lib"))
            .args(["/swap", "verify", "1", "1000", "3"]),
    );
    assert!(String::from_utf8_lossy(&verify.stdout).contains("verified 3000 bytes"));
}

#[test]
fn two_processes_write_one_file_at_disjoint_offsets() {
    let p = Prefix::install();
    let tmp = tempfile::tempdir().unwrap();
    let exe = p.cc("writer", tmp.path());
    let pool = p.pool(2);
    // 10000-byte blocks: chunks of 64 KiB are shared by both writers.
    let children: Vec<_> = (0..2)
        .map(|rank| {
            clean(&exe)
                .env("CHFS_SERVER", pool.server_string())
                .args(["/shared", &rank.to_string(), "2", "10000", "40"])
                .spawn()
                .expect("spawn writer")
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success());
    }
    let out = check(
        clean(&exe)
            .env("CHFS_SERVER", pool.server_string())
            .args(["/shared", "verify", "2", "10000", "40"]),
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("verified 800000 bytes"));
}

/// The node-local area through the C API: two processes write a file in
/// `/.nodelocal`, a third verifies it, and every one of its chunks lies on
/// the server of this host that keeps the area (the first), none on the
/// other.
#[test]
fn node_local_files_through_the_c_api_stay_on_the_local_server() {
    let p = Prefix::install();
    let tmp = tempfile::tempdir().unwrap();
    let exe = p.cc("writer", tmp.path());
    let pool = p.pool(2);
    let c = rust_client(&pool);
    let entries = |c: &Client| -> Vec<u64> {
        c.server_status()
            .into_iter()
            .map(|(_, s)| s.unwrap().entries)
            .collect()
    };
    let before = entries(&c);
    let path = format!("{}/w", chfs_proto::path::NODE_LOCAL_PREFIX);
    for rank in ["0", "1"] {
        check(clean(&exe).env("CHFS_SERVER", pool.server_string()).args([
            path.as_str(),
            rank,
            "2",
            "10000",
            "40",
        ]));
    }
    let out = check(clean(&exe).env("CHFS_SERVER", pool.server_string()).args([
        path.as_str(),
        "verify",
        "2",
        "10000",
        "40",
    ]));
    assert!(String::from_utf8_lossy(&out.stdout).contains("verified 800000 bytes"));
    let after = entries(&c);
    // 800,000 bytes in 64 KiB chunks: 13 chunks, all on server 0.
    assert_eq!(after[0] - before[0], 13, "{before:?} -> {after:?}");
    assert_eq!(after[1], before[1], "{before:?} -> {after:?}");
}

#[test]
fn buf_size_aggregates_small_writes_into_few_requests() {
    let p = Prefix::install();
    let tmp = tempfile::tempdir().unwrap();
    let exe = p.cc("bufwrite", tmp.path());
    let pool = p.pool(2);
    let c = rust_client(&pool);
    let mut delta = Vec::new();
    for buf in ["0", "65536"] {
        let before = server_requests(&c);
        check(
            clean(&exe)
                .env("CHFS_SERVER", pool.server_string())
                .env("CHFS_BUF_SIZE", buf)
                .args([&format!("/buf{buf}"), "1000", "100"]),
        );
        delta.push(server_requests(&c) - before);
    }
    let (plain, buffered) = (delta[0], delta[1]);
    eprintln!("server requests for 1000 writes of 100 B: CHFS_BUF_SIZE=0: {plain}, CHFS_BUF_SIZE=65536: {buffered}");
    assert!(
        plain >= 1000,
        "each unbuffered write is a request ({plain})"
    );
    assert!(
        buffered * 10 <= plain,
        "buffered {buffered} vs unbuffered {plain}"
    );
}

fn server_reads(c: &Client) -> u64 {
    c.server_status()
        .into_iter()
        .map(|(a, s)| s.unwrap_or_else(|e| panic!("status of {a}: {e}")).reads)
        .sum()
}

#[test]
fn strided_reads_come_several_records_per_request() {
    let p = Prefix::install();
    let tmp = tempfile::tempdir().unwrap();
    let exe = p.cc("strided", tmp.path());
    let pool = p.pool(2);
    let c = rust_client(&pool);
    let mut delta = Vec::new();
    // 46 records of 47,008 bytes every 4 records, in 16 MiB chunks.
    for ahead in ["0", "1048576"] {
        let before = server_reads(&c);
        check(
            clean(&exe)
                .env("CHFS_SERVER", pool.server_string())
                .env("CHFS_CHUNK_SIZE", "16777216")
                .env("CHFS_READ_AHEAD", ahead)
                .args([&format!("/strided{ahead}"), "47008", "4", "46"]),
        );
        delta.push(server_reads(&c) - before);
    }
    eprintln!(
        "server reads for 46 strided records and one across the end: read-ahead off {}, on {}",
        delta[0], delta[1]
    );
    // Off: one per record, and the last one. On: two to find the
    // pattern, one request per 22 records (1 MiB), and the last one.
    assert_eq!(delta, [47, 2 + 2 + 1]);
}

#[test]
fn bad_environment_makes_init_fail_cleanly() {
    let p = Prefix::install();
    let tmp = tempfile::tempdir().unwrap();
    let exe = p.cc("env_test", tmp.path());
    let pool = p.pool(1);
    let srv = pool.server_string();
    // A bad value of one variable: EINVAL (ENOENT for a missing backend
    // directory), and chfs_last_error() quotes the variable and the value.
    let bad: &[(&str, &str, i32)] = &[
        ("CHFS_CHUNK_SIZE", "abc", libc::EINVAL),
        ("CHFS_CHUNK_SIZE", "0", libc::EINVAL),
        ("CHFS_CHUNK_SIZE", "64k", libc::EINVAL),
        ("CHFS_BUF_SIZE", "-1", libc::EINVAL),
        ("CHFS_ASYNC_ACCESS", "yes", libc::EINVAL),
        ("CHFS_RPC_TIMEOUT_MSEC", "1s", libc::EINVAL),
        ("CHFS_NODE_LIST_CACHE_TIMEOUT", "x", libc::EINVAL),
        ("CHFS_LOG_PRIORITY", "loud", libc::EINVAL),
        ("CHFS_LOOKUP_LOCAL", "2", libc::EINVAL),
        ("CHFS_LOOKUP_RELAY_GROUP", "-1", libc::EINVAL),
        ("CHFS_LOOKUP_RELAY_GROUP_AUTO", "on", libc::EINVAL),
        ("CHFS_BACKEND_PATH", "/nonexistent/backend", libc::ENOENT),
        ("CHFS_RDMA_THRESH", "big", libc::EINVAL),
        ("CHFS_POSIX_FLAGS", "yes", libc::EINVAL),
    ];
    // (environment, errno of chfs_init, text chfs_last_error() contains)
    type Case<'a> = (Vec<(&'a str, &'a str)>, i32, String);
    let mut cases: Vec<Case> = bad
        .iter()
        .map(|&(k, v, e)| {
            (
                vec![("CHFS_SERVER", &srv[..]), (k, v)],
                e,
                format!("{k}={v:?}"),
            )
        })
        .collect();
    cases.extend([
        (vec![], libc::EINVAL, "needs CHFS_SERVER".to_string()),
        (
            vec![("CHFS_SERVER", "")],
            libc::EINVAL,
            "needs CHFS_SERVER".into(),
        ),
        (
            vec![("CHFS_SERVER", &srv), ("CHFS_SUBDIR_PATH", "")],
            0,
            String::new(),
        ),
        (
            vec![("CHFS_SERVER", "127.0.0.1:1")],
            libc::ECONNREFUSED,
            "127.0.0.1:1".into(),
        ),
        (
            vec![
                ("CHFS_SERVER", &srv),
                ("CHFS_CHUNK_SIZE", "4096"),
                ("CHFS_ASYNC_ACCESS", "0"),
                ("CHFS_BUF_SIZE", "8192"),
                ("CHFS_RPC_TIMEOUT_MSEC", "5000"),
                ("CHFS_NODE_LIST_CACHE_TIMEOUT", "10"),
                ("CHFS_LOOKUP_LOCAL", "1"),
                ("CHFS_LOOKUP_RELAY_GROUP", "4"),
                ("CHFS_LOOKUP_RELAY_GROUP_AUTO", "0"),
                ("CHFS_BACKEND_PATH", "/tmp"),
                ("CHFS_SUBDIR_PATH", "/stage"),
                ("CHFS_RDMA_THRESH", "65536"),
                ("CHFS_POSIX_FLAGS", "1"),
            ],
            0,
            String::new(),
        ),
    ]);
    for (env, errno, text) in &cases {
        let mut c = clean(&exe);
        c.envs(env.iter().copied()).arg(errno.to_string());
        if !text.is_empty() {
            c.arg(text);
        }
        let out = check(&mut c);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "env_test: ok\n",
            "{env:?}"
        );
        assert!(
            out.stderr.is_empty(),
            "{env:?}: library printed {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Logging on request: the reason goes to stderr.
    let out = check(
        clean(&exe)
            .env("CHFS_SERVER", &srv)
            .env("CHFS_LOG_PRIORITY", "err")
            .env("CHFS_CHUNK_SIZE", "abc")
            .arg(libc::EINVAL.to_string()),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("CHFS_CHUNK_SIZE") && err.contains("err:"),
        "{err}"
    );
}

#[test]
fn init_needs_the_pools_key_from_the_environment() {
    // A pool with a secret (as chfsctl starts by default): chfs_init gets
    // in with the client key or the secret from CHFS_SECRET_FILE /
    // CHFS_SECRET, and fails cleanly (EACCES, nothing printed) without.
    let p = Prefix::install();
    let tmp = tempfile::tempdir().unwrap();
    let exe = p.cc("env_test", tmp.path());
    let pool = LocalPool::start_with(
        PoolOptions {
            servers: 2,
            chfsd: Some(p.chfsd()),
            ..Default::default()
        }
        .with_new_secret(),
    )
    .expect("start chfsd pool from PREFIX/bin");
    let srv = pool.server_string();
    let key = pool.client_key_file().unwrap();
    let key = key.to_str().unwrap();
    let secret = pool.secret().unwrap();
    let wrong = tmp.path().join("wrong.key");
    std::fs::write(
        &wrong,
        chfs_proto::handshake::Credential::client_key_file(b"another pool"),
    )
    .unwrap();
    // (environment, errno of chfs_init, text chfs_last_error() contains)
    type Case<'a> = (&'a [(&'a str, &'a str)], i32, &'a str);
    let cases: &[Case] = &[
        (&[], libc::EACCES, "CHFS_SECRET_FILE"),
        (&[("CHFS_SECRET_FILE", key)], 0, ""),
        (&[("CHFS_SECRET", secret)], 0, ""),
        // The file wins over the variable, as documented.
        (
            &[("CHFS_SECRET_FILE", key), ("CHFS_SECRET", "wrong")],
            0,
            "",
        ),
        (&[("CHFS_SECRET", "wrong")], libc::EACCES, "secret"),
        (
            &[("CHFS_SECRET_FILE", wrong.to_str().unwrap())],
            libc::EACCES,
            "secret",
        ),
        (
            &[("CHFS_SECRET_FILE", "/nonexistent/chfs.client.key")],
            libc::EACCES,
            "/nonexistent/chfs.client.key",
        ),
    ];
    for (env, errno, text) in cases {
        let mut c = clean(&exe);
        c.env("CHFS_SERVER", &srv)
            .envs(env.iter().copied())
            .arg(errno.to_string());
        if !text.is_empty() {
            c.arg(text);
        }
        let out = check(&mut c);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "env_test: ok\n",
            "{env:?}"
        );
        assert!(out.stderr.is_empty(), "{env:?}");
    }
}

#[test]
fn stagein_from_the_servers_backend() {
    let p = Prefix::install();
    let tmp = tempfile::tempdir().unwrap();
    let exe = p.cc("stagein_backend", tmp.path());
    let backend = tmp.path().join("backend");
    std::fs::create_dir_all(backend.join("input")).unwrap();
    let data = vec![7u8; 300_000];
    std::fs::write(backend.join("input/f1"), &data).unwrap();
    std::fs::write(backend.join("input/f2"), &data[..1000]).unwrap();
    let pool = LocalPool::start_with(PoolOptions {
        servers: 2,
        chfsd: Some(p.chfsd()),
        args: vec!["--backend".into(), backend.display().to_string()],
        ..Default::default()
    })
    .expect("pool with backend");
    let c = rust_client(&pool);
    let stored = |c: &Client| -> u64 {
        c.server_status()
            .into_iter()
            .map(|(a, s)| s.unwrap_or_else(|e| panic!("status of {a}: {e}")).bytes)
            .sum()
    };
    let before = stored(&c);
    let out = check(
        clean(&exe)
            .env("CHFS_SERVER", pool.server_string())
            .current_dir(tmp.path())
            .arg("/input"),
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "stagein_backend: ok\n"
    );
    let after = stored(&c);
    assert!(
        after - before >= 301_000,
        "servers hold {} more bytes after stage-in",
        after - before
    );
}

#[test]
fn servers_dying_under_a_c_program_give_errors_not_signals() {
    let p = Prefix::install();
    let tmp = tempfile::tempdir().unwrap();
    let exe = p.cc("server_dies", tmp.path());
    for protocol in protocols("servers_dying_under_a_c_program_give_errors_not_signals") {
        servers_dying_over(&p, &exe, protocol, &[]);
    }
    // Over TCP without cross-memory attach: 1 MiB writes carry their data
    // in the frame (head and data in one sendmsg(2) each), sent to
    // servers that are gone.
    servers_dying_over(
        &p,
        &exe,
        None,
        &[("CHFS_LOCAL_SOCKET", "0"), ("CHFS_CMA", "0")],
    );
}

fn servers_dying_over(p: &Prefix, exe: &Path, protocol: Option<&str>, env: &[(&str, &str)]) {
    let pool = p.pool_over(2, protocol);
    let pids: Vec<String> = (0..2)
        .map(|i| pool.pid(i).expect("pid").to_string())
        .collect();
    let out = run(clean(exe)
        .env("CHFS_SERVER", pool.server_string())
        .env("CHFS_RPC_TIMEOUT_MSEC", "3000")
        .envs(env.iter().copied())
        .args(&pids));
    assert!(
        out.status.success(),
        "{:?}: stdout {} stderr {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "server_dies: ok\n");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_full_pool_gives_short_writes_and_honest_sizes() {
    let p = Prefix::install();
    let tmp = tempfile::tempdir().unwrap();
    let exe = p.cc("enospc", tmp.path());
    // (The DRAM engine's, whatever `CHFS_TEST_STORE` says.)
    let pool = LocalPool::start_with(PoolOptions {
        servers: 2,
        chfsd: Some(p.chfsd()),
        args: vec!["--size".into(), "1M".into()],
        store: Some("mem".into()),
        ..Default::default()
    })
    .unwrap();
    let out = run(clean(&exe).env("CHFS_SERVER", pool.server_string()));
    assert!(
        out.status.success(),
        "{:?}: stdout {} stderr {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "enospc: ok\n");
}

/// A C program's signal handlers stay its own once libchfs has reached
/// the pool, over TCP and over ofi+tcp (where that loads libfabric):
/// tests/c/signals.c.
#[test]
fn a_c_programs_signal_handlers_stay_its_own() {
    let p = Prefix::install();
    let tmp = tempfile::tempdir().unwrap();
    let exe = p.cc("signals", tmp.path());
    for protocol in protocols("a_c_programs_signal_handlers_stay_its_own") {
        let pool = p.pool_over(1, protocol);
        let out = run(clean(&exe).env("CHFS_SERVER", pool.server_string()));
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            (out.status.signal(), String::from_utf8_lossy(&out.stdout)),
            (Some(libc::SIGINT), "signals: ok\n".into()),
            "{protocol:?}: {}, stderr {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Files in /dev/shm named after process `pid` (libfabric's shm provider
/// names an endpoint's queue file `PID:N:M`).
fn shm_files_of(pid: u32) -> Vec<String> {
    let prefix = format!("{pid}:");
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// A C program over `ofi+shm` leaves no queue file in /dev/shm when it
/// returns from main or calls exit(3), even with another thread reading
/// through libchfs at that moment (and it ends cleanly: status 0), and
/// neither do its servers once stopped (SIGTERM). libfabric's shm
/// provider unlinks an endpoint's 16 MiB queue file only when the endpoint
/// closes, and the library's shared endpoint is never closed: every such
/// program left its file (tests/c/shm_exit.c).
#[test]
fn a_c_program_over_ofi_shm_leaves_no_queue_file() {
    if !chfs_fabric::BUILT_WITH_LIBFABRIC {
        chfs_localpool::skip(
            "fabric",
            "a_c_program_over_ofi_shm_leaves_no_queue_file",
            "built without libfabric",
        );
        return;
    }
    let p = Prefix::install();
    let tmp = tempfile::tempdir().unwrap();
    let exe = p.cc("shm_exit", tmp.path());
    let pool = p.pool_over(2, Some("ofi+shm"));
    let mut pids: Vec<(String, u32)> = (0..2)
        .map(|i| ("chfsd".to_string(), pool.pid(i).expect("pid")))
        .collect();
    for (what, pid) in &pids {
        assert!(
            !shm_files_of(*pid).is_empty(),
            "{what} {pid}: no queue file"
        );
    }
    for how in ["return", "exit", "return", "exit"] {
        let child = clean(&exe)
            .env("CHFS_SERVER", pool.server_string())
            .env("CHFS_RPC_TIMEOUT_MSEC", "10000")
            .args([&format!("/{how}-{}", pids.len()), how])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn shm_exit");
        let pid = child.id();
        let out = child.wait_with_output().expect("wait shm_exit");
        assert!(
            out.status.success(),
            "{how}: {:?}: stdout {} stderr {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), "shm_exit: ok\n");
        assert_eq!(shm_files_of(pid), Vec::<String>::new(), "after {how}");
        pids.push((how.to_string(), pid));
    }
    pool.stop();
    let left: Vec<_> = pids
        .iter()
        .map(|(what, p)| (what, p, shm_files_of(*p)))
        .filter(|(_, _, f)| !f.is_empty())
        .collect();
    // Not left for others either way (every one of them has ended).
    for (_, _, files) in &left {
        for f in files {
            let _ = std::fs::remove_file(format!("/dev/shm/{f}"));
        }
    }
    assert!(left.is_empty(), "queue files left in /dev/shm: {left:?}");
}
