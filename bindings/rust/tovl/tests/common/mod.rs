//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod conform;
pub mod json;

use std::path::PathBuf;

use conform::Rng;
use tovl::{OverlayDesc, OverlayRows};

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

/// Host rows: `ids[j]`'s row is `rows[j * h .. (j + 1) * h]`.
pub struct Rows {
    pub ids: Vec<u32>,
    pub rows: Vec<u16>,
}

/// `n` distinct random ids below `vocab` and random bf16 rows of width `h`.
pub fn random_rows(r: &mut Rng, vocab: u32, n: u32, h: u32) -> Rows {
    let mut ids = Vec::new();
    while ids.len() < n as usize {
        let id = r.below(vocab);
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    Rows {
        ids,
        rows: (0..n * h).map(|_| r.bf16()).collect(),
    }
}

/// The description of an overlay of `embed` rows and optionally `lm` rows.
pub fn desc<'a>(vocab: u32, h: u32, embed: &'a Rows, lm: Option<&'a Rows>, tied: bool) -> OverlayDesc<'a> {
    OverlayDesc {
        adapter: Some("test"),
        vocab,
        hidden: h,
        embed: OverlayRows {
            tensor: "embed",
            ids: &embed.ids,
            rows: &embed.rows,
            width: h,
        },
        lmhead: lm.map(|l| OverlayRows {
            tensor: "lm_head",
            ids: &l.ids,
            rows: &l.rows,
            width: h,
        }),
        tied,
    }
}
