#!/usr/bin/env bash
# The GPU path in one call on a CUDA machine (issue 19 item 6, docs/gpu.md): the GPU and
# the versions, every cuda-marked test (tests/gpu) and the GPU stall bench with --check.
# The bench runs even when a test fails; the exit status is non-zero when either did.
# About 3 minutes on one H200, 8 at most (each part has its own time limit). Logs go to
# $OUT when it is set (the device tool brings that folder back), else to a temp dir.
#
#     bash bench/gpu_check.sh        # PYTHON=/path/to/python3 picks the interpreter
#                                    # GPU_STALL_ARGS="--size-gib 2" passes options to the bench
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
LOGS=${OUT:-$(mktemp -d -t gpu-check-XXXXXX)}
export PYTHONUNBUFFERED=1

fail() {
    echo "gpu_check: $*" >&2
    exit 2
}

echo "== GPU"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "(nvidia-smi failed)"
elif ! compgen -G "/dev/nvidia[0-9]*" >/dev/null; then
    fail "no NVIDIA GPU on this machine (no nvidia-smi, no /dev/nvidia*): nothing was run; run this where one is"
fi

echo "== torch ($PYTHON)"
if ! timeout 60 "$PYTHON" -c "import torch" 2>/dev/null; then
    # Into a folder of its own, leaving the interpreter as it was; a machine that reaches no
    # package index fails this at once (no retries) instead of hanging.
    site=$(mktemp -d -t gpu-check-site-XXXXXX)
    echo "torch is not importable by $PYTHON: pip install torch (PyPI's Linux wheel is a CUDA build) into $site"
    timeout 300 "$PYTHON" -m pip install --quiet --retries 0 --timeout 15 --target "$site" torch ||
        fail "torch is not importable by $PYTHON and pip could not install it (no package index reachable?): set PYTHON to an interpreter with a CUDA build of torch"
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
versions=$(timeout 60 "$PYTHON" - <<'EOF'
import sys

import torch
import torch.distributed as dist

nccl = torch.cuda.nccl.version() if torch.cuda.is_available() and dist.is_nccl_available() else "none"
print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}, NCCL {nccl})")
if not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} (built for CUDA {torch.version.cuda}) sees no CUDA device")
print(f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")
EOF
) || { echo "$versions"; fail "torch with CUDA is not usable by $PYTHON (see above): nothing was run"; }
echo "$versions"

echo "== cuda tests (tests/gpu)"
tests_rc=0
# Only tests/gpu's own conftest: the suite's top one needs the control plane's packages.
timeout 200 "$PYTHON" -m pytest tests/gpu -m cuda -q -p no:cacheprovider -p no:xdist -p no:django \
    --confcutdir=tests/gpu 2>&1 | tee "$LOGS/gpu-tests.log" || tests_rc=$?

echo "== GPU stall bench (bench/gpu_stall.py --check)"
bench_rc=0
# shellcheck disable=SC2086  # GPU_STALL_ARGS is a list of options
timeout 200 "$PYTHON" bench/gpu_stall.py --check ${GPU_STALL_ARGS:-} 2>&1 | tee "$LOGS/gpu-stall.log" || bench_rc=$?

echo "== summary ($(date -u +%F), $(git describe --always --dirty 2>/dev/null || echo "no git here"))"
echo "$versions"
echo "cuda tests: $(tail -n 1 "$LOGS/gpu-tests.log") (exit $tests_rc)"
grep -E "^(state:|torch.save|raw write)|target" "$LOGS/gpu-stall.log" || true
echo "GPU stall bench: exit $bench_rc"
echo "logs: $LOGS"
[ "$tests_rc" = 0 ] && [ "$bench_rc" = 0 ]
