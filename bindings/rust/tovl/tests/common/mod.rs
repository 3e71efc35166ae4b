//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod conform;
pub mod json;

use std::path::PathBuf;

/// The repository root (bindings/rust/tovl/../../..).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../..")
        .canonicalize()
        .unwrap()
}

/// The `tovl` CLI: TOVL_CLI, else the build tree's tools/tovl beside the
/// linked libtovl, else an install's bin/tovl.
pub fn cli() -> PathBuf {
    if let Ok(p) = std::env::var("TOVL_CLI") {
        return PathBuf::from(p);
    }
    let lib = PathBuf::from(env!("TOVL_LINKED_LIBDIR"));
    for p in [lib.join("tools/tovl"), lib.join("../bin/tovl")] {
        if p.exists() {
            return p;
        }
    }
    panic!(
        "no tovl CLI beside the linked libtovl in {} (tools/tovl or ../bin/tovl): set TOVL_CLI",
        lib.display()
    );
}

/// CI (CI=true) or TOVL_REQUIRE_VULKAN=1: a missing Vulkan device fails.
pub fn vulkan_required() -> bool {
    std::env::var("CI").map(|v| v == "true").unwrap_or(false)
        || std::env::var("TOVL_REQUIRE_VULKAN").map(|v| v == "1").unwrap_or(false)
}

/// A seed: TOVL_SEED when set, else a fresh one; printed so a run replays.
pub fn seed(what: &str) -> u64 {
    let s = std::env::var("TOVL_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(conform::fresh_seed);
    eprintln!("{what}: seed {s} (TOVL_SEED={s} replays it)");
    s
}
