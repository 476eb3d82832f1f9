#!/usr/bin/env bash
# The one script for a lent GPU, in stages. Each stage's result lands in $OUT as soon as it is known
# (stage-NN-name.txt: its output; stage-NN-name.json: its figures; summary.txt: one line per stage),
# and a failed stage does not stop the later ones:
#   01 environment    nvidia-smi, python/torch/triton/transformers versions, the repo imports
#   02 kernel-tests   tests/kernels compiled and run on CUDA
#   03 attention      production shapes (bf16, head_dim 64/128, thousands of keys, split and unsplit)
#                     vs an fp32 reference: max error, binaries compiled, CUDA-graph replay
#   04 engine-triton  the whole engine, Triton vs reference ops, bf16 greedy, full sequences judged
#   05 cuda-graphs    the engine with CUDA graphs vs eager: same tokens, decode speed
#   06 memory         KV sizing: profile peak, blocks, free memory after, a full-budget step
#   07 bench-1b       throughput vs transformers generate_batch, Llama-3.2-1B shape, decode profile
#   08 bench-8b       the same on the Llama-3.1-8B shape (smaller workload)
#
#   bench/gpu_check.sh                   # every stage (sized for < 8 minutes on one H200)
#   STAGES="03 05" bench/gpu_check.sh    # only these stages
#   GPU_CHECK_CPU=1 bench/gpu_check.sh   # smoke run without a GPU: interpreted kernels, tiny models,
#                                        # --device cpu; CUDA-only stages report "skipped: no CUDA"
#
# Assumptions (the GPU machine reaches no network, so nothing is downloaded or pip-installed):
# - Python: $PYTHON if set, else .venv/bin/python if it sees a CUDA device (or in the smoke run), else python3. It must
#   already hold torch (CUDA build), triton, transformers, tokenizers, safetensors, psutil and pytest
#   (the device image's python3 does). Missing packages can travel as wheels in .whl/: they are
#   installed with --no-index into a temp dir put first on PYTHONPATH.
# - The repo is not pip-installed: PYTHONPATH gets the repo root and a shim dir in which
#   bulkrun_kernels links to kernels/ (the mapping pyproject.toml makes for an install).
# - Without $OUT the results go to a fresh temp dir (printed at the end).
# Exit status: 0 every stage passed, was skipped or is not available (an engine without
# EngineConfig.cuda_graphs); 1 some stage failed; 2 environment unusable.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT_DIR="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT_DIR"
SUMMARY="$OUT_DIR/summary.txt"
: >"$SUMMARY"
die() { echo "gpu_check: error: $*" | tee -a "$SUMMARY" >&2; exit 2; }

