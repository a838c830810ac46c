# The two set-up commands of the README: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
RUN_DIR ?= runs/demo

.PHONY: demo test install calculator lint clean

$(BIN)/vlrl: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(BIN)/vlrl

install: $(BIN)/vlrl

# llama-cpp-python compiles llama.cpp (CPU): GGML_NATIVE=OFF so the wheel pip caches runs on any x86-64-v3 machine.
$(VENV)/.gguf: $(BIN)/vlrl
	CMAKE_ARGS="-DGGML_NATIVE=OFF" $(BIN)/pip install -q -e '.[gguf]'
	touch $@

demo: install
	$(BIN)/vlrl run --preset tiny --run-dir $(RUN_DIR)

# The browser reward calculator's runtime (Pyodide, from npm) and, for its test, headless Chromium (Debian).
calculator:
	bash rewards/install.sh

test: install $(VENV)/.gguf
	bash scripts/ensure_chromium.sh chromium-driver  # headless Chromium for the report and calculator tests
	bash rewards/install.sh                          # the calculator's Pyodide runtime (npm, pinned)
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check vlrl tests bench

clean:
	rm -rf $(VENV) runs .pytest_cache rewards/node_modules
