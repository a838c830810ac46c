# The set-up commands of the README: `make demo`, `make test`, `make test-fast` and `make test-newest`. All create
# their venv on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
RUN_DIR ?= runs/demo

# pyproject.toml gives ranges; a venv holds one end of them. CONSTRAINTS pins torch, torchvision, transformers, trl,
# peft and datasets: constraints/lowest.txt (the default: .venv, `make test`, CI's whole suite) or
# constraints/newest.txt (the registry's newest, in .venv-newest: `make test-newest`). Passed as PIP_CONSTRAINT, it
# replaces any constraint file of pip's own configuration rather than adding to it, so the venv holds the named set.
CONSTRAINTS ?= constraints/lowest.txt
NEWEST_VENV ?= .venv-newest
PIP_INSTALL = PIP_CONSTRAINT=$(CURDIR)/$(CONSTRAINTS) $(BIN)/pip install -q

.PHONY: demo test test-fast test-newest test-deps test-tools install calculator lint clean

$(BIN)/vlrl: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(PIP_INSTALL) -e '.[dev]'
	touch $(BIN)/vlrl

install: $(BIN)/vlrl

# llama-cpp-python (the gguf extra) compiles llama.cpp (CPU) on install; pip caches the wheel, keyed by the release
# (not by these flags). GGML_NATIVE=OFF: the wheel runs on any x86-64-v3 machine. The include file leaves out
# llama.cpp's `common` library (CLI, chat parsers, HTTP client), which the Python package never loads; vlrl uses
# libllama (Llama: logits, LoRA adapters), libggml* and libmtmd (the mmproj), whose machine code is unchanged.
# `pip wheel` of the 0.3.36 sdist on the idle 2-core dev machine: 193 -> 136 build steps, 6:57 -> 4:16 wall,
# 814 -> 494 CPU-seconds (user+sys); the whole `pip install` of the extra with these flags took 4:42.
GGUF_CMAKE_ARGS := -DGGML_NATIVE=OFF -DCMAKE_PROJECT_llama.cpp_INCLUDE=$(CURDIR)/scripts/llama_cpp_libs_only.cmake
$(VENV)/.gguf: $(BIN)/vlrl
	CMAKE_ARGS="$(GGUF_CMAKE_ARGS)" $(PIP_INSTALL) -e '.[gguf]'
	touch $@

demo: install
	$(BIN)/vlrl run --preset tiny --run-dir $(RUN_DIR)

# The browser reward calculator's runtime (Pyodide, from npm) and, for its test, headless Chromium (Debian).
calculator:
	bash rewards/install.sh

# What the tests need besides vlrl itself (README: "What the tests install"); each step is skipped when its result
# is already there. Installing needs root; without it the scripts say what to run and the tests that need it skip.
test-deps: install test-tools

test-tools:
	bash scripts/ensure_chromium.sh chromium-driver  # headless Chromium for the report and calculator tests
	bash rewards/install.sh || echo "make: no Pyodide runtime: the reward calculator's tests will skip, saying why" >&2

# The tests run in pytest-xdist workers, one a logical core and at most 4 (each holds torch and a tiny model,
# ~2 GB), an idle worker taking tests queued for a busy one (worksteal: the tests take 0.01 s to 80 s each, so
# shares fixed in advance end apart; tests/conftest.py starts each share with its part of the long tests, longest
# first, from tests/durations.json, and keeps the tests of one module-scoped fixture together). `make test
# TEST_WORKERS=0` runs them in one process (for -x, --pdb, or prints to read in order).
TEST_WORKERS ?= logical
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --maxprocesses 4 --dist worksteal

# The whole suite. The GGUF export tests need llama.cpp and its converters: fetched here into the tests' cache
# (tests/conftest.py's VLRL_CACHE default), not during the tests.
test: test-deps $(VENV)/.gguf
	VLRL_CACHE="$${VLRL_CACHE:-$(CURDIR)/.cache/vlrl}" $(BIN)/python -c 'import vlrl.export as e; e.llama_cpp_tools()'
	$(PYTEST)

# The suite less the slow set (`@pytest.mark.slow`: a full tiny run, training, the notebook, llama.cpp): no
# llama.cpp build needed, and it never builds a run.
test-fast: test-deps
	$(PYTEST) -m "not slow"

# The newest end of the ranges: test-fast and one tiny run in .venv-newest, which holds constraints/newest.txt. The
# run gets a fresh directory each time and the tests' cache, so it loads the tiny model and warm start built there
# (by `make test` in CI) rather than training them again.
test-newest:
	$(MAKE) test-fast VENV=$(NEWEST_VENV) CONSTRAINTS=constraints/newest.txt
	rm -rf runs/newest
	VLRL_CACHE="$${VLRL_CACHE:-$(CURDIR)/.cache/vlrl}" \
	  $(MAKE) demo VENV=$(NEWEST_VENV) CONSTRAINTS=constraints/newest.txt RUN_DIR=runs/newest

lint: install
	$(BIN)/ruff check vlrl tests bench

clean:
	rm -rf $(VENV) $(NEWEST_VENV) runs .pytest_cache rewards/node_modules
