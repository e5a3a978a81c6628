//! Finds libfabric through pkg-config (`libfabric.pc`, from Debian's
//! `libfabric-dev`). Found: compiles the C shim (src/shim.c: libfabric's
//! calls are mostly static inline functions in its headers) against its
//! headers, and sets `cfg(chfs_libfabric)`. The library is not linked: the
//! shim loads it on first use (see src/shim.c: its dependencies install
//! signal handlers in every process they are loaded into), from pkg-config's
//! `libdir` first, then by its soname. Not found:
//! the crate builds without them, and opening an endpoint fails with
//! `Error::Unavailable` saying why. `CHFS_FABRIC=off` builds without
//! libfabric on purpose (to test that build).

use std::process::Command;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(chfs_libfabric)");
    println!("cargo:rerun-if-changed=src/shim.c");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-env-changed=CHFS_FABRIC");
    if std::env::var("CHFS_FABRIC").is_ok_and(|v| v == "off") {
        return;
    }
    let Some(flags) = pkg_config(&["--cflags", "--libs", "libfabric"]) else {
        return;
    };
    let mut build = cc::Build::new();
    build.file("src/shim.c").warnings(true).extra_warnings(true);
    for flag in flags.split_whitespace() {
        if let Some(dir) = flag.strip_prefix("-I") {
            build.include(dir);
        } else if let Some(dir) = flag.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={dir}");
        } else if flag.starts_with("-l") {
            // Loaded at run time by the shim, not linked.
        } else if flag.starts_with("-D") {
            build.flag(flag);
        }
    }
    if let Some(dir) = pkg_config(&["--variable=libdir", "libfabric"]) {
        let path = format!("{}/libfabric.so.1", dir.trim());
        if !path.contains('"') && !path.contains('\\') {
            build.define("CHFS_LIBFABRIC_PATH", format!("\"{path}\"").as_str());
        }
    }
    build.compile("chfs_fabric_shim");
    println!("cargo:rustc-link-lib=dl");
    println!("cargo:rustc-cfg=chfs_libfabric");
}

/// pkg-config's answer, or None where pkg-config or the package is missing.
fn pkg_config(args: &[&str]) -> Option<String> {
    let out = Command::new("pkg-config").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}
