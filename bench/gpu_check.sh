#!/usr/bin/env bash
# The one script for a lent GPU, in stages, inside one deadline. docs/gpu.md says what each proves.
#   01 environment    nvidia-smi, versions; gates what later stages need (transformers >= 4.56:
#                     generate_batch and from_pretrained(dtype=)) and sets their fallbacks
#   02 kernel-tests   tests/kernels compiled and run on CUDA
#   03 attention      production shapes vs an fp32 reference, binaries compiled, CUDA-graph replay
#   04 engine-triton  the whole engine, Triton vs reference ops, bf16 greedy, judged by fp32 transformers
#   05 cuda-graphs    the engine with CUDA graphs vs eager: same judgement, decode speed
#   06 memory         KV sizing around the largest step, and a full-budget step with scoring
#   07 bench-1b       throughput vs transformers generate_batch, Llama-3.2-1B shape
#   08 gemma3         Gemma-3-1B's layers: fp32 greedy judged by fp32 transformers past the window, bf16 tok/s
#   09 qwen3-moe      Qwen3-30B-A3B's layers: Triton fused MoE vs the reference, fp32 greedy judged, bf16 tok/s
#   10 invariance     bf16: alone, in a big batch, in small chunks: same bits; tok/s with invariance on vs off
#   11 bench-8b       the Llama-3.1-8B shape, built in bf16 on the device (only with GPU_CHECK_8B=1)
#
#   bench/gpu_check.sh                      # every stage, within GPU_CHECK_DEADLINE (default 470 s)
#   STAGES="03 05" bench/gpu_check.sh       # only these stages
#   GPU_CHECK_CPU=1 bench/gpu_check.sh      # smoke run without a GPU: interpreted kernels, tiny models
#   GPU_CHECK_DRY_RUN=1 bench/gpu_check.sh  # print each stage's limit and their sum; run nothing
#
# Deadline: the stages share GPU_CHECK_DEADLINE seconds; each runs under min(its own limit, the
# time left less KILL_GRACE), and a stage with under MIN_STAGE seconds left is skipped ("out of time").
# A stage's command sees when its limit ends as GPU_CHECK_STAGE_DEADLINE (epoch seconds;
# bench/gpu_stage.py skips a phase that would not fit). The smoke run triples every limit and the deadline: the interpreter and a small CPU
# are slower than the GPU, and the smoke run checks that the code runs, not its minutes.
# Results reach $OUT as each stage ends, in four files (the device tool returns at most 8):
#   summary.txt     one line per stage: verdict, seconds, the stage's figure
#   results.jsonl   one JSON object per stage: verdict, figure, seconds, limit, the stage's figures,
#                   and the last lines of its output when it failed (the traceback's tail)
#   progress.jsonl  one JSON object per phase of stages 08-10 as the phase ends (bench/gpu_stage.py)
#   log.txt         every stage's whole output
# Python: $PYTHON, else .venv/bin/python if it sees CUDA (or in the smoke run), else python3; it must
# hold torch (CUDA), triton, transformers, tokenizers, safetensors, psutil, pytest. Missing packages
# travel as wheels in .whl/ (installed with --no-index into a temp dir). The repo is not installed:
# PYTHONPATH gets the repo root and a shim in which bulkrun_kernels links to kernels/.
# Exit status: 0 every stage passed or was skipped; 1 a stage failed or ran out of time; 2 unusable.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
KILL_GRACE=5
MIN_STAGE=15
CPU_SMOKE=0
[[ "${GPU_CHECK_CPU:-}" == 1 ]] && CPU_SMOKE=1
LIMIT_SCALE=$((CPU_SMOKE == 1 ? 3 : 1))
DEADLINE="${GPU_CHECK_DEADLINE:-$((470 * LIMIT_SCALE))}"
DRY_RUN=0
[[ "${GPU_CHECK_DRY_RUN:-}" == 1 ]] && DRY_RUN=1

