#!/usr/bin/env bash
# The Rust bindings' checks (bindings/rust/), run by `make test` after the
# CTest suite: rustfmt and clippy clean, the tests (tovl-sys: layout, ABI
# values, bindings current with the headers; tovl: the safe API, the
# conformance suite on cpu and Vulkan against the CPU reference and against
# `tovl conform`'s table, the PEFT fixtures), the docs with every public item
# documented, and the serving example. Offline: the crates depend on std only.
# The library is the build tree's (build/, or TOVL_LIB_DIR; see
# bindings/rust/tovl-sys/build.rs).
set -euo pipefail
cd "$(dirname "$0")/../bindings/rust"
if ! command -v cargo >/dev/null && [ -x "$HOME/.cargo/bin/cargo" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null || { echo "test-rust: cargo not found (rustup's cargo, clippy and rustfmt are needed)"; exit 1; }
export CARGO_BUILD_JOBS="${JOBS:-2}"
start=$SECONDS
cargo fmt --check
cargo clippy --offline --all-targets -- -D warnings
cargo test --offline
RUSTDOCFLAGS="-D warnings" cargo doc --offline --no-deps
cargo run --offline --example serve_demo
echo "test-rust: all Rust checks passed in $((SECONDS - start)) s"
