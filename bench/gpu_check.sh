#!/usr/bin/env bash
# The one script for a lent GPU: kernel tests on CUDA, then bulkrun's engine against transformers'
# generate_batch on a random-weight Llama-3.2-1B-shaped model (bf16), printing a short table.
#
#   bench/gpu_check.sh                      # everything, default workload (512 prompts x 256 new tokens)
#   bench/gpu_check.sh --num-prompts 256 --profile    # extra arguments go to bench/gpu_bench.py
#   SKIP_TESTS=1 bench/gpu_check.sh         # bench only;  SKIP_BENCH=1: tests only
#   GPU_CHECK_CPU=1 bench/gpu_check.sh      # smoke run of this script without a GPU (interpreted kernels,
#                                           # --device cpu --tiny), to check the script itself
#
# Assumptions (the GPU machine reaches no network, so nothing is downloaded or pip-installed from an index):
# - Python: $PYTHON if set, else .venv/bin/python if it sees a CUDA device, else python3. It must
#   already hold a CUDA build of torch, triton, transformers, tokenizers, safetensors, psutil and pytest
#   (the device image's python3 does). Missing packages can travel as wheels in .whl/: they are
#   installed with --no-index into a temp dir put first on PYTHONPATH.
# - The repo is not pip-installed: PYTHONPATH gets the repo root and a shim dir in which
#   bulkrun_kernels links to kernels/ (the mapping pyproject.toml makes for an install).
# - When $OUT is set (the device tool), the log and the bench's JSON figures are written there too.
# Exit status: 0 all good; 2 environment unusable; 1 kernel tests failed; 3 bench failed a check.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
LOG_DIR="${OUT:-$(mktemp -d)}"
exec > >(tee "$LOG_DIR/gpu_check.log") 2>&1
die() { echo "gpu_check: error: $*" >&2; exit 2; }

pick_python() {
  if [[ -n "${PYTHON:-}" ]]; then echo "$PYTHON"; return; fi
  if [[ -x .venv/bin/python ]] && .venv/bin/python -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo .venv/bin/python; return
  fi
  command -v python3 || die "no python3 on PATH (set PYTHON=/path/to/python)"
}
PY="$(pick_python)"

SHIM="$(mktemp -d)"
trap 'rm -rf "$SHIM"' EXIT
ln -s "$ROOT/kernels" "$SHIM/bulkrun_kernels"
export PYTHONPATH="$ROOT:$SHIM${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SHIM/site" .whl/*.whl \
    || die "installing the wheels in .whl/ failed"
  export PYTHONPATH="$SHIM/site:$PYTHONPATH"
fi
export PYTHONUNBUFFERED=1
BENCH_ARGS=()
if [[ "${GPU_CHECK_CPU:-}" == 1 ]]; then
  export GPU_CHECK_CPU BENCH_DEVICE=cpu
  BENCH_ARGS=(--device cpu --tiny)
else
  unset TRITON_INTERPRET  # on a GPU the kernels must compile, not be interpreted
fi

echo "== environment ($PY)"
"$PY" - <<'PY' || die "the Python above cannot run the check (see the line before)"
import importlib.util, os, sys
missing = [m for m in ("torch", "triton", "transformers", "tokenizers", "safetensors", "psutil", "pytest")
           if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing packages: {', '.join(missing)} (carry them as wheels in .whl/, or set PYTHON)")
import torch, triton, transformers
if not torch.cuda.is_available() and os.environ.get("GPU_CHECK_CPU") != "1":
    sys.exit(f"torch {torch.__version__} sees no CUDA device")
print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"triton {triton.__version__}, transformers {transformers.__version__}, "
      f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU (smoke run)'}")
import bulkrun_kernels, bulkrun.engine.engine  # noqa: F401  (the repo imports)
PY

if [[ -z "${SKIP_TESTS:-}" ]]; then
  echo "== kernel tests (${BENCH_DEVICE:-cuda})"
  "$PY" -m pytest tests/kernels -q -p no:cacheprovider -o addopts="" -x || { echo "gpu_check: kernel tests FAILED" >&2; exit 1; }
fi

if [[ -z "${SKIP_BENCH:-}" ]]; then
  echo "== engine benchmark"
  "$PY" bench/gpu_bench.py --json "$LOG_DIR/gpu_bench.json" "${BENCH_ARGS[@]}" "$@"
fi
echo "gpu_check: done (log: $LOG_DIR/gpu_check.log)"
