"""Apply a plan, exactly as planned, under the safety protocol (docs/remediation.md).

The only code in gatewayscope that writes to a gateway. Its modules, in reading order: :mod:`.results` (what
an apply reports), :mod:`.protocol` (the write protocol and what the executors share), :mod:`.bifrost` and
:mod:`.sessions` (the executors, one per action kind, named after it) and :mod:`.driver` (:func:`apply_plan`).

* **Outcomes** are values (:class:`Settled`, an :data:`Outcome` and why): every executor returns one, none
  raises one.
* **The write protocol** (``protocol._write``) is the one way a write is sent, for a single subject and for a
  batch of session deletes alike: it journals the attempt, sends, and decides what an answer means.
  After a 5xx it waits 250, 750 and 2,000 ms in turn, re-reads (gone or already fixed settles it), and
  only then sends again, built from that read; a write with no answer is read back and never sent
  again; a 4xx is a refusal.
* **The executors** (one per action kind) re-read their subject right before writing: gone -> ``gone`` (a
  Bifrost PUT is an upsert and would recreate it), already at the target -> ``already-done``, changed in
  anything but what the action changes -> ``stale``. Writes are built from the fresh read, never with a
  secret a listing masked, never with ``keys``. A session delete re-establishes its orphan rule from the
  live store right before it deletes (``sessions._recheck``).
* **The driver** (:func:`apply_plan`) runs four steps a reader can follow: validate the plan against the
  config, take the apply lock and resume from the journal, then run the phases in plan order (tombstones
  before deletes) with bounded concurrency (a Bifrost target's pool resizes within its memory headroom,
  ``driver._shrink_limits``), a rate limit and deletes paced per target, while the error
  budget (``max_errors``) can stop new actions; every attempt and outcome is journaled, and the report
  ends with one tally line.
"""

from __future__ import annotations

from gatewayscope.remediate.apply.bifrost import (
    pool_shrink,
    pool_write_body,
    posture_fix,
    record_delete,
)
from gatewayscope.remediate.apply.driver import apply_plan
from gatewayscope.remediate.apply.protocol import checked_policy, stricter_than_planned
from gatewayscope.remediate.apply.results import (
    CONDITIONAL_DELETE_PATH,
    DELETE_BATCH,
    OUTCOMES,
    POOL_WRITE_FIELDS,
    POOL_WRITE_TIMEOUT,
    RETRY_SCHEDULE,
    SUCCESS_OUTCOMES,
    ActionResult,
    ApplyOptions,
    ApplyReport,
    Outcome,
    Settled,
)
from gatewayscope.remediate.apply.sessions import (
    session_delete,
    session_delete_batch,
    session_deletes_sqlite,
    tombstone_backfill,
)

__all__ = [
    "CONDITIONAL_DELETE_PATH",
    "DELETE_BATCH",
    "OUTCOMES",
    "POOL_WRITE_FIELDS",
    "POOL_WRITE_TIMEOUT",
    "RETRY_SCHEDULE",
    "SUCCESS_OUTCOMES",
    "ActionResult",
    "ApplyOptions",
    "ApplyReport",
    "Outcome",
    "Settled",
    "apply_plan",
    "checked_policy",
    "pool_shrink",
    "pool_write_body",
    "posture_fix",
    "record_delete",
    "session_delete",
    "session_delete_batch",
    "session_deletes_sqlite",
    "stricter_than_planned",
    "tombstone_backfill",
]
