"""pytest setup: the lockd binary built by the test run, servers, and a time
bound on every test.

Coroutine tests run with ``asyncio.run`` under ``asyncio.timeout``; every
test, sync or async, is also bounded by SIGALRM, and the whole item (fixtures
included) by faulthandler, which dumps every thread's stack and exits if a
test hangs past its bound. ``@pytest.mark.timeout(s)`` sets a test's bound
(default 30 s).
"""

from __future__ import annotations

import asyncio
import faulthandler
import inspect
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from harness import REPO, Cluster  # noqa: E402

DEFAULT_TIMEOUT = 30.0


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "timeout(seconds): the test's time bound (default 30 s)")


def _timeout(item: pytest.Item) -> float:
    m = item.get_closest_marker("timeout")
    return float(m.args[0]) if m else DEFAULT_TIMEOUT


class TestTimeout(Exception):
    """A test ran past its bound."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    # Last resort: fixtures included, a hang ends the run with every stack.
    faulthandler.dump_traceback_later(_timeout(item) + 180, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    t = _timeout(item)

    def ring(signum: int, frame: Any) -> None:
        raise TestTimeout(f"test ran past its {t} s bound")

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, t + 5)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    fn = pyfuncitem.obj
    if not inspect.iscoroutinefunction(fn):
        return None
    args = {k: pyfuncitem.funcargs[k] for k in pyfuncitem._fixtureinfo.argnames}
    t = _timeout(pyfuncitem)

    async def bounded() -> None:
        async with asyncio.timeout(t):
            await fn(**args)

    asyncio.run(bounded())
    return True


@pytest.fixture(scope="session")
def lockd_bin(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The lockd binary: $LOCKD_BIN, else ``go build ./cmd/lockd`` of the
    repository (the checkout holding these tests, or $LOCKD_REPO) into a
    temporary directory."""
    env = os.environ.get("LOCKD_BIN")
    if env:
        return str(Path(env).resolve())
    if REPO is None:
        raise RuntimeError("no lockd binary: set LOCKD_BIN, or LOCKD_REPO to a checkout to build one from")
    go = shutil.which("go") or "/usr/local/go/bin/go"
    out = tmp_path_factory.mktemp("bin") / "lockd"
    subprocess.run([go, "build", "-o", str(out), "./cmd/lockd"], cwd=REPO, check=True, timeout=600)
    return str(out)


@pytest.fixture(scope="session")
def lockd_help(lockd_bin: str) -> str:
    """``lockd --help``: which flags the binary has."""
    p = subprocess.run([lockd_bin, "--help"], capture_output=True, text=True, timeout=30)
    return p.stdout + p.stderr


@pytest.fixture(scope="session")
def shared_server(lockd_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One single node for the tests that only need a server (own keys each)."""
    c = Cluster(lockd_bin, tmp_path_factory.mktemp("shared")).start()
    yield c
    c.close()


@pytest.fixture
def server(lockd_bin: str, tmp_path: Path) -> Iterator[Cluster]:
    """A fresh single node for one test."""
    c = Cluster(lockd_bin, tmp_path).start()
    yield c
    c.close()


def cluster_fixture(mode: str, lockd_bin: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A 3-member cluster of mode, killed at the end (its logs printed on failure)."""
    c = Cluster(lockd_bin, tmp_path, mode=mode, members=3).start()
    yield c
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(c.dump())
    c.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)
