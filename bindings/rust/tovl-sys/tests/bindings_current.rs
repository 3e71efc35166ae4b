//! The checked-in bindings equal what generate.sh makes from today's headers:
//! a header change without `generate.sh` fails here, naming the first line
//! that differs.
use std::path::PathBuf;
use std::process::Command;

#[test]
fn bindings_match_the_headers() {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let fresh = std::env::temp_dir().join(format!("tovl-sys-bindings-{}.rs", std::process::id()));
    let status = Command::new("bash")
        .arg(here.join("generate.sh"))
        .arg(&fresh)
        .status()
        .expect("cannot run generate.sh (bash)");
    assert!(
        status.success(),
        "generate.sh failed (is Debian's bindgen installed? scripts/setup-debian.sh installs it)"
    );
    let new = std::fs::read_to_string(&fresh).unwrap();
    let _ = std::fs::remove_file(&fresh);
    let old = std::fs::read_to_string(here.join("src/bindings.rs")).unwrap();
    if new != old {
        let line = new
            .lines()
            .zip(old.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| new.lines().count().min(old.lines().count()));
        panic!(
            "src/bindings.rs is stale (first difference at line {}: now {:?}, checked in {:?}); \
             run bindings/rust/tovl-sys/generate.sh and commit it",
            line + 1,
            new.lines().nth(line),
            old.lines().nth(line)
        );
    }
}
