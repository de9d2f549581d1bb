"""Test harness: real lockd processes, a scripted fake server, a frame-aware
fault proxy, and a TLS-terminating proxy. Everything listens on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

from typing import TYPE_CHECKING

import lockd
from lockd import proto

if TYPE_CHECKING:
    from lockd._pool import Pool


def _find_repo() -> Path | None:
    """The lockd repository these tests belong to: $LOCKD_REPO, else the
    nearest directory above this file holding lockd's go.mod (None when the
    tests run from a copy of the package outside the repository)."""
    env = os.environ.get("LOCKD_REPO")
    if env:
        return Path(env).resolve()
    for d in Path(__file__).resolve().parents:
        gm = d / "go.mod"
        if gm.is_file() and gm.read_text("utf-8", "replace").startswith("module github.com/lockd-dev/lockd"):
            return d
    return None


REPO = _find_repo()


def repo_path(rel: str) -> Path:
    """A file of the lockd repository that the tests share with the Go
    suite (test vectors, conformance cases). From a copy of the package
    outside the repository, set LOCKD_REPO to a checkout."""
    if REPO is None:
        raise RuntimeError(
            f"{rel}: these tests share data with the lockd repository; run them inside a checkout "
            "or set LOCKD_REPO to one"
        )
    return REPO / rel


def pool(c: lockd.Client) -> Pool:
    """The connections of a started client, for tests that look inside."""
    core = c._core
    assert core is not None, "the client has not started"
    return core.pool


# Ports.

_handed: set[int] = set()
_ports_mu = threading.Lock()


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


def pick_ports(n: int, offset: int = 10000) -> list[int]:
    """n base ports p with p and p+offset free, outside the ephemeral range
    (so no outgoing connection takes them between the pick and the bind), and
    never handed out twice in this process."""
    lo, hi = _ephemeral()
    rng = random.Random()
    out: list[int] = []
    with _ports_mu:
        for _ in range(2000 * n):
            if len(out) == n:
                break
            p = rng.randint(12000, 65535 - offset)
            ps = (p, p + offset)
            if any(lo <= x <= hi for x in ps) or any(x in _handed for x in ps):
                continue
            if not all(_free(x) for x in ps):
                continue
            _handed.update(ps)
            out.append(p)
    if len(out) != n:
        raise RuntimeError("no free ports")
    return out


def dead_addr() -> str:
    """An address nothing listens on (a port picked free, outside the
    ephemeral range, not handed out again)."""
    return f"127.0.0.1:{pick_ports(1)[0]}"


# Real lockd processes.


class Node:
    """One lockd process, across restarts: same command line, same data dir."""

    def __init__(self, binary: str, addr: str, data_dir: Path, args: list[str]) -> None:
        self.binary = binary
        self.addr = addr
        self.data_dir = data_dir
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None
        self.lines: list[str] = []
        self.admin = ""
        self._ready = threading.Event()
        self._mu = threading.Lock()

    def start(self, timeout: float = 30.0) -> None:
        """Start the process and wait for its ready log line."""
        self._ready.clear()
        cmd = [
            self.binary,
            "--listen",
            self.addr,
            "--data-dir",
            str(self.data_dir),
            "--admin",
            "127.0.0.1:0",
            "--log-format",
            "json",
            *self.args,
        ]
        with self._mu:
            self.lines.append("=== " + " ".join(cmd))
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        proc = self.proc
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.05):
            if proc.poll() is not None:
                raise RuntimeError(f"lockd {self.addr} exited before ready: {proc.returncode}\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"lockd {self.addr}: no ready line in {timeout} s\n{self.log_tail()}")

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self._mu:
                self.lines.append(line)
            if not line.startswith("{"):
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            msg, addr = rec.get("msg"), rec.get("addr", "")
            if msg == "ready" and addr in ("", self.addr):
                self._ready.set()
            elif msg == "admin endpoint":
                self.admin = addr

    def log_tail(self, n: int = 40) -> str:
        """The last n lines of the node's output."""
        with self._mu:
            return "\n".join(self.lines[-n:])

    def alive(self) -> bool:
        """Whether the process runs."""
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the process group and reap it."""
        p = self.proc
        if p is None or p.poll() is not None:
            return
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(10)

    def term(self, timeout: float = 20.0) -> int:
        """SIGTERM, wait for the exit; the exit code."""
        p = self.proc
        assert p is not None
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
        return p.wait(timeout)

    def status(self) -> dict[str, Any]:
        """The admin endpoint's /status, decoded."""
        with urllib.request.urlopen(f"http://{self.admin}/status", timeout=2) as r:
            doc: dict[str, Any] = json.loads(r.read())
            return doc

    def force_release(self, key: str, token: int) -> dict[str, Any]:
        """The admin endpoint's forced release of ``key``'s holder
        ``token`` (``DELETE /keys/{key}?token=``), decoded."""
        from urllib.parse import quote

        req = urllib.request.Request(
            f"http://{self.admin}/keys/{quote(key, safe='')}?token={token}", method="DELETE"
        )
        with urllib.request.urlopen(req, timeout=2) as r:
            doc: dict[str, Any] = json.loads(r.read())
            return doc

    def key_state(self, key: str) -> dict[str, Any]:
        """The admin endpoint's /keys/{key}, decoded."""
        from urllib.parse import quote

        with urllib.request.urlopen(f"http://{self.admin}/keys/{quote(key, safe='')}", timeout=2) as r:
            doc: dict[str, Any] = json.loads(r.read())
            return doc


