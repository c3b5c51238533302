"""Which processes on this machine run an embedded engine, so a second one can say what it costs before it starts.

llama.cpp's CPU threads busy-wait for each other at every step of a decode. Two engines that each take every core
therefore do not share the CPU at half speed each: on a 2-core AMD EPYC (Zen 5), `gym-tf optimize` on the quickstart
set beside a learning-effect benchmark decoded 12 rollouts in 12 minutes, where alone it finishes its 32 rollouts and
its learning in 2 min 19 s. Each engine leaves a claim file in the cache while it runs; an engine that starts while
another process holds one warns. Claims of processes that have gone (killed, crashed) are removed when seen.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import uuid
from pathlib import Path

logger = logging.getLogger(__name__)

SUFFIX = ".engine"


def _folder(cache: Path) -> Path:
    return cache / "engines"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: is there such a process (POSIX; the embedded engine's wheels are Linux ones)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def engines_elsewhere(cache: Path) -> list[int]:
    """The other live processes that hold an engine claim in `cache`, by pid; claims of dead processes are removed."""
    folder = _folder(cache)
    pids = set()
    for claim in folder.glob(f"*{SUFFIX}") if folder.is_dir() else []:
        pid_text = claim.name.split("-", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid():
            continue
        if _alive(int(pid_text)):
            pids.add(int(pid_text))
        else:
            with contextlib.suppress(OSError):  # another user's, or a read-only cache: left for its owner
                claim.unlink(missing_ok=True)
    return sorted(pids)


class CoreClaim:
    """This process runs an engine on `threads` threads: warn if another process does too, and say so to the next."""

    def __init__(self, cache: Path, threads: int):
        others = engines_elsewhere(cache)
        if others:
            logger.warning(
                "another process (pid %s) runs gym-tf's embedded engine on this machine; two engines on the same "
                "cores slow each other several-fold (llama.cpp's threads wait for each other by spinning): let one "
                "finish first, or point both at one model server with --base-url",
                ", ".join(map(str, others)))
        self.path = _folder(cache) / f"{os.getpid()}-{uuid.uuid4().hex[:8]}{SUFFIX}"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(f"{threads}\n")
        except OSError as error:  # a read-only cache: the engine runs, only the next one is not told
            logger.info("no engine claim written to %s: %s", self.path.parent, error)
            return
        atexit.register(self.release)

    def release(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)
