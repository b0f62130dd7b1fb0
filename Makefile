# The two commands of the README: `make demo` and `make test`. Everything else is their set-up.
# Both install into their own virtual environment, $(VENV), made from $(PY); only python3 (with
# its venv module) and make are needed before. `make demo STEPS=3` trains 3 steps.
PY ?= python3
VENV ?= .venv
VPY = $(VENV)/bin/python
PIP = $(VPY) -m pip install -q --disable-pip-version-check
DEPS = pyproject.toml .ci/constraints.txt

.PHONY: demo test setup setup-dev browser runtime lint

demo: setup
	$(VPY) -m pynode train $(if $(STEPS),--steps $(STEPS))

test: setup-dev
	$(VPY) -m ruff check .
	PYNODE_FULL_SUITE=1 $(VPY) -m pytest -q

setup: $(VENV)/.installed-demo
setup-dev: $(VENV)/.installed-dev

# Debian splits venv's ensurepip into python3.X-venv; without it `python3 -m venv` fails half-way.
$(VENV)/.made:
	@command -v $(PY) >/dev/null 2>&1 || { \
	  echo "make: $(PY) not found; install Python >= 3.10 (Debian: apt-get install python3" \
	       "python3-venv) or name one with make PY=/path/to/python3" >&2; exit 1; }
	@$(PY) -c 'import sys; sys.exit(sys.version_info < (3, 10))' || { \
	  echo "make: DaisyChain needs Python >= 3.10; name one with make PY=/path/to/python3" >&2; \
	  exit 1; }
	@$(PY) -c 'import ensurepip, venv' 2>/dev/null || { \
	  echo "make: $(PY) cannot make a virtual environment (no venv/ensurepip module);" \
	       "install it (Debian/Ubuntu: sudo apt-get install" \
	       "python$$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])')-venv)" >&2; \
	  exit 1; }
	$(PY) -m venv $(VENV)
	@echo "made by make: $(PY) -m venv" > $@

# numba (the `fast` extra) fuses the hot kernels; without it the same bits, slower.
$(VENV)/.installed-demo: $(VENV)/.made $(DEPS)
	$(PIP) -e '.[fast]' -c .ci/constraints.txt
	@echo "pip install -e .[fast]" > $@

$(VENV)/.installed-dev: $(VENV)/.made $(DEPS) | browser
	$(PIP) -e '.[dev]' -c .ci/constraints.txt
	$(VPY) -m server.runtime fetch
	$(VPY) -m server.chartlib fetch
	$(VPY) -m server.wasm_build fetch
	@echo "pip install -e .[dev]; runtime and wabt fetched" > $@

# Debian's Chromium drives the e2e tests (Playwright never downloads a browser here); npm
# fetches the Pyodide runtime and the wasm compiler, node runs them; coturn is the TURN
# server of the e2e across separate networks (e2e/test_turn.py).
browser:
	@missing=""; \
	  command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	  command -v ip >/dev/null 2>&1 || missing="$$missing iproute2"; \
	  command -v node >/dev/null 2>&1 || missing="$$missing nodejs"; \
	  command -v npm >/dev/null 2>&1 || missing="$$missing npm"; \
	  command -v turnserver >/dev/null 2>&1 || missing="$$missing coturn"; \
	  if [ -z "$$missing" ]; then exit 0; fi; \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -q && apt-get install -y -q $$missing; \
	  else echo "install Debian's$$missing for the e2e and wasm tests" \
	            "(sudo apt-get install$$missing)"; fi

runtime: $(VENV)/.installed-demo
	$(VPY) -m server.runtime fetch
	$(VPY) -m server.chartlib fetch

lint: $(VENV)/.installed-dev
	$(VPY) -m ruff check .
