"""A plain (non-editable) ``pip install .`` works on its own: units verify, the page is served.

The project is installed from a copy of the source tree into a fresh venv, the copy is
deleted, and everything runs from an empty folder, so nothing can be read from a checkout.
The venv sees this interpreter's site-packages through a ``.pth`` file (numpy, flask, ...:
no network), listed after its own, so the installed copy wins over an editable install.
What ``pip install '.[server]'`` does not bring is hidden there (a ``sitecustomize`` makes
its import fail): numba and torch (their extras), aiortc and websockets (``[webrtc]``), so
the installed copy runs as a user's would, on the numpy kernels and backends.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import select
import shutil
import site
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[2]
NOT_COPIED = shutil.ignore_patterns(
    ".git", ".cache", ".venv", "artifacts", "build", "dist", "*.egg-info", "__pycache__",
    "*.pyc", ".*_cache",
)
NOT_INSTALLED = ("numba", "torch", "aiortc", "websockets")  # extras beyond [server]
HIDDEN_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYNODE_UNITS_DIR")
STARTUP_S = 60


@dataclass(frozen=True)
class Install:
    venv: Path  # the fresh venv holding the installed project
    cwd: Path  # an empty folder outside the source tree
    env: dict[str, str]  # this process's environment without PYTHONPATH and overrides

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.python), *args], cwd=self.cwd, env=self.env,
                              capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Install:
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    shutil.copytree(SOURCE, source, ignore=NOT_COPIED)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (purelib,) = venv.glob("lib/python*/site-packages")
    (purelib / "outer-site-packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    (purelib / "sitecustomize.py").write_text(
        "import sys\n"
        f"sys.modules.update(dict.fromkeys({NOT_INSTALLED!r}))  # import -> ImportError\n")
    env = {k: v for k, v in os.environ.items() if k not in HIDDEN_ENV}
    cwd = root / "elsewhere"
    cwd.mkdir()
    install = Install(venv, cwd, env)
    done = install.run("-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                       "--disable-pip-version-check", "--quiet", str(source))
    assert done.returncode == 0, done.stdout + done.stderr
    shutil.rmtree(source)
    return install


def test_the_installed_copy_is_the_one_imported(installed: Install) -> None:
    done = installed.run("-c", "import pynode, server; print(pynode.__file__); "
                               "print(server.__file__)")
    assert done.returncode == 0, done.stderr
    for module_file in map(Path, done.stdout.split()):
        assert module_file.is_relative_to(installed.venv), module_file
        assert not module_file.is_relative_to(SOURCE), module_file


@pytest.mark.slow
def test_installed_pynode_verifies_its_units(installed: Install) -> None:
    done = installed.run("-m", "pynode", "verify")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verify passed" in done.stdout
    hidden = installed.run("-c", "import numba")
    assert "ModuleNotFoundError" in hidden.stderr or "ImportError" in hidden.stderr


def _page_files() -> Iterator[tuple[str, Path]]:
    """(URL, source file) of every file the page is made of."""
    yield "/", SOURCE / "server" / "static" / "index.html"
    for folder, prefix in (("static", "/static/"), ("pyodide_app", "/app/")):
        root = SOURCE / "server" / folder
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            yield prefix + path.relative_to(root).as_posix(), path


def _shipped_pynode_files() -> Iterator[tuple[str, Path]]:
    """(name in the bundle, source file) of every module and data file pynode runs with."""
    root = SOURCE / "pynode"
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and "__pycache__" not in rel.parts and (
            path.suffix == ".py" or rel.parts[0] in ("data", "wasm")
        ):
            yield f"pynode/{rel.as_posix()}", path


@pytest.fixture
def served(installed: Install, tmp_path: Path) -> Iterator[str]:
    """The installed ``python -m server`` on a free loopback port; yields its base URL."""
    log = tmp_path / "server.log"
    args = ["-m", "server", "--host", "127.0.0.1", "--port", "0", "--log-level", "WARNING",
            "--data-dir", str(tmp_path / "state"),
            "--data-url", "http://127.0.0.1:9/never-fetched.parquet"]
    with log.open("w") as stderr:
        process = subprocess.Popen([str(installed.python), *args], cwd=installed.cwd,
                                   env=installed.env, stdout=subprocess.PIPE, stderr=stderr,
                                   text=True)
    try:
        deadline = time.monotonic() + STARTUP_S
        banner = ""
        while not banner and process.poll() is None and time.monotonic() < deadline:
            if select.select([process.stdout], [], [], 1)[0]:
                banner = process.stdout.readline()
        found = re.search(r"http://127\.0\.0\.1:(\d+)/", banner)
        assert found, f"the server did not start: {banner!r} {log.read_text()}"
        yield f"http://127.0.0.1:{found.group(1)}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stdout.close()


def _get(url: str) -> tuple[bytes, dict[str, str]]:
    with urllib.request.urlopen(url, timeout=60) as response:
        assert response.status == 200, url
        return response.read(), dict(response.headers)


def test_installed_server_serves_the_page_and_the_bundle(
    served: str, installed: Install, tmp_path: Path
) -> None:
    for url, source in _page_files():
        body, _ = _get(served + url)
        assert body == source.read_bytes(), f"{url} is not {source.relative_to(SOURCE)}"

    zipped, headers = _get(served + "/bundle/pynode.zip")
    assert headers["X-Content-SHA256"] == hashlib.sha256(zipped).hexdigest()
    with zipfile.ZipFile(io.BytesIO(zipped)) as bundle:
        for name, source in _shipped_pynode_files():
            assert bundle.read(name) == source.read_bytes(), f"{name} differs in the bundle"
        bundle.extractall(tmp_path / "bundle")

    # What the page's worker does: the bundle first on sys.path, then the unit weights.
    done = installed.run("-c", "import sys; sys.path.insert(0, sys.argv[1]); import pynode; "
                               "from pynode.unitfiles import load_default_units; "
                               "load_default_units(); print(pynode.__file__)",
                         str(tmp_path / "bundle"))
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).is_relative_to(tmp_path / "bundle")
