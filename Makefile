# The README's commands. `make demo` sets everything up and runs the main job; `make test` runs the tests.
# The experiment files name runs/data/synth and runs/models/tiny, so keep RUNS=runs for `make demo`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
RUNS   ?= runs
# CPU build of torch (it lies on local disk here); machines with a GPU take the default build.
TORCH_SPEC ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo torch || echo torch==2.13.0)

.PHONY: setup demo test test-all lint format bench-beam clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip "setuptools>=77" wheel
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev,peers]"
	touch $@

demo: setup
	$(BIN)/genrec data synth --out $(RUNS)/data/synth --seed 0 --overwrite
	$(BIN)/genrec train --data $(RUNS)/data/synth --model tiny --out $(RUNS)/models/tiny --epochs 8 --overwrite
	$(BIN)/genrec eval --model $(RUNS)/models/tiny --decoder beam --beam-width 10 --k 5 10 --quiet
	$(BIN)/genrec sweep experiments/beam_width.yaml --overwrite

test: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -m "not gpu"

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(RUNS) build dist *.egg-info .pytest_cache
