//! Gives the shared library the soname of the original CHFS library, so
//! programs linked against either load the other (`libchfs.so.0`).

fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if os == "linux" || os == "freebsd" || os == "netbsd" || os == "openbsd" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libchfs.so.0");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
