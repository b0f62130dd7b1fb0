"""The README's set-up as a new user meets it: a fresh clone, only python3 and make.

The fresh-clone test runs `make demo STEPS=2` twice in a clone of this repository (its
committed HEAD) with a PATH that holds only `python3` and `make` (symlinks in a temp bin
folder; make runs its recipes with /bin/sh by absolute path, so sh needs no PATH entry),
HOME in a temp folder, and of the caller's environment only what pip needs to reach its
registry (PIP_* and the proxy and CA variables). No virtual environment exists before:
the Makefile has to make its own. pip keeps the caller's wheel cache (PIP_CACHE_DIR, else
~/.cache/pip, when it exists), so a machine that installed these wheels before does not
download them again; pip still resolves and installs everything into the new .venv.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REGISTRY_VARS = {  # what pip reads to reach a registry, besides PIP_*
    "http_proxy", "https_proxy", "no_proxy", "all_proxy",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
}
STATE_HASH = re.compile(r"^[0-9a-f]{64}$", re.MULTILINE)


def base_python() -> str:
    """The interpreter behind this one (not a venv's, not a pyenv shim), symlinks resolved."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def bare_env(home: Path, bin_dir: Path) -> dict[str, str]:
    kept = {k: v for k, v in os.environ.items() if k.startswith("PIP_") or k in REGISTRY_VARS}
    cache = Path(os.environ.get("PIP_CACHE_DIR") or Path.home() / ".cache" / "pip")
    if cache.is_dir():
        kept["PIP_CACHE_DIR"] = str(cache)
    return {**kept, "PATH": str(bin_dir), "HOME": str(home), "LANG": "C.UTF-8"}


def bin_with(folder: Path, **tools: str) -> Path:
    folder.mkdir()
    for name, target in tools.items():
        (folder / name).symlink_to(target)
    return folder


@pytest.fixture
def make_path() -> str:
    found = shutil.which("make")
    if found is None:
        pytest.skip("make is not installed")
    return os.path.realpath(found)


@pytest.mark.slow
@pytest.mark.full  # a clone, a venv and a pip install: half a minute
def test_fresh_clone_make_demo_with_only_python3_and_make(tmp_path: Path, make_path: str):
    if shutil.which("git") is None:
        pytest.skip("git is not installed (the test clones this repository)")
    clone = tmp_path / "daisychain"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    assert not (clone / ".venv").exists()
    bin_dir = bin_with(tmp_path / "bin", python3=base_python(), make=make_path)
    (tmp_path / "home").mkdir()
    env = bare_env(tmp_path / "home", bin_dir)

    def make_demo() -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["make", "demo", "STEPS=2"], cwd=clone, env=env,
                              capture_output=True, text=True, timeout=1200)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done

    first, second = make_demo(), make_demo()
    assert "-m venv .venv" in first.stdout and "pip install" in first.stdout
    assert "pip install" not in second.stdout  # installed once; the second only trains
    hashes = [STATE_HASH.findall(done.stdout) for done in (first, second)]
    assert len(hashes[0]) == 1 and hashes[0] == hashes[1]
    assert "step 2 " in first.stdout + first.stderr
    where = subprocess.run([str(clone / ".venv/bin/python"), "-c",
                            "import pynode; print(pynode.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()).is_relative_to(clone)


def test_python_without_ensurepip_is_named_with_the_package_to_install(
        tmp_path: Path, make_path: str):
    # Debian ships venv without ensurepip (python3.X-venv); a shadowing package stands in.
    shadow = tmp_path / "shadow" / "ensurepip"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("no ensurepip here")\n')
    bin_dir = bin_with(tmp_path / "bin", python3=base_python(), make=make_path)
    env = {**bare_env(tmp_path, bin_dir), "PYTHONPATH": str(shadow.parent)}
    venv = tmp_path / "venv"
    done = subprocess.run(["make", "-s", "setup", f"VENV={venv}"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    version = "{}.{}".format(*sys.version_info[:2])
    assert done.returncode != 0
    first = done.stderr.splitlines()[0]
    assert first.startswith("make: python3 cannot make a virtual environment"), done.stderr
    assert f"apt-get install python{version}-venv" in first
    assert not venv.exists()


def test_missing_python_is_named(tmp_path: Path, make_path: str):
    bin_dir = bin_with(tmp_path / "bin", make=make_path)
    done = subprocess.run(["make", "-s", "setup", f"VENV={tmp_path / 'venv'}"], cwd=REPO,
                          env=bare_env(tmp_path, bin_dir), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0
    assert done.stderr.startswith("make: python3 not found; install Python >= 3.10"), done.stderr