# stage table: number name own-limit-seconds needs-cuda (the commands are in run_all below)
STAGE_TABLE="01 environment 30 0
02 kernel-tests 95 0
03 attention 25 0
04 engine-triton 40 0
05 cuda-graphs 30 1
06 memory 25 1
07 bench-1b 55 1
08 gemma3 40 0
09 qwen3-moe 45 0
10 invariance 35 0"
if [[ $CPU_SMOKE == 1 ]]; then
  STAGE_TABLE="${STAGE_TABLE/07 bench-1b 55 1/07 bench-tiny 55 0}"
elif [[ "${GPU_CHECK_8B:-}" == 1 ]]; then
  STAGE_TABLE+=$'\n'"11 bench-8b 120 1"
fi

selected() { [[ -z "${STAGES:-}" || " $STAGES " == *" $1 "* ]]; }

# the limit a stage gets when `used` seconds of the deadline are gone (0: not enough left)
stage_limit() {
  local own=$(($1 * LIMIT_SCALE)) used="$2" left
  left=$((DEADLINE - used - KILL_GRACE))
  ((left < MIN_STAGE)) && { echo 0; return; }
  echo $((own < left ? own : left))
}

if [[ $DRY_RUN == 1 ]]; then
  used=0
  while read -r num name own cuda; do
    selected "$num" || continue
    limit=$(stage_limit "$own" "$used")
    printf 'stage %s %-15s limit %4ss (own %ss)\n' "$num" "$name" "$limit" "$((own * LIMIT_SCALE))"
    ((limit > 0)) && used=$((used + limit + KILL_GRACE))
  done <<<"$STAGE_TABLE"
  echo "total: at most ${used}s of stage time (deadline ${DEADLINE}s)"
  ((used <= DEADLINE)) || { echo "gpu_check: error: stages overrun the deadline" >&2; exit 1; }
  exit 0
fi

OUT_DIR="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT_DIR"
SUMMARY="$OUT_DIR/summary.txt" RESULTS="$OUT_DIR/results.jsonl" LOG="$OUT_DIR/log.txt"
export GPU_CHECK_PROGRESS="$OUT_DIR/progress.jsonl"
: >"$SUMMARY"; : >"$RESULTS"; : >"$LOG"; : >"$GPU_CHECK_PROGRESS"
die() { echo "gpu_check: error: $*" | tee -a "$SUMMARY" >&2; exit 2; }

