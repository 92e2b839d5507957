"""What the guard's parts and the command line share without loading anything heavy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: seconds a request to a guarded gateway's /guard routes may take in all
DEFAULT_TIMEOUT = 10.0


@dataclass
class GuardStats:
    """The tombstone guard's figures for one trace store (memory launcher or SQLite triggers)."""

    tombstones: int
    capacity: int  # 0 = unlimited (SQLite) or disabled (memory, max_tombstones=0); see ``enabled``
    dropped_writes: int
    evicted: int = 0
    #: trace writes kept for a tombstoned id because they reached the gateway after its fence (new uses of the id)
    kept_after_fence: int = 0
    enabled: bool = True
    triggers_intact: bool | None = None  # SQLite only
    top_droppers: list[dict[str, Any]] = field(default_factory=list)  # [{"session_id", "dropped"}]
    #: the guard's orphan index: "ready" (scans read only the candidates from it), "building" (SQLite: the fill
    #: at install has not completed), "damaged" (SQLite: re-run install), "absent" (a guard without one: an
    #: older gatewayscope's, or a launcher over a store it did not start empty); None when not known
    index: str | None = None
