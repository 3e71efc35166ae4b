//! Finds libtovl and tells cargo how to link it.
//!
//! Where the library comes from (first match wins):
//! 1. `TOVL_LIB_DIR=DIR`: the directory holding libtovl.so (e.g. a CMake build
//!    tree such as `build/`, or an install's lib directory).
//! 2. `TOVL_PKG_CONFIG=1`: an installed tovl, found by `pkg-config tovl`
//!    (PKG_CONFIG_PATH applies).
//! 3. Neither set: the project's build tree `../../../build` (what `make`
//!    builds) when it holds libtovl.so, else `pkg-config tovl`.
//!
//! Dependent crates get the directory as `DEP_TOVL_LIBDIR`, so their binaries
//! can carry it as an rpath (the `tovl` crate does).
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn pkg_config_libdir() -> Result<PathBuf, String> {
    let out = Command::new("pkg-config")
        .args(["--variable=libdir", "tovl"])
        .output()
        .map_err(|e| format!("cannot run pkg-config: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "pkg-config tovl failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if dir.is_empty() {
        return Err("pkg-config tovl gave no libdir".into());
    }
    Ok(PathBuf::from(dir))
}

fn has_lib(dir: &Path) -> bool {
    dir.join("libtovl.so").exists()
}

fn main() {
    println!("cargo:rerun-if-env-changed=TOVL_LIB_DIR");
    println!("cargo:rerun-if-env-changed=TOVL_PKG_CONFIG");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let tree = manifest.join("../../../build");

    let dir = if let Ok(dir) = env::var("TOVL_LIB_DIR") {
        let dir = PathBuf::from(dir);
        if !has_lib(&dir) {
            panic!("TOVL_LIB_DIR={}: no libtovl.so there", dir.display());
        }
        dir
    } else if env::var("TOVL_PKG_CONFIG").map(|v| v == "1").unwrap_or(false) {
        pkg_config_libdir().unwrap_or_else(|e| panic!("TOVL_PKG_CONFIG=1: {e}"))
    } else if has_lib(&tree) {
        tree.canonicalize().unwrap_or(tree)
    } else {
        pkg_config_libdir().unwrap_or_else(|e| {
            panic!(
                "libtovl not found: no libtovl.so in the build tree {} and {e}; \
                 build tovl (make build), or set TOVL_LIB_DIR or TOVL_PKG_CONFIG=1",
                tree.display()
            )
        })
    };
    println!("cargo:rerun-if-changed={}", dir.join("libtovl.so").display());
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=dylib=tovl");
    // This crate's own test binaries (the layout tests) load the library too.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    println!("cargo:libdir={}", dir.display());
}
