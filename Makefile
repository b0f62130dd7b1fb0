# The two commands of the README: `make demo` and `make test`. Everything else is their set-up.
PY ?= python3
PIP = $(PY) -m pip install -q --disable-pip-version-check

.PHONY: demo test setup setup-dev browser runtime lint

demo: setup
	$(PY) -m pynode train

test: setup-dev
	$(PY) -m ruff check .
	PYNODE_FULL_SUITE=1 $(PY) -m pytest -q

# numba (the `fast` extra) fuses the hot kernels; without it the same bits, slower.
setup:
	$(PIP) -e '.[fast]' -c .ci/constraints.txt

setup-dev: browser
	$(PIP) -e '.[dev]' -c .ci/constraints.txt
	$(PY) -m server.runtime fetch
	$(PY) -m server.wasm_build fetch

# Debian's Chromium drives the e2e tests (Playwright never downloads a browser here).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q chromium iproute2; \
	  else echo "install Debian's chromium (sudo apt-get install chromium) for the e2e tests"; fi; }

runtime:
	$(PY) -m server.runtime fetch

lint:
	$(PY) -m ruff check .
