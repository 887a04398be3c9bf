# The README's commands. `make demo` sets everything up and runs the main job; `make test` runs the tests.
# The experiment files name runs/data/synth and runs/models/tiny, so keep RUNS=runs for `make demo`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
RUNS   ?= runs
# CPU build of torch (it lies on local disk here); machines with a GPU take the default build.
TORCH_SPEC ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo torch || echo torch==2.13.0)

.PHONY: setup demo test test-all lint format bench-beam clean gpu-check

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip "setuptools>=77" wheel
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev,peers]"
	touch $@

# The demo's data set is harder than the synth default (3000 items, more drift), so decoders differ.
DEMO_SYNTH := --seed 0 --num-items 3000 --codebook-size 16 --num-clusters 30 --num-subclusters 6 \
	--drift-prob 0.3 --follow-prob 0.15 --sub-stickiness 0.3 --popularity-skew 0.7

demo: setup
	$(BIN)/genrec data synth --out $(RUNS)/data/demo $(DEMO_SYNTH) --overwrite
	@# the two `small` trainings side by side, one thread each (two 2-thread jobs in turn were slower)
	$(BIN)/genrec train --data $(RUNS)/data/demo --model small --out $(RUNS)/models/demo-small --epochs 8 \
		--threads 1 --overwrite --quiet & p1=$$!; \
	$(BIN)/genrec train --data $(RUNS)/data/demo --model small --out $(RUNS)/models/demo-nezha --epochs 8 \
		--threads 1 --objective nezha --overwrite --quiet & p2=$$!; \
	wait $$p1 && wait $$p2
	$(BIN)/genrec train --data $(RUNS)/data/demo --model tiny --out $(RUNS)/models/demo-draft --epochs 8 --overwrite --quiet
	$(BIN)/genrec sweep experiments/demo.yaml --overwrite

test: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -m "not gpu"

# the one-call GPU check (docs/gpu_runbook.md); on a CPU add ARGS="--device cpu --dry-run"
gpu-check:
	OUT=$${OUT:-runs/gpu_check} bash docs/gpu/check.sh $(ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(RUNS) build dist *.egg-info .pytest_cache
