"""Which processes on this machine run an embedded engine, so a second one can say what it costs before it starts.

llama.cpp's CPU threads busy-wait for each other at every step of a decode. Two engines that each take every core
therefore do not share the CPU at half speed each: on a 2-core AMD EPYC (Zen 5), `gym-tf optimize` on the quickstart
set beside a learning-effect benchmark decoded 12 rollouts in 12 minutes, where alone it finishes its 32 rollouts and
its learning in 2 min 19 s. Each engine leaves a claim file in the cache (its process, its host, its threads) while it
runs; an engine whose threads and the others' add up to more than the machine's cores warns. Claims of this host's
processes that have gone (killed, crashed) are removed when seen; another host's claims (a cache shared over NFS,
or mounted into containers) are not this machine's business.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
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


def _threads(claim: Path) -> int:
    try:
        return int(claim.read_text().strip())
    except (OSError, ValueError):  # being written, or not a claim: count it as one thread
        return 1


def engines_elsewhere(cache: Path) -> dict[int, int]:
    """The other live processes on this host that hold engine claims in `cache`: pid -> the threads they claim.
    A claim `<pid>-<id>@<host>.engine` of this host whose process is gone is removed."""
    folder, host = _folder(cache), socket.gethostname()
    found: dict[int, int] = {}
    for claim in folder.glob(f"*{SUFFIX}") if folder.is_dir() else []:
        who, _, claim_host = claim.name[:-len(SUFFIX)].rpartition("@")
        pid_text = who.split("-", 1)[0]
        if claim_host != host or not pid_text.isdigit() or int(pid_text) == os.getpid():
            continue
        if _alive(int(pid_text)):
            found[int(pid_text)] = found.get(int(pid_text), 0) + _threads(claim)
        else:
            with contextlib.suppress(OSError):  # another user's, or a read-only cache: left for its owner
                claim.unlink(missing_ok=True)
    return found


class CoreClaim:
    """This process runs an engine on `threads` threads: say so to the next, and warn if this one and the others
    claim more threads than the machine has cores. The claim is written before the others are read, so of two
    engines started at the same moment at least the later reader sees the other."""

    def __init__(self, cache: Path, threads: int):
        self.path = _folder(cache) / f"{os.getpid()}-{uuid.uuid4().hex[:8]}@{socket.gethostname()}{SUFFIX}"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(f"{threads}\n")
            atexit.register(self.release)
        except OSError as error:  # a read-only cache: the engine runs, only the next one is not told
            logger.info("no engine claim written to %s: %s", self.path.parent, error)
        others = engines_elsewhere(cache)
        claimed, cores = threads + sum(others.values()), os.cpu_count() or 1
        if others and claimed > cores:
            logger.warning(
                "gym-tf's embedded engine already runs on this machine (pid %s), and with this one the engines "
                "claim %d threads on %d cores; engines sharing cores slow each other several-fold (llama.cpp's "
                "threads wait for each other by spinning): let one finish first, or point both at one model server "
                "with --base-url", ", ".join(map(str, sorted(others))), claimed, cores)

    def release(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)
