"""`gym-tf serve --record`: each answered request is kept in the workspace, written off the request path.

The request path appends each streamed chunk to a list, reads the response id from the first chunk, and, once the
response is complete, adds one job to a batch. Every 50 ms the event loop pickles the batch and hands it, without
blocking, to a writer *process* (gym_tf.traffic_writer) over a pipe. The writer parses the streamed events into
answers, applies the redaction hook, inserts the batch in one transaction, and applies the retention limits.

Why a process and not a thread: a writer thread in the server shares its GIL. On a loaded machine every hand-over
of the GIL between the event loop and a writer waking up for SQLite costs the event loop a scheduling delay;
measured with a thread (benchmarks/recording_overhead.py, 64 streams, 2 busy cores) p50 rose by 70 to 170 ms while
an A/A arm differed by 10 ms. The process shares nothing with the event loop but a pipe.

Feedback reads and writes go through the same writer, after every exchange handed over before them, so feedback
posted right after a response finds it.

Kill switch: while the file `WORKSPACE/recording.off` exists nothing is recorded (`gym-tf traffic pause` makes
it, `gym-tf traffic resume` removes it); the server looks at most once a second.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import pickle
import re
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from gym_tf.errors import UnknownChoice
from gym_tf.traffic import Feedback, TrafficLog
from gym_tf.traffic_writer import FRAME as _FRAME, RecordSettings, load_redactor

KILL_FILE = "recording.off"
_ID = re.compile(rb'"id"\s*:\s*"([^"\\]{1,256})"')


class RecorderDown(RuntimeError):
    """The writer process is gone: nothing more is recorded, feedback cannot be taken."""


class Recorder:
    """The server's side: the batch, the pipe to the writer process, and the open streams (id -> done event)."""

    def __init__(self, workspace: str | Path, settings: RecordSettings = RecordSettings()):
        self.settings = settings
        load_redactor(settings.redact)  # a bad hook fails at start, here, not later in the writer
        self.workspace = Path(workspace)
        self.kill_file = self.workspace / KILL_FILE
        TrafficLog(self.workspace).close()  # the tables exist before the first request
        self.writer = subprocess.Popen(
            [sys.executable, "-m", "gym_tf.traffic_writer", str(self.workspace), json.dumps(asdict(settings))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": _pythonpath()})
        for pipe in (self.writer.stdin, self.writer.stdout):
            os.set_blocking(pipe.fileno(), False)  # the event loop never waits on the writer
        self.open_streams: dict[tuple[str, str], asyncio.Event] = {}
        self.dropped = 0
        self._batch: list[tuple] = []
        self._out = bytearray()
        self._in = bytearray()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flushing = False
        self._waiting: dict[int, asyncio.Future] = {}
        self._ids = itertools.count()
        self._paused, self._checked = False, 0.0
        self._writer_gone = False

    # --- the request path -----------------------------------------------------------------------------------------

    def active(self) -> bool:
        now = time.monotonic()
        if now - self._checked > 1.0:
            self._paused, self._checked = self.kill_file.exists(), now
        return not self._paused

    def completed(self, meta: dict[str, Any], reply: dict[str, Any], latency_s: float) -> None:
        """A non-streaming answer: into the batch (the writer does the rest)."""
        self._add(("record", meta, reply, None, latency_s))

    def tape(self, meta: dict[str, Any], start: float) -> "Tape":
        """A stream about to be relayed: the server puts each chunk on the tape, then closes it (see Tape)."""
        return Tape(self, meta, start)

    def _add(self, job: tuple) -> None:
        if len(self._out) > self.settings.max_pending_bytes or self._writer_gone:
            self.dropped += 1  # serving never waits for the disk: a writer this far behind (or gone) loses exchanges
            return
        self._batch.append(job)
        if not self._flushing:
            self._loop = self._loop or asyncio.get_running_loop()
            self._flushing = True
            self._loop.call_later(self.settings.flush_s, self._flush)

    def _flush(self) -> None:
        self._flushing = False
        # asked here, once a hand-over, not for every exchange: on some kernels (gVisor) each ask is a costly syscall
        self._writer_gone = self.writer.poll() is not None
        if self._writer_gone:
            self.dropped += sum(job[0] == "record" for job in self._batch)
            self._batch = [job for job in self._batch if job[0] != "record"]  # a call still learns the writer is gone
        if self._batch:
            payload = pickle.dumps(self._batch, protocol=pickle.HIGHEST_PROTOCOL)
            self._batch = []
            self._out += _FRAME.pack(len(payload)) + payload
            self._drain()

    def _drain(self) -> None:
        """Write what the pipe takes now; the event loop calls again when it can take more."""
        fd = self.writer.stdin.fileno()
        try:
            written = os.write(fd, self._out) if self._out else 0
        except BlockingIOError:
            written = 0
        except BrokenPipeError:
            self._out.clear()
            written = 0
        del self._out[:written]
        if self._out:
            self._loop.add_writer(fd, self._drain)
        else:
            self._loop.remove_writer(fd)

    # --- feedback: through the writer, after everything handed over before it -------------------------------------

    async def feedback(self, tenant: str, feedback: Feedback, key: str, wait_s: float = 30.0) -> bool:
        """Record feedback; LookupError for a response id this tenant never got. A stream still open under that id
        is waited for (up to `wait_s`): a client may post feedback the moment it read [DONE]."""
        done = self.open_streams.get((tenant, feedback.response_id))
        if done is not None:
            await asyncio.wait_for(done.wait(), wait_s)
        return await self.call("feedback", tenant, feedback.model_dump(), key)

    async def sync(self) -> None:
        """Wait until the writer has stored everything handed to it before this call."""
        await self.call("sync")

    async def call(self, name: str, *args: Any) -> Any:
        if self.writer.poll() is not None:
            raise RecorderDown(f"the recording writer exited with {self.writer.returncode}")
        self._loop = self._loop or asyncio.get_running_loop()
        if not self._waiting:
            self._loop.add_reader(self.writer.stdout.fileno(), self._read)
        ident = next(self._ids)
        future = self._waiting[ident] = self._loop.create_future()
        self._batch.append(("call", ident, name, args))
        self._flush()  # at once: someone is waiting
        return await future

    def _read(self) -> None:
        fd = self.writer.stdout.fileno()
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if not data:  # the writer is gone: everyone waiting learns it
            self._loop.remove_reader(fd)
            for future in self._waiting.values():
                if not future.done():
                    future.set_exception(RecorderDown("the recording writer exited"))
            self._waiting.clear()
            return
        self._in += data
        while len(self._in) >= 4 and len(self._in) >= 4 + (size := _FRAME.unpack_from(self._in)[0]):
            ident, error, result = pickle.loads(bytes(self._in[4 : 4 + size]))
            del self._in[: 4 + size]
            future = self._waiting.pop(ident, None)
            if future is not None and not future.done():
                failure = {"lookup": LookupError, "choice": UnknownChoice}.get(error, RecorderDown)
                future.set_exception(failure(result)) if error else future.set_result(result)
        if not self._waiting:
            self._loop.remove_reader(fd)

    def close(self, timeout: float = 10.0) -> None:
        """Hand over what is left, then let the writer finish and exit. Closing twice is harmless."""
        if self.writer.stdin.closed:
            return
        if self._loop is not None:
            self._loop.remove_writer(self.writer.stdin.fileno())
        payload = pickle.dumps(self._batch + [("stop",)])
        self._batch = []
        try:
            os.set_blocking(self.writer.stdin.fileno(), True)
            self.writer.stdin.write(bytes(self._out) + _FRAME.pack(len(payload)) + payload)
            self.writer.stdin.close()
        except BrokenPipeError:
            pass
        try:
            self.writer.wait(timeout)
        except subprocess.TimeoutExpired:
            self.writer.kill()
            self.writer.wait()


class Tape:
    """One stream's bytes as they go out, kept once the stream is complete: it ended, or [DONE] went out (clients
    such as the openai SDK close the connection at [DONE], often before the upstream's own end arrives). A client
    gone mid-stream leaves nothing.

    The server's relay loop (`relay_onto`) calls `add(chunk)`: a tape is no generator of its own, since a layer of
    async generator costs every chunk of every stream more than all the rest of recording. The first chunk that
    names the response id opens the stream to feedback; from then on `add` is the list's own append."""

    def __init__(self, recorder: Recorder, meta: dict[str, Any], start: float):
        self.recorder, self.meta, self.start = recorder, meta, start
        self.chunks: list[bytes] = []
        self.key: tuple[str, str] | None = None
        self.add = self._until_id

    def _until_id(self, chunk: bytes) -> None:
        self.chunks.append(chunk)
        found = _ID.search(chunk)
        if found:
            self.key = (self.meta["tenant"], found.group(1).decode())
            self.recorder.open_streams[self.key] = asyncio.Event()
            self.add = self.chunks.append

    def close(self, ended: bool) -> None:
        """The stream is over (`ended`: the upstream's end was relayed). Called once, from the relay's finally."""
        chunks = self.chunks
        # [DONE] is a stream's last event: if it went out, it is in the last chunk, or the last two where the
        # network split it
        if ended or b"data: [DONE]" in b"".join(chunks[-2:]):
            self.recorder._add(("record", self.meta, None, b"".join(chunks), time.perf_counter() - self.start))
        if self.key is not None:
            done = self.recorder.open_streams.pop(self.key, None)
            if done is not None:
                done.set()


async def relay_onto(events: AsyncIterator[bytes], tape: Tape | None,
                     finished: Callable[[], None]) -> AsyncIterator[bytes]:
    """The server's relay loop for a stream: each chunk onto the tape (when recording), then to the client; the tape
    closed and `finished` called once the stream is over, however it ends."""
    ended = False
    try:
        async for chunk in events:
            if tape is not None:
                tape.add(chunk)
            yield chunk
        ended = True
    finally:
        if tape is not None:
            tape.close(ended)
        finished()


def _pythonpath() -> str:
    """The writer imports what this process imports: this very checkout first, then this process's path (where
    the redaction hook's module was found)."""
    here = str(Path(__file__).resolve().parents[1])
    return os.pathsep.join([here, *[p or os.getcwd() for p in sys.path]])
