#!/usr/bin/env bash
# The Python part of the GPU run, on the GPU machine, from the repo root, with
# the build in ./build-gpu. The GPU image's own python3 (torch, transformers,
# peft, pytest) imports the package from python/ over build-gpu/libtovl.so:
#   1. the Python suite (python/tests) on CPU and CUDA tensors: the ops eagerly,
#      in a captured torch.cuda.graph and under torch.compile, the adapter pool,
#      and the end-to-end checks against PEFT's own models and generation;
#   2. bench/python_op_overhead.py: each op's per-call overhead above the C hook,
#      eagerly and inside a captured CUDA graph.
# Logs go to $OUT (default /tmp/tovl-gpu-out/python); a summary prints last.
# TOVL_GPU_PYTEST: the pytest paths (default python/tests), e.g.
# python/tests/test_tp.py for a run that has time for one file.
set -uo pipefail
part=python step_tail=25 step_skip_ok=1   # pytest reports its own skips
source "$(dirname "$0")/../lib/gpu-part.sh"
python_env || exit 1
python3 -c 'import torch, transformers, peft; print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
"transformers", transformers.__version__, "peft", peft.__version__)' > "$out/versions.txt" 2>&1
cat "$out/versions.txt"
# shellcheck disable=SC2086 # one word per path
step pytest python3 -m pytest -q -rsP -p no:cacheprovider ${TOVL_GPU_PYTEST:-python/tests}
step overhead python3 bench/python_op_overhead.py
printf '%s\n' "${summary[@]}"
! printf '%s\n' "${summary[@]}" | grep -qv '^ok'
