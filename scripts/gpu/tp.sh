#!/usr/bin/env bash
# The tensor-parallel part of the GPU run (issue 24), on the GPU machine, from
# the repo root, with the build in ./build-gpu (scripts/gpu-prepare.sh;
# TOVL_GPU_BUILD names another tree). scripts/gpu-suite.sh runs it with the
# other scripts/gpu/*.sh. N vocab shard sets on one GPU:
#   1. test_tp: on every backend present (and the CUDA emulation), the shards'
#      lm_head outputs concatenated equal the unsharded set's bit for bit, for
#      N = 1 .. 8; each GPU backend `tovl devices` lists as present must run;
#   2. `tovl run --tp N` writes the same file as --tp 1 on each backend present
#      (tests/tp.cmake as a script: fixtures, bf16 and f32, N = 2 .. 8, 16);
#   3. `tovl bench --tp N` on each GPU backend of TOVL_TP_BENCH_BACKENDS
#      (default: cuda and hip where present) for N in TOVL_TP_RANKS (default
#      "2 4 8"): the shards checked bit for bit against the unsharded set at
#      T = 512 and 64, then each rank's lm_head hook timed on its own logits
#      shard beside the unsharded one (graph-replay medians; --hooks-only:
#      no rowdiff, no copy bandwidth);
#   4. over NCCL, one process per GPU, where two or more GPUs exist:
#      bench/tp_nccl.py (each rank's lm_head shard on its own GPU, gathered
#      and checked bit for bit against the unsharded set, timed beside it at
#      T = 512 and 64); on one GPU, its --world 1 smoke run. The Python suite
#      (scripts/gpu/python.sh) holds the NCCL check of the PEFT fixtures
#      (test_tp.py: test_tp_over_nccl_one_process_per_gpu, which needs two
#      GPUs, and test_tp_ranks_on_one_gpu).
# Logs go to $OUT/tp (default /tmp/tovl-gpu-out/tp); a summary prints last.
# Knobs: TOVL_TP_BENCH_ARGS (extra `tovl bench` options, e.g. "--quick
# --tokens 8 --batch 1 --repeats 2" for a dry run on cpu or lavapipe),
# TOVL_TP_BENCH_BACKENDS, TOVL_TP_RANKS.
set -uo pipefail
part=tp step_tail=6
source "$(dirname "$0")/../lib/gpu-part.sh"
tovl=$build/tools/tovl

if [ ! -x "$tovl" ] || [ ! -x "$build/tests/test_tp" ]; then
  echo "tp: $tovl or $build/tests/test_tp was not built (scripts/gpu-prepare.sh; TOVL_GPU_BUILD)"
  exit 1
fi
step devices "$tovl" devices
present=$(present_backends)
echo "tp: backends present: $present"

# 1. The library on every backend present; an absent one skips by design.
step_skip_ok=1 step test_tp env TOVL_TEST_SEED="$fresh_seed" "$build/tests/test_tp" --jobs 2 --verbose
# shellcheck disable=SC2086 # one word per backend
expect_ran_on test_tp tp $present

# 2. The CLI: --tp N against --tp 1, file for file.
for b in $present; do
  step "run-tp-$b" cmake -DTOVL="$tovl" -DFIXTURES="$here/tests/fixtures/peft_extra" -DWORK="$out/run-$b" \
    -DBACKEND="$b" -P "$here/tests/tp.cmake"
done

# 3. Each rank's lm_head beside the unsharded set.
bench_backends=${TOVL_TP_BENCH_BACKENDS:-$(printf '%s\n' $present | grep -E '^(cuda|hip)$' | tr '\n' ' ')}
for b in $bench_backends; do
  for n in ${TOVL_TP_RANKS:-2 4 8}; do
    # shellcheck disable=SC2086 # the extra options are words
    step "bench-$b-tp$n" "$tovl" bench --backend "$b" --tp "$n" --hooks-only --seed "$fresh_seed" \
      --json "$out/bench-$b-tp$n.json" ${TOVL_TP_BENCH_ARGS:-}
  done
done

# 4. Over NCCL, one process per GPU.
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "${gpus:-0}" -ge 1 ] && python_env; then
  world=$([ "$gpus" -ge 2 ] && echo "$gpus" || echo 1)
  step "nccl-world$world" env NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}" \
    python3 bench/tp_nccl.py --world "$world" --seed "$fresh_seed"
fi

echo
echo "=== tp summary (seed $fresh_seed; logs in $out)"
printf 'test_tp:    %s\n' "$(grep -m1 'Synthesis' "$out/test_tp.log")"
for b in $present; do
  printf 'run --tp:   %-8s %s\n' "$b" "$(grep -m1 'identical to --tp 1' "$out/run-tp-$b.log")"
done
for log in "$out"/bench-*-tp*.log; do
  [ -f "$log" ] || continue
  echo "$(basename "$log" .log):"
  sed -n '/^--tp /,/^$/p' "$log"
done
for log in "$out"/nccl-world*.log; do
  [ -f "$log" ] || continue
  echo "$(basename "$log" .log) (bench/tp_nccl.py; ${gpus} GPU(s) here):"
  sed -n '/^ *T /,/^tp_nccl: /p' "$log"
done
[ "${gpus:-0}" -lt 2 ] && echo "nccl:       ${gpus:-0} GPU here: the two-GPU run needs a machine with two (its --world 1 smoke run above)"
[ -z "$bench_backends" ] && echo "bench:      no cuda or hip backend present (TOVL_TP_BENCH_BACKENDS names others)"
printf '%s\n' "${summary[@]}"
! printf '%s\n' "${summary[@]}" | grep -q '^\(FAIL\|TIME\)'
