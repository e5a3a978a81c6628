//! Compiles the C shim (the variadic and fortified entry points, which
//! stable Rust cannot define, and the fopencookie glue) and exports its
//! entry points: rustc's own version script would keep them local.

fn main() {
    println!("cargo:rerun-if-changed=src/shim.c");
    println!("cargo:rerun-if-changed=src/exports.map");
    println!("cargo:rerun-if-changed=build.rs");
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/src/exports.map");
    cc::Build::new()
        .file("src/shim.c")
        .warnings(true)
        .extra_warnings(true)
        .compile("chfs_preload_shim");
}
