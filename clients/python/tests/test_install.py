"""``pip install ./clients/python`` works without the package index from a
fresh virtual environment of any Python >= 3.11, writes nothing into the
source tree, and installs a typed package (py.typed) for mypy --strict
users; the test suite runs from a copy of the package against the installed
package.

The interpreters: the one running the tests, and every one listed in
``$LOCKD_TEST_PYTHONS`` (colon-separated paths). A venv with pip needs
Debian's python3-venv; .ci/run installs it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import REPO, Cluster

PKG = Path(__file__).resolve().parents[1]

_JUNK = ("__pycache__", ".mypy_cache", ".pytest_cache")


def _interpreters() -> list[str]:
    extra = [p for p in os.environ.get("LOCKD_TEST_PYTHONS", "").split(":") if p]
    return [sys.executable, *extra]


def _tree(root: Path) -> set[str]:
    """Every file and directory under root, junk caches aside."""
    return {str(p.relative_to(root)) for p in root.rglob("*") if not any(j in p.parts for j in _JUNK)}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_ROOT_USER_ACTION="ignore", PIP_NO_CACHE_DIR="1")
    env.update(extra)
    return env


def _venv(python: str, where: Path, system_site: bool = False) -> Path:
    """A fresh venv with pip; its interpreter."""
    args = [python, "-m", "venv", *(["--system-site-packages"] if system_site else []), str(where)]
    p = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"{' '.join(args)} failed (Debian: apt-get install python3-venv):\n{p.stdout}{p.stderr}"
    return where / "bin" / "python"


def _pip_install(vpy: Path) -> None:
    before = _tree(PKG)
    p = subprocess.run(
        [str(vpy), "-m", "pip", "install", "--no-index", str(PKG)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=200,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    after = _tree(PKG)
    assert after == before, f"pip install wrote into the source tree: {sorted(after ^ before)}"


USER_PROGRAM = """
import asyncio, sys
import lockd

async def main() -> None:
    async with lockd.Client([sys.argv[1]]) as c:
        lk = await c.acquire("install/" + sys.version.split()[0], wait=1, lease=5)
        await c.release(lk)
        print(lockd.__file__)

asyncio.run(main())
"""


@pytest.mark.timeout(600)
@pytest.mark.parametrize("python", _interpreters())
def test_pip_install_offline_in_a_venv(python: str, tmp_path: Path, shared_server: Cluster) -> None:
    vpy = _venv(python, tmp_path / "venv")
    _pip_install(vpy)
    prog = tmp_path / "user.py"
    prog.write_text(USER_PROGRAM)
    run = subprocess.run(
        [str(vpy), str(prog), shared_server.addrs[0]], capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=60
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip().startswith(str(tmp_path / "venv")), f"imported from elsewhere: {run.stdout}"


@pytest.mark.timeout(600)
def test_installed_package_is_typed_and_the_suite_runs_from_a_copy(
    tmp_path: Path, lockd_bin: str, shared_server: Cluster
) -> None:
    vpy = _venv(sys.executable, tmp_path / "venv", system_site=True)  # pytest and mypy from the system
    _pip_install(vpy)
    # mypy reads the installed package's types only because of py.typed
    # (without it: "missing library stubs").
    user = tmp_path / "user.py"
    user.write_text(
        "import lockd\n\n"
        "async def f(c: lockd.Client) -> int:\n"
        "    lk = await c.acquire('k', wait=1)\n"
        "    return lk.token\n\n"
        "def g() -> lockd.SyncClient:\n"
        "    return lockd.SyncClient(['127.0.0.1:7070'], dial_timout=1)\n"
    )
    m = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--python-executable", str(vpy), str(user)],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=tmp_path,
        timeout=300,
    )
    out = m.stdout + m.stderr
    # The typo, and nothing else: the rest of the file type-checks.
    assert 'Unexpected keyword argument "dial_timout"' in out and "Found 1 error in 1 file" in out, out
    # The suite from a copy of the package without its src/: the tests
    # import the installed lockd, and find the repository's shared data
    # through LOCKD_REPO.
    copy = tmp_path / "copy"
    shutil.copytree(PKG, copy, ignore=shutil.ignore_patterns(*_JUNK, "src"))
    env = _env(LOCKD_BIN=lockd_bin, LOCKD_REPO=str(REPO))
    t = subprocess.run(
        [
            str(vpy),
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_vectors.py",
            "tests/test_docs.py",
            "tests/test_server.py",
            "tests/test_rules.py::test_wire_wait",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=copy,
        timeout=400,
    )
    assert t.returncode == 0, t.stdout[-4000:] + t.stderr[-4000:]
    assert " passed" in t.stdout and "skipped" not in t.stdout, t.stdout[-2000:]
    which = subprocess.run(
        [str(vpy), "-c", "import lockd; print(lockd.__file__)"], capture_output=True, text=True, env=env, cwd=copy, timeout=60
    )
    assert which.stdout.strip().startswith(str(tmp_path / "venv")), which.stdout + which.stderr
