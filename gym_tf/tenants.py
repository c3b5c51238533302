"""Tenants: API keys (or groups of keys) that each own a library line, their traffic and their feedback.

A tenants file (TOML) names each tenant's keys:

    [tenant.acme]
    keys = ["sk-acme-1", "sk-acme-2"]

    [tenant.globex]
    keys = ["sk-globex"]

Keys given to `gym-tf serve --api-key` but named in no tenant (and every request when no key is required) belong to
the shared `default` tenant, whose served pointer is the one `gym-tf library promote` moves. A tenant's served
pointer is the `serving` row of its name; a tenant that has none is served the empty library, never another's.

A version belongs to the tenant whose from-traffic run made it; versions of other runs (optimize on a dataset,
imports, fetches) belong to `default`; a version with no items belongs to everyone.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

from gym_tf.errors import ConfigError
from gym_tf.store import RunStore
from gym_tf.traffic import DEFAULT_TENANT

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
PUBLIC = "*"


def load_tenants(path: str | Path) -> dict[str, str]:
    """The file's keys, each mapped to its tenant's name (ConfigError naming the rule a file breaks)."""
    try:
        document = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the tenants file: {exc}") from None
    tenants = document.get("tenant")
    if not isinstance(tenants, dict) or not tenants:
        raise ConfigError(f"{path}: no [tenant.NAME] tables")
    owners: dict[str, str] = {}
    for name, table in tenants.items():
        if not NAME.fullmatch(name) or name == DEFAULT_TENANT:
            raise ConfigError(f"{path}: tenant name {name!r} must be letters, digits, _ . - and not {DEFAULT_TENANT!r}")
        keys = table.get("keys") if isinstance(table, dict) else None
        if not isinstance(keys, list) or not keys or not all(isinstance(k, str) and k for k in keys):
            raise ConfigError(f"{path}: tenant {name!r} needs `keys`, a list of non-empty strings")
        for key in keys:
            if key in owners and owners[key] != name:
                raise ConfigError(f"{path}: a key is listed under both {owners[key]!r} and {name!r}")
            owners[key] = name
    return owners


def check_tenant(name: str) -> str:
    if not NAME.fullmatch(name):
        raise ConfigError(f"tenant name {name!r} must be letters, digits, _ . -")
    return name


def version_owner(store: RunStore, version_id: str) -> str:
    """The tenant a recorded version belongs to (`*` for a version with no items)."""
    row = store.db.conn.execute("select run_id, content from versions where id = ?", [version_id]).fetchone()
    if row is None:
        return DEFAULT_TENANT
    run_id, content = row
    items = json.loads(content).get("items")
    if not items:
        return PUBLIC
    if not run_id:
        # a run's start (its library re-rendered under the run's policy) or an import: the items are what count,
        # so it belongs to the run that made those very items, if any
        for other_run, other in store.db.conn.execute("select run_id, content from versions where run_id != ''"):
            if json.loads(other).get("items") == items:
                return _run_owner(store, other_run)
        return DEFAULT_TENANT
    return _run_owner(store, run_id)


def _run_owner(store: RunStore, run_id: str) -> str:
    config = store.db.conn.execute("select config from runs where id = ?", [run_id]).fetchone()
    traffic = json.loads(config[0]).get("traffic") if config else None
    return traffic["tenant"] if traffic else DEFAULT_TENANT


def may_serve(store: RunStore, version_id: str, tenant: str) -> bool:
    return version_owner(store, version_id) in (tenant, PUBLIC)
