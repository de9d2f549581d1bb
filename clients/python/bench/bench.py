"""lockd's Python client against redis-py's Lock, side by side in one run.

    /usr/bin/python3 clients/python/bench/bench.py [--rounds 5] [--seconds 5] [--markdown]

Two measurements, each from one Python process with 64 concurrent asyncio
tasks, interleaved over several rounds (the order alternates per round):

- uncontended: every task on its own key, acquire + release as fast as it
  can: pairs per second. lockd: ``Client.acquire(key, wait=5, lease=30)`` and
  ``release``; Redis: ``redis.asyncio`` ``Lock(timeout=30,
  blocking_timeout=5)`` ``acquire``/``release`` (SET NX PX, then a Lua
  compare-and-delete), through the client's default connection pool.
- contended: 8 hot keys, 8 tasks on each: every acquire waits for the key;
  handoffs per second, a handoff being a grant to a task other than the
  key's previous holder (a task that takes the key again right after
  releasing it is counted as a grant, not a handoff; both are printed). lockd queues the waiters and hands the key to
  the next one on release; redis-py's Lock retries with its blocking loop
  (``sleep=0.1``, its default).

It starts its own lockd (``go build ./cmd/lockd`` of this checkout, or
--lockd) and redis-server (--redis-server) on 127.0.0.1, with nothing
persisted, and stops them at the end. Medians per target and the ratio per
round are printed; the ratio within one interleaved run is what counts on a
shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE.parent / "src"))

import lockd  # noqa: E402

TASKS = 64
HOT_KEYS = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited: {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"{what} did not listen on {port}")


def start_lockd(binary: str, tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    p = subprocess.Popen(
        [binary, "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp / "data"), "--admin", ""],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    wait_port(port, p, "lockd")
    return p, f"127.0.0.1:{port}"


def start_redis(binary: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    p = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    wait_port(port, p, "redis-server")
    return p, port


Worker = Callable[[int, Callable[[], bool]], Awaitable[int]]


async def run_tasks(worker: Worker, seconds: float, warmup: float) -> float:
    """Run TASKS workers for warmup + seconds; the rate of what they complete
    inside the measured window."""
    loop = asyncio.get_running_loop()
    t0 = loop.time() + warmup
    t1 = t0 + seconds
    counts = [0] * TASKS

    def running() -> bool:
        return loop.time() < t1

    async def one(i: int) -> None:
        async def counted() -> int:
            return await worker(i, running)

        counts[i] = await counted()

    # Each worker counts only the operations that end inside [t0, t1].
    global WINDOW
    WINDOW = (t0, t1)
    await asyncio.gather(*(one(i) for i in range(TASKS)))
    return sum(counts) / seconds


WINDOW = (0.0, 0.0)


def in_window(loop: asyncio.AbstractEventLoop) -> bool:
    return WINDOW[0] <= loop.time() <= WINDOW[1]


GRANTS = [0]


def handoff(loop: asyncio.AbstractEventLoop, last: dict[str, int], key: str, task: int) -> int:
    """Record a grant of key to task; 1 if it is a handoff (the previous
    holder was another task) inside the measured window. A task that takes
    the key again right after releasing it (redis-py's Lock lets it: its
    waiters sleep) makes a grant but no handoff."""
    prev = last.get(key)
    last[key] = task
    if not in_window(loop):
        return 0
    GRANTS[0] += 1
    return int(prev is not None and prev != task)


async def lockd_uncontended(addr: str, seconds: float, warmup: float) -> float:
    async with lockd.Client([addr]) as c:
        await c.ping()
        loop = asyncio.get_running_loop()

        async def worker(i: int, running: Callable[[], bool]) -> int:
            key, n = f"u/{i}", 0
            while running():
                lk = await c.acquire(key, wait=5, lease=30)
                await c.release(lk)
                n += in_window(loop)
            return n

        return await run_tasks(worker, seconds, warmup)


async def lockd_contended(addr: str, seconds: float, warmup: float) -> float:
    async with lockd.Client([addr]) as c:
        await c.ping()
        loop = asyncio.get_running_loop()

        last: dict[str, int] = {}

        async def worker(i: int, running: Callable[[], bool]) -> int:
            key, n = f"hot/{i % HOT_KEYS}", 0
            while running():
                lk = await c.acquire(key, wait=30, lease=30)
                n += handoff(loop, last, key, i)
                await c.release(lk)
            return n

        return await run_tasks(worker, seconds, warmup)


async def redis_uncontended(port: int, seconds: float, warmup: float) -> float:
    import redis.asyncio as aredis

    r = aredis.Redis(host="127.0.0.1", port=port)
    try:
        await r.ping()
        loop = asyncio.get_running_loop()

        async def worker(i: int, running: Callable[[], bool]) -> int:
            key, n = f"u/{i}", 0
            while running():
                lk = r.lock(key, timeout=30, blocking_timeout=5)
                if not await lk.acquire():
                    raise RuntimeError("redis: lock not acquired")
                await lk.release()
                n += in_window(loop)
            return n

        return await run_tasks(worker, seconds, warmup)
    finally:
        await r.close()
        await r.connection_pool.disconnect()


async def redis_contended(port: int, seconds: float, warmup: float) -> float:
    import redis.asyncio as aredis

    r = aredis.Redis(host="127.0.0.1", port=port)
    try:
        await r.ping()
        loop = asyncio.get_running_loop()

        last: dict[str, int] = {}

        async def worker(i: int, running: Callable[[], bool]) -> int:
            key, n = f"hot/{i % HOT_KEYS}", 0
            while running():
                lk = r.lock(key, timeout=30, blocking_timeout=30)  # sleep=0.1: redis-py's default
                if not await lk.acquire():
                    raise RuntimeError("redis: lock not acquired")
                n += handoff(loop, last, key, i)
                await lk.release()
            return n

        return await run_tasks(worker, seconds, warmup)
    finally:
        await r.close()
        await r.connection_pool.disconnect()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=5.0, help="measured seconds per target and round")
    ap.add_argument("--warmup", type=float, default=0.5)
    ap.add_argument("--lockd", default=os.environ.get("LOCKD_BIN", ""), help="lockd binary (default: go build)")
    ap.add_argument("--redis-server", default=shutil.which("redis-server") or "/usr/bin/redis-server")
    ap.add_argument("--markdown", action="store_true", help="print the results as a Markdown section")
    ap.add_argument("--json", default="", help="also write the raw figures to this file")
    args = ap.parse_args()

    import redis

    with tempfile.TemporaryDirectory(prefix="lockd-pybench-") as td:
        tmp = Path(td)
        binary = args.lockd
        if not binary:
            binary = str(tmp / "lockd")
            subprocess.run(["go", "build", "-o", binary, "./cmd/lockd"], cwd=REPO, check=True)
        lp, addr = start_lockd(binary, tmp)
        rp, rport = start_redis(args.redis_server)
        targets: dict[str, Callable[[], Awaitable[float]]] = {
            "lockd uncontended": lambda: lockd_uncontended(addr, args.seconds, args.warmup),
            "redis uncontended": lambda: redis_uncontended(rport, args.seconds, args.warmup),
            "lockd contended": lambda: lockd_contended(addr, args.seconds, args.warmup),
            "redis contended": lambda: redis_contended(rport, args.seconds, args.warmup),
        }
        res: dict[str, list[float]] = {k: [] for k in targets}
        grants: dict[str, list[float]] = {"lockd contended": [], "redis contended": []}
        loads = []
        try:
            for rnd in range(args.rounds):
                order = list(targets)
                if rnd % 2:
                    order = [order[1], order[0], order[3], order[2]]
                for name in order:
                    GRANTS[0] = 0
                    v = asyncio.run(targets[name]())
                    res[name].append(v)
                    if "contended" in name and "un" not in name:
                        grants[name].append(GRANTS[0] / args.seconds)
                    print(f"round {rnd + 1} {name:18s} {v:10.0f}/s", file=sys.stderr, flush=True)
                loads.append(os.getloadavg()[0])
        finally:
            for p in (lp, rp):
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(20)

    ru = [a / b for a, b in zip(res["lockd uncontended"], res["redis uncontended"])]
    rc = [a / b for a, b in zip(res["lockd contended"], res["redis contended"])]
    med = {k: statistics.median(v) for k, v in res.items()}
    meta = {
        "python": platform.python_version(),
        "redis-py": redis.__version__,
        "redis-server": subprocess.run([args.redis_server, "--version"], capture_output=True, text=True).stdout.split()[2],
        "cores": os.cpu_count(),
        "rounds": args.rounds,
        "seconds": args.seconds,
        "load": [round(x, 2) for x in loads],
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": res, "grants": grants}, indent=1))
    if args.markdown:
        print(markdown(meta, res, med, ru, rc, grants))
        return
    for k, v in med.items():
        print(f"{k:18s} median {v:10.0f}/s   rounds: " + ", ".join(f"{x:.0f}" for x in res[k]))
    print("uncontended ratio per round: " + ", ".join(f"{x:.1f}x" for x in ru) + f"  (median {statistics.median(ru):.1f}x, goal >= 5x)")
    for k, v in grants.items():
        print(f"{k:18s} grants/s (handoffs and re-takes by the same task): " + ", ".join(f"{x:.0f}" for x in v))
    print("contended   ratio per round: " + ", ".join(f"{x:.1f}x" for x in rc) + f"  (median {statistics.median(rc):.1f}x, goal >= 10x)")


def markdown(
    meta: dict[str, Any],
    res: dict[str, list[float]],
    med: dict[str, float],
    ru: list[float],
    rc: list[float],
    grants: dict[str, list[float]],
) -> str:
    lines = [
        f"Python {meta['python']}, redis-py {meta['redis-py']} (no hiredis), redis-server {meta['redis-server']}, "
        f"{meta['cores']} cores shared with other work (1-minute load after each round: {', '.join(map(str, meta['load']))}); "
        f"{meta['rounds']} interleaved rounds of {meta['seconds']:g} s per target, {meta['date']}.",
        "",
        "| measurement | lockd (Python client) | redis-py `Lock` | ratio per round | median ratio | goal |",
        "|---|---|---|---|---|---|",
        f"| acquire/release pairs/s, 64 tasks, own keys | {med['lockd uncontended']:,.0f} | {med['redis uncontended']:,.0f} | "
        + ", ".join(f"{x:.1f}×" for x in ru) + f" | **{statistics.median(ru):.1f}×** | ≥ 5× |",
        f"| handoffs/s, 64 tasks on 8 hot keys | {med['lockd contended']:,.0f} | {med['redis contended']:,.0f} | "
        + ", ".join(f"{x:.0f}×" for x in rc) + f" | **{statistics.median(rc):.0f}×** | ≥ 10× |",
        "",
        "Per round (/s): " + "; ".join(f"{k}: " + ", ".join(f"{x:,.0f}" for x in v) for k, v in res.items()) + ".",
        "Grants/s in the contended runs, handoffs plus re-takes of a key by the task that just released it: "
        + "; ".join(f"{k}: " + ", ".join(f"{x:,.0f}" for x in v) for k, v in grants.items()) + ".",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
