#!/usr/bin/env bash
# The Rust bindings' part of the GPU run (issue 45), on the H200 machine, from
# the repo root, with the build in ./build-gpu: the binaries gpu-prepare.sh
# built with cargo on the build machine (build-gpu/rust/; the GPU image has no
# cargo). Runs:
#   1. the conformance suite driven from Rust on every present backend (cuda
#      and Vulkan required) against the CPU reference, bit for bit, its table
#      compared with `tovl conform`'s on the same seed;
#   2. the PEFT fixtures through the crate's Model/Adapter on cpu, Vulkan and
#      CUDA (the CUDA test is #[ignore]d elsewhere: --include-ignored);
#   3. the serving example on cuda and on vulkan.
# Logs go to $OUT (default /tmp/tovl-gpu-out/rust); a summary prints last.
set -uo pipefail
part=rust step_tail=12 step_skip_ok=1   # libtest output, no Criterion [SKIP] lines
source "$(dirname "$0")/../lib/gpu-part.sh"
bin=$build/rust
if [ ! -x "$bin/conform" ] || [ ! -x "$bin/fixtures" ] || [ ! -x "$bin/serve_demo" ]; then
  echo "no Rust test binaries in $bin: run scripts/gpu-prepare.sh on a machine with cargo"
  printf '%s\n' "FAIL  rust binaries missing in $bin"
  exit 1
fi
export TOVL_REQUIRE_VULKAN=1 TOVL_REQUIRE_CUDA=1 TOVL_CLI="$here/$build/tools/tovl"
seed=$fresh_seed

step conform env TOVL_SEED="$seed" "$bin/conform" --nocapture --test-threads 1
grep -q 'rows on \[.*"cuda".*"vulkan".*\] equal tovl conform' "$out/conform.log" ||
  summary+=("FAIL  conform: the table did not cover both cuda and vulkan")
step fixtures env TOVL_SEED="$seed" "$bin/fixtures" --include-ignored --nocapture --test-threads 1
grep -q 'fixtures: [0-9]* cases on cuda' "$out/fixtures.log" ||
  summary+=("FAIL  fixtures: the CUDA cases did not run")
step serve-cuda "$bin/serve_demo" --backend cuda --seed "$seed"
step serve-vulkan "$bin/serve_demo" --backend vulkan --seed "$seed"

echo "--- rust summary (commit $(build_commit), seed $seed)"
printf '%s\n' "${summary[@]}"
! printf '%s\n' "${summary[@]}" | grep -qv '^ok'
