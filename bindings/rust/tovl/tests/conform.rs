//! The conformance suite driven from Rust (tests/common/conform.rs) on every
//! present backend (cpu and lavapipe in CI; cuda and Vulkan on a GPU machine)
//! against the CPU reference, bit for bit, and its table against `tovl
//! conform`'s on the same seed. A backend that is not present is left out
//! with its reason, except Vulkan under CI or TOVL_REQUIRE_VULKAN=1 and CUDA
//! under TOVL_REQUIRE_CUDA=1 (the GPU suite).
mod common;

use std::process::Command;

use common::conform::{case_count, conform_backend, Outcome};
use tovl::Backend;

fn summary(rows: &[Outcome]) -> String {
    let failed: Vec<String> = rows
        .iter()
        .filter(|r| r.result == "failed")
        .map(|r| format!("{} {} {}: {}", r.backend, r.kernel, r.case, r.detail))
        .collect();
    format!("{} rows, {} failed:\n{}", rows.len(), failed.len(), failed.join("\n"))
}

fn run_on(name: &str, seed: u64) -> Vec<Outcome> {
    let dut = Backend::open(name).unwrap_or_else(|e| panic!("{name} is listed available but does not open: {e}"));
    let reference = Backend::open("cpu").expect("the CPU reference always opens");
    let rows = conform_backend(&reference, &dut, seed, true);
    expect_all_pass(name, &rows);
    if dut.device().contains("llvmpipe") {
        // lavapipe keeps subnormals: nothing may skip there
        assert!(
            rows.iter().all(|r| r.result == "passed"),
            "{} skipped on lavapipe",
            summary(&rows)
        );
    }
    if name == "cpu" {
        assert!(rows.iter().all(|r| r.result == "passed"), "nothing skips on the CPU");
    }
    rows
}

fn expect_all_pass(name: &str, rows: &[Outcome]) {
    assert_eq!(rows.len(), case_count());
    assert!(rows.iter().all(|r| r.result != "failed"), "{name}: {}", summary(rows));
    let passed = rows.iter().filter(|r| r.result == "passed").count();
    assert!(
        passed > rows.len() / 2,
        "{name}: only {passed} of {} cases ran",
        rows.len()
    );
}

/// `tovl conform --seed S --json` and the Rust suite on the same seed give the
/// same table: every (backend, kernel, case, result, detail), every backend
/// present here.
#[test]
fn every_backend_matches_the_reference_and_tovl_conform() {
    let list = Backend::list();
    for info in list.iter().filter(|i| !i.available) {
        let required = match info.name.as_str() {
            "vulkan" => common::vulkan_required(),
            "cuda" => std::env::var("TOVL_REQUIRE_CUDA").map(|v| v == "1").unwrap_or(false),
            _ => false,
        };
        assert!(
            !required,
            "{} is required here but unavailable: {}",
            info.name, info.reason
        );
        eprintln!("SKIP {}: {}", info.name, info.reason);
    }
    let seed = common::seed("conform table");
    let json_path = std::env::temp_dir().join(format!("tovl-rust-conform-{}.json", std::process::id()));
    let status = Command::new(common::cli())
        .args(["conform", "--seed", &seed.to_string(), "--json"])
        .arg(&json_path)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("run tovl conform");
    let text = std::fs::read_to_string(&json_path).expect("tovl conform wrote its --json file");
    let _ = std::fs::remove_file(&json_path);
    assert!(status.success(), "tovl conform failed on seed {seed}");
    let root = common::json::parse(&text).expect("tovl conform's JSON parses");
    assert_eq!(root.get("seed").and_then(|s| s.str()), Some(seed.to_string().as_str()));
    let theirs: Vec<Outcome> = root
        .get("results")
        .expect("results")
        .arr()
        .iter()
        .map(|r| {
            let f = |k: &str| r.get(k).and_then(|v| v.str()).unwrap_or_default().to_string();
            let result = match f("result").as_str() {
                "passed" => "passed",
                "skipped" => "skipped",
                _ => "failed",
            };
            Outcome {
                backend: f("backend"),
                kernel: f("kernel"),
                case: f("case"),
                result,
                detail: f("detail"),
            }
        })
        .collect();
    // tovl conform runs every available backend in Backend::list order (cpu too).
    let mut ours = Vec::new();
    for info in list.iter().filter(|i| i.available) {
        ours.extend(run_on(&info.name, seed));
    }
    assert!(!ours.is_empty());
    assert_eq!(
        ours.len(),
        theirs.len(),
        "row counts differ: rust {}, tovl conform {}",
        ours.len(),
        theirs.len()
    );
    for (a, b) in ours.iter().zip(&theirs) {
        assert_eq!(a, b, "seed {seed}: the Rust row differs from tovl conform's");
    }
    eprintln!(
        "conform table: {} rows on {:?} equal tovl conform's (seed {seed})",
        ours.len(),
        Backend::list()
            .iter()
            .filter(|i| i.available)
            .map(|i| i.name.clone())
            .collect::<Vec<_>>()
    );
}
