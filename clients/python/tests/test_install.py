"""``pip install ./clients/python`` works without the package index, and the
installed package is typed (py.typed) for mypy --strict users."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1]


def _pip_available() -> bool:
    return subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0


@pytest.mark.timeout(240)
def test_pip_install_offline_and_typed(tmp_path: Path) -> None:
    if not _pip_available():
        pytest.skip(f"no pip for {sys.executable} (Debian: apt-get install python3-pip)")
    # Build from a copy, so the checkout gets no build/ or egg-info.
    src = tmp_path / "src"
    shutil.copytree(PKG, src, ignore=shutil.ignore_patterns("__pycache__", ".*_cache", "build", "*.egg-info", "tests", "bench"))
    target = tmp_path / "target"
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_ROOT_USER_ACTION="ignore")
    p = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--target", str(target), str(src)],
        capture_output=True, text=True, env=env, timeout=200,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert (target / "lockd" / "py.typed").is_file()
    user = tmp_path / "user.py"
    user.write_text(
        "import lockd\n\n"
        "async def f(c: lockd.Client) -> int:\n"
        "    lk = await c.acquire('k', wait=1)\n"
        "    return lk.token\n"
    )
    # Found through PYTHONPATH as an installed package: mypy reads its types
    # only because of py.typed (without it: "missing library stubs").
    env2 = dict(os.environ, PYTHONPATH=str(target))
    run = subprocess.run([sys.executable, "-c", "import lockd; print(lockd.__file__)"], capture_output=True, text=True, env=env2, timeout=60)
    assert run.returncode == 0 and str(target) in run.stdout, run.stderr
    m = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(user)],
        capture_output=True, text=True, env=env2, cwd=tmp_path, timeout=200,
    )
    assert m.returncode == 0, m.stdout + m.stderr