class Cluster:
    """lockd nodes on 127.0.0.1: one single node, or a priority/raft cluster."""

    def __init__(self, binary: str, root: Path, mode: str = "", members: int = 1, extra: list[str] | None = None) -> None:
        self.binary = binary
        self.root = root
        self.mode = mode
        self.n = members
        self.extra = extra or []
        self.nodes: list[Node] = []

    def start(self) -> Cluster:
        """Start every node (new ports if one was taken meanwhile)."""
        last: Exception | None = None
        for attempt in range(3):
            ports = pick_ports(self.n)
            addrs = [f"127.0.0.1:{p}" for p in ports]
            self.nodes = []
            for i, a in enumerate(addrs):
                args = list(self.extra)
                if self.mode:
                    args = ["--cluster", self.mode, "--peers", ",".join(addrs), "--self", a, *args]
                d = self.root / f"a{attempt}-m{i}"
                d.mkdir(parents=True, exist_ok=True)
                self.nodes.append(Node(self.binary, a, d, args))
            try:
                for nd in self.nodes:
                    nd.start()
                return self
            except RuntimeError as e:
                last = e
                self.close()
                if "address already in use" not in str(e):
                    raise
        raise RuntimeError(f"cluster did not start: {last}")

    @property
    def addrs(self) -> list[str]:
        """Every node's client address, in --peers order."""
        return [nd.addr for nd in self.nodes]

    def close(self) -> None:
        """Kill every node."""
        for nd in self.nodes:
            nd.kill()

    def dump(self) -> str:
        """Every node's log tail."""
        return "\n".join(f"--- {nd.addr}\n{nd.log_tail()}" for nd in self.nodes)

    def wait_leader(self, timeout: float = 20.0) -> Node:
        """The node that reports itself active (priority) or leader (raft),
        once every live node names it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            live = [nd for nd in self.nodes if nd.alive()]
            try:
                sts = [nd.status() for nd in live]
            except OSError:
                time.sleep(0.1)
                continue
            leaders = [nd for nd, st in zip(live, sts) if st.get("role") in ("active", "leader")]
            if len(leaders) == 1:
                la = leaders[0].addr
                if all(st.get("active", st.get("leader", la)) == la for st in sts):
                    return leaders[0]
            time.sleep(0.1)
        raise RuntimeError(f"no single active/leader in {timeout} s\n{self.dump()}")


# The scripted fake server.


@dataclass
class FReq:
    """A request the fake server read."""

    conn: FConn
    op: int
    wait: int
    lease: int
    id: int
    key: str
    at: float
    limit: int = 0


class FConn:
    """One connection accepted by the fake server."""

    def __init__(self, fake: Fake, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.fake = fake
        self.reader = reader
        self.writer = writer
        self.closed = asyncio.Event()

    def send(self, b: bytes) -> None:
        """Write bytes to the client."""
        if not self.writer.is_closing():
            self.writer.write(b)

    def close(self) -> None:
        """Close the connection (abort: no lingering)."""
        t = self.writer.transport
        t.abort()
        self.closed.set()

    def auto(self, r: FReq) -> None:
        """The default answer: grant (exclusive or shared), release, renew,
        pong, welcome; valid (30 s left), watching (registered: see
        :meth:`Fake.push_lost`), an inspection of a free key."""
        kb = r.key.encode()
        if r.op == proto.OP_ACQUIRE or r.op == proto.OP_SHARED:
            self.fake.token += 1
            self.send(proto.encode_acquired(r.id, self.fake.token, kb))
        elif r.op == proto.OP_VALIDATE:
            self.send(proto.encode_valid(r.id, 30000, kb))
        elif r.op == proto.OP_WATCH:
            self.fake.registered.append((self, r.id, r.key))
            self.send(proto.encode_watching(r.id, kb))
        elif r.op == proto.OP_INSPECT:
            self.send(proto.encode_inspection(r.id, 0, 0, 0, 0, 0, kb))
        elif r.op == proto.OP_RELEASE:
            self.send(proto.encode_released(r.id, kb))
        elif r.op == proto.OP_RENEW:
            self.send(proto.encode_renewed(r.id, kb))
        elif r.op == proto.OP_PING:
            self.send(proto.encode_pong(r.id))
        elif r.op == proto.OP_HELLO:
            self.send(proto.encode_welcome(r.id, kb.split(b" ", 1)[0]))


Handler = Callable[[FConn, FReq], Awaitable[None] | None]


class Fake:
    """A scripted lockd server: it records every request (``reqs``, in
    arrival order) and answers each with ``handler(conn, req)`` (default:
    ``conn.auto``). A connection's first frame — the client's hello, or the
    ping a client without a hello sends first — is answered automatically
    and not queued: hellos are kept in ``hellos`` and answered by ``hello``
    if set, those pings in ``probes`` and answered by ``probe`` if set.
    Watch requests (the client watches every lock it holds) are not queued
    either: they are kept in ``watch_reqs`` (and ``watch_q``) and answered
    by ``watch`` if set, else registered and answered ``W``
    (:meth:`push_lost` ends registrations)."""

    def __init__(
        self,
        handler: Handler | None = None,
        hello: Handler | None = None,
        probe: Handler | None = None,
        watch: Handler | None = None,
    ) -> None:
        self.handler = handler
        self.hello = hello
        self.probe = probe
        self.watch = watch
        self.reqs: asyncio.Queue[FReq] = asyncio.Queue()
        self.hellos: list[FReq] = []
        self.probes: list[FReq] = []
        self.watch_reqs: list[FReq] = []
        self.watch_q: asyncio.Queue[FReq] = asyncio.Queue()
        self.registered: list[tuple[FConn, int, str]] = []  # watches answered W: (conn, token, key)
        self.conns: list[FConn] = []
        self.accepts: asyncio.Queue[tuple[FConn, float]] = asyncio.Queue()
        self.token = 1000
        self.server: asyncio.Server | None = None
        self.addr = ""

    async def start(self, addr: str | None = None) -> Fake:
        """Listen on addr (default: a free port)."""
        host, port = "127.0.0.1", 0
        if addr:
            port = int(addr.rsplit(":", 1)[1])
        self.server = await asyncio.start_server(self._serve, host, port)
        p = self.server.sockets[0].getsockname()[1]
        self.addr = f"127.0.0.1:{p}"
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        fc = FConn(self, reader, writer)
        self.conns.append(fc)
        self.accepts.put_nowait((fc, time.monotonic()))
        buf = b""
        first = True
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                buf += data
                pos = 0
                while True:
                    try:
                        f = proto.parse_request(buf, pos)
                    except proto.FrameError:
                        fc.close()
                        return
                    if f is None:
                        break
                    pos, r, _code = f
                    req = FReq(
                        fc, r.op, r.wait, r.lease, r.id, r.key.decode("utf-8", "replace"), time.monotonic(), r.limit
                    )
                    probe, first = first and r.op == proto.OP_PING, False
                    if r.op == proto.OP_WATCH:
                        self.watch_reqs.append(req)
                        self.watch_q.put_nowait(req)
                        h = self.watch
                    elif r.op == proto.OP_HELLO or probe:
                        (self.hellos if r.op == proto.OP_HELLO else self.probes).append(req)
                        h = self.hello if r.op == proto.OP_HELLO else self.probe
                        if h is None:
                            fc.auto(req)
                            continue
                    else:
                        self.reqs.put_nowait(req)
                        h = self.handler
                    if h is None:
                        fc.auto(req)
                    else:
                        res = h(fc, req)
                        if res is not None:
                            await res
                    if fc.closed.is_set():
                        return  # closed by the handler: nothing after it is read
                buf = buf[pos:]
        except (ConnectionError, OSError):
            pass
        finally:
            fc.closed.set()
            writer.transport.abort()

    async def next(self, timeout: float = 2.0) -> FReq:
        """The next request read (watches aside); fails after timeout."""
        return await asyncio.wait_for(self.reqs.get(), timeout)

    async def next_watch(self, timeout: float = 2.0) -> FReq:
        """The next watch request read; fails after timeout."""
        return await asyncio.wait_for(self.watch_q.get(), timeout)

    def push_lost(self, token: int, reason: int) -> int:
        """Send L with ``reason`` for every registration of ``token`` on an
        open connection, and forget them; how many were sent."""
        n = 0
        keep = []
        for fc, t, key in self.registered:
            if t != token:
                keep.append((fc, t, key))
                continue
            if not fc.closed.is_set():
                fc.send(proto.encode_lost(t, reason, key.encode()))
                n += 1
        self.registered = keep
        return n

    async def none(self, duration: float) -> None:
        """Assert that no request arrives within duration."""
        try:
            r = await asyncio.wait_for(self.reqs.get(), duration)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected request {chr(r.op)} id={r.id} key={r.key!r}")

    def drain(self) -> list[FReq]:
        """The requests read and not yet taken."""
        out = []
        while not self.reqs.empty():
            out.append(self.reqs.get_nowait())
        return out

    def open_conns(self) -> int:
        """Connections not closed."""
        return sum(1 for c in self.conns if not c.closed.is_set())

    async def close(self) -> None:
        """Stop listening and close every connection."""
        if self.server is not None:
            self.server.close()
        for c in self.conns:
            c.close()
        if self.server is not None:
            await self.server.wait_closed()


# The frame-aware fault proxy.


@dataclass
class Seen:
    """A frame the proxy forwarded or dropped."""

    conn: int
    dir: str  # "c2s" or "s2c"
    op: int
    id: int
    key: str
    at: float
    token: int = 0


@dataclass
class Proxy:
    """A TCP proxy to ``target`` that parses frames in both directions and
    records them in ``seen``. ``on_request(conn_index, req)`` may return
    "forward" (default), "drop" (close the client's connection without
    forwarding) or "forward_then_drop"; ``delay_response(conn_index, resp)``
    returns seconds to hold an answer (later answers wait behind it).
    ``ssl`` makes it TLS-terminating. "forward_then_drop" drops the
    server's answers on that connection from then on."""

    target: str
    on_request: Callable[[int, proto.Request], str] | None = None
    delay_response: Callable[[int, proto.Response], float] | None = None
    ssl: ssl.SSLContext | None = None
    seen: list[Seen] = field(default_factory=list)
    accepted: int = 0
    handshake_failures: int = 0
    addr: str = ""
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _writers: list[asyncio.StreamWriter] = field(default_factory=list)
    _mute: set[int] = field(default_factory=set)  # connections whose answers are dropped

    async def start(self) -> Proxy:
        """Listen on a free port."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.ssl)
        self.addr = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    def requests(self, op: int | None = None) -> list[Seen]:
        """Client-to-server frames seen, of op if given."""
        return [s for s in self.seen if s.dir == "c2s" and (op is None or s.op == op)]

    def responses(self, op: int | None = None) -> list[Seen]:
        """Server-to-client frames seen, of op if given."""
        return [s for s in self.seen if s.dir == "s2c" and (op is None or s.op == op)]

    async def _serve(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        idx = self.accepted
        self.accepted += 1
        host, port = self.target.rsplit(":", 1)
        try:
            sr, sw = await asyncio.open_connection(host, int(port))
        except OSError:
            cw.transport.abort()
            return
        self._writers += [cw, sw]

        def kill() -> None:
            cw.transport.abort()
            sw.transport.abort()

        async def c2s() -> None:
            buf = b""
            while True:
                data = await cr.read(65536)
                if not data:
                    break
                buf += data
                pos = 0
                while True:
                    try:
                        f = proto.parse_request(buf, pos)
                    except proto.FrameError:
                        sw.write(buf[pos:])
                        pos = len(buf)
                        break
                    if f is None:
                        break
                    end, r, _ = f
                    frame = buf[pos:end]
                    pos = end
                    act = self.on_request(idx, r) if self.on_request else "forward"
                    self.seen.append(Seen(idx, "c2s", r.op, r.id, r.key.decode("utf-8", "replace"), time.monotonic()))
                    if act == "drop":
                        kill()
                        return
                    if act == "forward_then_drop":
                        self._mute.add(idx)  # the answer never reaches the client
                    sw.write(frame)
                    if act == "forward_then_drop":
                        await sw.drain()
                        await asyncio.sleep(0.05)  # let the server read it first
                        kill()
                        return
                buf = buf[pos:]
            kill()

        out: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def s2c_read() -> None:
            buf = b""
            while True:
                data = await sr.read(65536)
                if not data:
                    break
                buf += data
                pos = 0
                while True:
                    try:
                        f = proto.parse_response(buf, pos)
                    except proto.FrameError:
                        out.put_nowait((0.0, buf[pos:]))
                        pos = len(buf)
                        break
                    if f is None:
                        break
                    end, resp = f
                    frame = buf[pos:end]
                    pos = end
                    d = self.delay_response(idx, resp) if self.delay_response else 0.0
                    self.seen.append(
                        Seen(idx, "s2c", resp.op, resp.id, resp.tail.decode("utf-8", "replace"), time.monotonic(), resp.token)
                    )
                    if idx not in self._mute:
                        out.put_nowait((time.monotonic() + d, frame))
                buf = buf[pos:]
            out.put_nowait((-1.0, b""))

        async def s2c_write() -> None:
            while True:
                at, frame = await out.get()
                if at < 0:
                    break
                wait = at - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                cw.write(frame)
            kill()

        ts = [asyncio.ensure_future(x()) for x in (c2s, s2c_read, s2c_write)]
        for t in ts:
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)
        try:
            await asyncio.gather(*ts, return_exceptions=True)
        finally:
            kill()

    async def close(self) -> None:
        """Stop listening and cut every connection."""
        if self._server is not None:
            self._server.close()
        for w in self._writers:
            w.transport.abort()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()


# TLS material, made with the openssl command.


@dataclass
class Certs:
    """A CA, a server certificate for 127.0.0.1 (IP SAN) and a client
    certificate with Common Name ``client_cn``, all signed by the CA; and a
    second, unrelated CA."""

    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    client_cn: str = "orders"


def make_certs(d: Path) -> Certs:
    """Generate the certificates of :class:`Certs` in d."""
    d.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    for ca in ("ca", "other-ca"):
        run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
            "-subj", f"/CN=lockd test {ca}", "-keyout", f"{ca}.key", "-out", f"{ca}.pem")
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, cn in (("server", "127.0.0.1"), ("client", "orders")):
        run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", f"/CN={cn}",
            "-keyout", f"{name}.key", "-out", f"{name}.csr")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem")
    return Certs(d, d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key", d / "other-ca.pem")


def loop_lag(when: float) -> Callable[[], float]:
    """Schedule a callback on the running loop at ``when`` (loop clock) and
    return a function telling how late it ran, in seconds (if it has not
    run yet: how late it is now). A timing assertion adds it to its bound:
    on a loaded machine the loop itself runs late, and the client cannot
    answer before the loop runs it."""
    loop = asyncio.get_running_loop()
    ran: list[float] = []
    loop.call_at(when, lambda: ran.append(loop.time()))

    def lag() -> float:
        return max(0.0, (ran[0] if ran else loop.time()) - when)

    return lag


async def wait_for(what: str, cond: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll cond every 5 ms until it holds; fail after timeout."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)