pick_python() {
  if [[ -n "${PYTHON:-}" ]]; then echo "$PYTHON"; return; fi
  if [[ -x .venv/bin/python && $CPU_SMOKE == 1 ]]; then echo .venv/bin/python; return; fi
  if [[ -x .venv/bin/python ]] && .venv/bin/python -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo .venv/bin/python; return
  fi
  command -v python3 || die "no python3 on PATH (set PYTHON=/path/to/python)"
}
PY="$(pick_python)"
SCRATCH="$(mktemp -d)"
trap 'rm -rf "$SCRATCH"' EXIT
mkdir -p "$SCRATCH/shim" "$SCRATCH/json"
ln -s "$ROOT/kernels" "$SCRATCH/shim/bulkrun_kernels"
export PYTHONPATH="$ROOT:$SCRATCH/shim${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SCRATCH/site" .whl/*.whl \
    || die "installing the wheels in .whl/ failed"
  export PYTHONPATH="$SCRATCH/site:$PYTHONPATH"
fi
export PYTHONUNBUFFERED=1 GPU_CHECK_JSON="$SCRATCH/json"
if [[ $CPU_SMOKE == 1 ]]; then
  export TRITON_INTERPRET=1 BENCH_DEVICE=cpu
  DEVICE_ARGS=(--device cpu --tiny)
else
  unset TRITON_INTERPRET  # on a GPU the kernels must compile, not be interpreted
  DEVICE_ARGS=(--device cuda)
fi
HAS_CUDA="$("$PY" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)"
FAILED=0
USED=0  # seconds of the deadline spent

# record num name verdict seconds limit stage_log: one summary line and one results.jsonl object
record() {
  local num="$1" name="$2" verdict="$3" seconds="$4" limit="$5" stage_log="$6"
  local fig
  fig="$(grep -a '^FIGURE: ' "$stage_log" 2>/dev/null | tail -n 1 | cut -c9-)"
  [[ -z "$fig" ]] && fig="$(grep -av '^\s*$' "$stage_log" 2>/dev/null | tail -n 1 | cut -c1-120)"
  printf 'stage %s %-15s %-26s %4ss  %s\n' "$num" "$name" "$verdict" "$seconds" "$fig" | tee -a "$SUMMARY"
  "$PY" - "$num" "$name" "$verdict" "$seconds" "$limit" "$stage_log" "$fig" >>"$RESULTS" <<'PY' || true
import json, os, sys
num, name, verdict, seconds, limit, log, figure = sys.argv[1:]
row = {"stage": num, "name": name, "verdict": verdict, "pass": verdict == "PASS", "seconds": int(seconds),
       "limit_s": int(limit), "figure": figure or None}
path = os.path.join(os.environ["GPU_CHECK_JSON"], f"stage-{num}.json")
if os.path.exists(path):
    with open(path) as f:
        row["figures"] = json.load(f)
if not row["pass"] and not verdict.startswith("skipped") and os.path.exists(log):
    with open(log, errors="replace") as f:
        row["output_tail"] = f.read().splitlines()[-40:]
print(json.dumps(row, default=str))
PY
}

# run_stage NN name own_limit needs_cuda command...
run_stage() {
  local num="$1" name="$2" own="$3" needs_cuda="$4"
  shift 4
  selected "$num" || return 0
  local stage_log="$SCRATCH/stage-$num.txt" started=$SECONDS limit rc verdict
  limit=$(stage_limit "$own" "$USED")
  echo "== stage $num $name (limit ${limit}s)" | tee -a "$LOG"
  if [[ "$needs_cuda" == 1 && "$HAS_CUDA" != 1 ]]; then
    echo "skipped: no CUDA" >"$stage_log"; verdict="skipped: no CUDA"
  elif ((limit == 0)); then
    echo "skipped: out of time" >"$stage_log"; verdict="FAIL (out of time)"; FAILED=1
  else
    GPU_CHECK_STAGE_DEADLINE=$(($(date +%s) + limit)) GPU_CHECK_STAGE_NUM="$num" timeout --kill-after=$KILL_GRACE "$limit" "$@" >"$stage_log" 2>&1
    rc=$?
    if [[ $rc == 0 ]]; then verdict="PASS"
    elif [[ $rc == 124 || $rc == 137 ]]; then verdict="FAIL (timed out, ${limit}s)"; FAILED=1
    else verdict="FAIL (exit $rc)"; FAILED=1
    fi
  fi
  cat "$stage_log" >>"$LOG"
  [[ $CPU_SMOKE == 1 || -n "${GPU_CHECK_VERBOSE:-}" ]] && tail -n 5 "$stage_log"
  USED=$((USED + SECONDS - started))
  record "$num" "$name" "$verdict" "$((SECONDS - started))" "$limit" "$stage_log"
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
from transformers import PreTrainedModel

version = tuple(int(p) for p in transformers.__version__.split(".")[:2] if p.isdigit())
cuda = torch.cuda.is_available()
facts = {
    "python": sys.version.split()[0], "torch": torch.__version__, "torch_cuda": torch.version.cuda,
    "triton": triton.__version__, "transformers": transformers.__version__,
    "device": torch.cuda.get_device_name() if cuda else "no GPU (smoke run)",
    "memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1) if cuda else None,
    # what the later stages use, and their fallbacks on an older transformers
    "hf_dtype_keyword": "dtype" if version >= (4, 56) else "torch_dtype",
    "hf_generate_batch": hasattr(PreTrainedModel, "generate_batch") or version >= (4, 56),
}
print(json.dumps(facts, indent=2))
with open(os.path.join(os.environ["GPU_CHECK_JSON"], "stage-01.json"), "w") as f:
    json.dump(facts, f, indent=2)
if not cuda and os.environ.get("GPU_CHECK_CPU") != "1":
    sys.exit(f"torch {torch.__version__} sees no CUDA device")
import bulkrun_kernels, bulkrun.engine.core.engine  # noqa: F401  (the repo imports)
print(f"FIGURE: torch {torch.__version__}, triton {triton.__version__}, transformers {transformers.__version__}"
      f" ({'generate_batch' if facts['hf_generate_batch'] else 'no generate_batch: --skip-hf'}, {facts['hf_dtype_keyword']}=)")
PY
}
export -f environment
export PY

echo "gpu_check: python $PY, deadline ${DEADLINE}s, results in $OUT_DIR"
limit_of() { awk -v n="$1" '$1 == n {print $3}' <<<"$STAGE_TABLE"; }
run_stage 01 environment "$(limit_of 01)" 0 bash -c environment
if selected 01; then
  grep -q "^stage 01 environment *PASS" "$SUMMARY" || die "the environment is unusable (see $LOG)"
  HF_FACTS="$("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["hf_dtype_keyword"], int(d["hf_generate_batch"]))' "$GPU_CHECK_JSON/stage-01.json")"
  export GPU_CHECK_HF_DTYPE_KW="${HF_FACTS% *}"
  [[ "${HF_FACTS#* }" == 0 ]] && GPU_CHECK_SKIP_HF=1
fi
HF_ARGS=()
[[ "${GPU_CHECK_SKIP_HF:-}" == 1 ]] && HF_ARGS=(--skip-hf)

if [[ $CPU_SMOKE == 1 ]]; then  # the interpreter needs minutes for the whole folder on a small CPU
  KERNEL_TESTS=(tests/kernels/test_paged_attention.py -k "decode_only or rejects")
else
  KERNEL_TESTS=(tests/kernels)
fi
J="$GPU_CHECK_JSON"
run_stage 02 kernel-tests "$(limit_of 02)" 0 "$PY" -m pytest "${KERNEL_TESTS[@]}" -q -x -p no:cacheprovider -o addopts=""
run_stage 03 attention "$(limit_of 03)" 0 "$PY" bench/gpu_attention_check.py "${DEVICE_ARGS[@]}" --json "$J/stage-03.json"
run_stage 04 engine-triton "$(limit_of 04)" 0 "$PY" bench/gpu_engine_check.py numerics "${DEVICE_ARGS[@]}" --json "$J/stage-04.json"
run_stage 05 cuda-graphs "$(limit_of 05)" 1 "$PY" bench/gpu_engine_check.py graphs "${DEVICE_ARGS[@]}" --json "$J/stage-05.json"
run_stage 06 memory "$(limit_of 06)" 1 "$PY" bench/gpu_engine_check.py memory "${DEVICE_ARGS[@]}" --json "$J/stage-06.json"
if [[ $CPU_SMOKE == 1 ]]; then
  run_stage 07 bench-tiny "$(limit_of 07)" 0 "$PY" bench/gpu_bench.py --device cpu --tiny --profile "${HF_ARGS[@]}" --json "$J/stage-07.json"
else
  run_stage 07 bench-1b "$(limit_of 07)" 1 "$PY" bench/gpu_bench.py --shape 1b --num-prompts 256 --output-len 128 \
    --profile "${HF_ARGS[@]}" --json "$J/stage-07.json"
fi
run_stage 08 gemma3 "$(limit_of 08)" 0 "$PY" bench/gpu_family_check.py gemma3 "${DEVICE_ARGS[@]}" --json "$J/stage-08.json"
run_stage 09 qwen3-moe "$(limit_of 09)" 0 "$PY" bench/gpu_family_check.py qwen3-moe "${DEVICE_ARGS[@]}" --json "$J/stage-09.json"
run_stage 10 invariance "$(limit_of 10)" 0 "$PY" bench/gpu_invariance_check.py "${DEVICE_ARGS[@]}" --json "$J/stage-10.json"
if [[ $CPU_SMOKE != 1 && "${GPU_CHECK_8B:-}" == 1 ]]; then
  run_stage 11 bench-8b "$(limit_of 11)" 1 "$PY" bench/gpu_bench.py --shape 8b --num-prompts 128 --output-len 64 \
    --prompt-max 512 --skip-hf --json "$J/stage-11.json"
fi

echo "== summary (${USED}s of the ${DEADLINE}s deadline)" | tee -a "$SUMMARY"
cat "$SUMMARY"
echo "gpu_check: results in $OUT_DIR"
exit $FAILED
