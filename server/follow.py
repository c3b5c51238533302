"""A serving replica with no shared disk: it serves what a primary serves, taken from IPFS and verified first.

The primary (any `gym-tf serve` on the workspace where versions are promoted) reports its served version and that
version's published manifest at `GET /v1/library`. A replica started with `--follow PRIMARY_URL` asks every
`interval_s` seconds; when the manifest changed it fetches it from IPFS (a gateway, a Kubo node or the embedded
node), checks everything `gym-tf fetch` checks (CIDs, the signature against `--signer`, the inclusion proof),
imports it into its own workspace and promotes it there, which the running server picks up on its next request.
So a promotion reaches every replica within one interval plus one fetch, and only once it has been published:
a version the primary serves unpublished is not followed (the replica logs why and keeps what it serves). A
manifest that fails a check is refused and never retried; the replica keeps serving its current version.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

from gym_tf.errors import GymTFError, StoreError
from gym_tf.publishing import fetch
from gym_tf.store import RunStore
from ledger.errors import LedgerError, TransportError

logger = logging.getLogger(__name__)


class Follower:
    def __init__(self, store: RunStore, primary_url: str, ipfs: Any, signer: str, api_key: str | None = None,
                 interval_s: float = 5.0, transport: httpx.AsyncBaseTransport | None = None):
        self.store = store
        self.url = primary_url.rstrip("/") + "/library"
        self.ipfs = ipfs
        self.signer = signer
        self.interval_s = interval_s
        self.client = httpx.AsyncClient(timeout=30, transport=transport,
                                        headers={"Authorization": f"Bearer {api_key}"} if api_key else None)
        self.applied: str | None = None  # the manifest this replica serves
        self.refused: set[str] = set()  # manifests that failed a check: never fetched again
        self.last_problem: str | None = None

    async def poll(self) -> str | None:
        """One look at the primary; returns the version newly promoted here, if any."""
        reply = await self.client.get(self.url)
        reply.raise_for_status()
        served = reply.json()
        manifest = served.get("manifest")
        if not manifest:
            self._problem(f"the primary serves {served.get('version')}, which it has not published: not followed")
            return None
        if manifest == self.applied or manifest in self.refused:
            return None
        try:
            # fetch blocks (IPFS calls, SQLite writes): a thread, with a connection of its own
            version, _ = await asyncio.to_thread(self._fetch, manifest)
            self.store.promote(version.id)
        except (TransportError, StoreError) as exc:  # not reachable now, or the workspace busy or full: ask again
            self._problem(f"cannot fetch manifest {manifest}: {exc}")
            return None
        except (LedgerError, GymTFError) as exc:  # it failed a check: refused for good
            self.refused.add(manifest)
            self._problem(f"refused manifest {manifest}: {exc}")
            return None
        self.applied, self.last_problem = manifest, None
        logger.warning("following %s: now serving %s (manifest %s)", self.url, version.id, manifest)
        return version.id

    def _fetch(self, manifest: str):
        store = RunStore(self.store.root)
        try:
            return fetch(store, manifest, self.ipfs, self.signer)
        finally:
            store.close()

    async def run(self) -> None:
        while True:
            try:
                await self.poll()
            except (httpx.HTTPError, ValueError) as exc:  # the primary away or odd: keep serving, ask again
                self._problem(f"cannot read {self.url}: {exc.__class__.__name__}: {exc}")
            except Exception as exc:  # noqa: BLE001 - anything else: a replica that stops asking would serve stale
                # versions for good, with no sign; the traceback is logged once, not every interval while it lasts
                self._problem(f"one poll failed: {exc.__class__.__name__}: {exc}", exc_info=True)
            await asyncio.sleep(self.interval_s)

    def _problem(self, text: str, exc_info: bool = False) -> None:
        if text != self.last_problem:
            logger.warning("following: %s", text, exc_info=exc_info)
        self.last_problem = text

    async def aclose(self) -> None:
        await self.client.aclose()