pick_python() {
  if [[ -n "${PYTHON:-}" ]]; then echo "$PYTHON"; return; fi
  if [[ -x .venv/bin/python && "${GPU_CHECK_CPU:-}" == 1 ]]; then echo .venv/bin/python; return; fi
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
export PYTHONUNBUFFERED=1 GPU_CHECK_OUT="$OUT_DIR"
CPU_SMOKE=0
if [[ "${GPU_CHECK_CPU:-}" == 1 ]]; then
  CPU_SMOKE=1
  export TRITON_INTERPRET=1 BENCH_DEVICE=cpu
  DEVICE_ARGS=(--device cpu --tiny)
else
  unset TRITON_INTERPRET  # on a GPU the kernels must compile, not be interpreted
  DEVICE_ARGS=(--device cuda)
fi
HAS_CUDA="$("$PY" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)"
FAILED=0

# run_stage NN name timeout_s needs_cuda command...: output to stage-NN-name.txt, one summary line.
run_stage() {
  local num="$1" name="$2" limit="$3" needs_cuda="$4"
  shift 4
  if [[ -n "${STAGES:-}" && " $STAGES " != *" $num "* ]]; then return; fi
  local log="$OUT_DIR/stage-$num-$name.txt" started=$SECONDS verdict rc
  echo "== stage $num $name"
  if [[ "$needs_cuda" == 1 && "$HAS_CUDA" != 1 ]]; then
    echo "skipped: no CUDA" | tee "$log"
    verdict="skipped: no CUDA"
  else
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    if [[ $rc == 0 ]]; then verdict="PASS"
    elif [[ $rc == 3 && "$name" == cuda-graphs ]]; then verdict="not available (engine)"
    elif [[ $rc == 124 || $rc == 137 ]]; then verdict="FAIL (timed out after ${limit}s)"; FAILED=1
    else verdict="FAIL (exit $rc)"; FAILED=1
    fi
  fi
  printf 'stage %s %-15s %-28s %4ss\n' "$num" "$name" "$verdict" "$((SECONDS - started))" | tee -a "$SUMMARY"
}

environment() {
  nvidia-smi 2>&1 || echo "(no nvidia-smi)"
  "$PY" - <<'PY'
import importlib.util, json, os, sys
missing = [m for m in ("torch", "triton", "transformers", "tokenizers", "safetensors", "psutil", "pytest")
           if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing packages: {', '.join(missing)} (carry them as wheels in .whl/, or set PYTHON)")
import torch, triton, transformers
cuda = torch.cuda.is_available()
facts = {
    "python": sys.version.split()[0], "torch": torch.__version__, "torch_cuda": torch.version.cuda,
    "triton": triton.__version__, "transformers": transformers.__version__,
    "device": torch.cuda.get_device_name() if cuda else "no GPU (smoke run)",
    "sm_count": torch.cuda.get_device_properties(0).multi_processor_count if cuda else None,
    "memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1) if cuda else None,
}
print(json.dumps(facts, indent=2))
with open(os.path.join(os.environ["GPU_CHECK_OUT"], "stage-01-environment.json"), "w") as f:
    json.dump(facts, f, indent=2)
if not cuda and os.environ.get("GPU_CHECK_CPU") != "1":
    sys.exit(f"torch {torch.__version__} sees no CUDA device")
import bulkrun_kernels, bulkrun.engine.core.engine  # noqa: F401  (the repo imports)
PY
}

echo "gpu_check: python $PY, results in $OUT_DIR"
export -f environment  # run by `timeout` in a child bash, like every stage
export PY
run_stage 01 environment 60 0 bash -c environment
grep -q "PASS" "$SUMMARY" || [[ -n "${STAGES:-}" ]] || die "the environment is unusable (see $OUT_DIR/stage-01-environment.txt)"

if [[ $CPU_SMOKE == 1 ]]; then
  # The interpreter needs minutes for the whole folder on a small CPU: the smoke run proves the stage.
  KERNEL_TESTS=(tests/kernels/test_paged_attention.py -k "decode_only or rejects")
else
  KERNEL_TESTS=(tests/kernels)
fi
run_stage 02 kernel-tests 240 0 "$PY" -m pytest "${KERNEL_TESTS[@]}" -q -p no:cacheprovider -o addopts=""
run_stage 03 attention 120 0 "$PY" bench/gpu_attention_check.py "${DEVICE_ARGS[@]}" \
  --json "$OUT_DIR/stage-03-attention.json"
run_stage 04 engine-triton 150 0 "$PY" bench/gpu_engine_check.py numerics "${DEVICE_ARGS[@]}" \
  --json "$OUT_DIR/stage-04-engine-triton.json"
run_stage 05 cuda-graphs 150 1 "$PY" bench/gpu_engine_check.py graphs "${DEVICE_ARGS[@]}" \
  --json "$OUT_DIR/stage-05-cuda-graphs.json"
run_stage 06 memory 120 1 "$PY" bench/gpu_engine_check.py memory "${DEVICE_ARGS[@]}" \
  --json "$OUT_DIR/stage-06-memory.json"
if [[ $CPU_SMOKE == 1 ]]; then
  run_stage 07 bench-tiny 240 0 "$PY" bench/gpu_bench.py --device cpu --tiny --profile \
    --json "$OUT_DIR/stage-07-bench-tiny.json"
else
  run_stage 07 bench-1b 200 1 "$PY" bench/gpu_bench.py --shape 1b --profile \
    --json "$OUT_DIR/stage-07-bench-1b.json"
  run_stage 08 bench-8b 240 1 "$PY" bench/gpu_bench.py --shape 8b --num-prompts 128 --output-len 128 \
    --prompt-max 512 --profile --json "$OUT_DIR/stage-08-bench-8b.json"
fi

echo "== summary"
cat "$SUMMARY"
echo "gpu_check: results in $OUT_DIR"
exit $FAILED
