"""What an apply reports: the outcome of each action, the tally, and the options it runs with."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gatewayscope.remediate.journal import FINAL_OUTCOMES

#: how an action ended: one of OUTCOMES (what the tally counts), "would-write" in a dry run, or "skipped" (not run)
Outcome = Literal["done", "refused", "unconfirmed", "gone", "stale", "already-done", "would-write", "skipped"]

#: the outcomes an action that ran ends with, in the tally line's order
OUTCOMES: tuple[Outcome, ...] = FINAL_OUTCOMES  # type: ignore[assignment]
SUCCESS_OUTCOMES = frozenset({"done", "already-done"})
#: waits after a 5xx before each re-read
RETRY_SCHEDULE = (0.25, 0.75, 2.0)
#: DNS 5 s + upstream model listing 15 s + margin: how long a Bifrost pool write may take there
POOL_WRITE_TIMEOUT = 30.0
#: fields a pool write sends back from the fresh read; the rest PUT keeps when absent
POOL_WRITE_FIELDS = ("network_config", "custom_provider_config", "send_back_raw_request", "send_back_raw_response")
#: session ids per POST /sessions/batch_delete (gateways that have it)
DELETE_BATCH = 50
#: the guarded launcher's compare-and-delete: deletes only while the session's traces and tombstone are as given
CONDITIONAL_DELETE_PATH = "/guard/sessions/delete-if"


@dataclass
class ApplyOptions:
    #: really write (False: a dry run that reads but never writes)
    write: bool = False
    allow_delete: bool = False
    concurrency: int = 4
    #: writes per second over the whole apply (None = no limit; session deletes then keep to DELETE_DUTY)
    rate: float | None = None
    #: stop starting new actions after this many refused/unconfirmed ones (None = never)
    max_errors: int | None = None
    pool_write_timeout: float = POOL_WRITE_TIMEOUT
    retry_schedule: Sequence[float] = RETRY_SCHEDULE
    sleep: Callable[[float], None] = time.sleep
    #: without ``rate``: the share of a gateway's time its session deletes may take (default DELETE_DUTY)
    delete_duty: float | None = None
    #: asked before each action (and each SQLite transaction) starts: a sentence stops every action not yet
    #: started (skipped, open in the journal), None lets it run. Heal's kill switch, windows and blockers
    stop: Callable[[], str | None] | None = None


@dataclass(frozen=True)
class Settled:
    """An executor's verdict on its action: the :data:`Outcome` and why (the driver copies both into the
    action's :class:`ActionResult`)."""

    outcome: Outcome
    detail: str = ""


@dataclass
class ActionResult:
    action_id: str
    kind: str
    target: str
    subject: str
    outcome: str  # an Outcome
    detail: str = ""
    sends: int = 0


@dataclass
class ApplyReport:
    """What an apply did: ``str(report)`` is the tally line (a dry run's says what its checks found),
    ``report.counts`` the tally."""

    plan_id: str
    dry_run: bool
    results: list[ActionResult] = field(default_factory=list)
    #: outcomes settled by an earlier run of the same plan (from the journal)
    previous: list[ActionResult] = field(default_factory=list)
    already_applied: bool = False
    stopped_early: str | None = None
    #: per Bifrost target: how many pool resizes ran at once, and why (the memory-headroom rule)
    shrink_concurrency: dict[str, dict[str, Any]] = field(default_factory=dict)

    def tally(self) -> dict[str, int]:
        counts: dict[str, int] = {outcome: 0 for outcome in OUTCOMES}
        for result in [*self.previous, *self.results]:
            if result.outcome in counts:
                counts[result.outcome] += 1
        return counts

    @property
    def counts(self) -> dict[str, int]:
        """Actions per outcome, zeros included: ``{"done": 10, "refused": 0, ...}``."""
        return self.tally()

    def tally_line(self) -> str:
        """``<n> done, <n> refused, <n> unconfirmed, <n> gone, <n> stale, <n> already-done``, zeros included."""
        return ", ".join(f"{n} {outcome}" for outcome, n in self.tally().items())

    def __str__(self) -> str:
        if not self.dry_run:
            return self.tally_line()
        # a dry run sends nothing: its line counts what each check found, never "0 done"
        found: dict[str, int] = {}
        for result in self.results:
            found[result.outcome] = found.get(result.outcome, 0) + 1
        counted = ", ".join(f"{n} {outcome}" for outcome, n in sorted(found.items(), key=lambda item: -item[1]))
        return f"dry run, nothing was sent: {counted or 'no action'}"

    @property
    def skipped(self) -> list[ActionResult]:
        return [r for r in self.results if r.outcome == "skipped"]

    @property
    def exit_code(self) -> int:
        """0 when every action is done or already done (a dry run: when anything could be checked), else 1."""
        if self.dry_run:
            checked = [r for r in self.results if r.outcome != "unconfirmed"]
            return 1 if self.results and not checked else 0
        everything = [*self.previous, *self.results]
        return 0 if all(r.outcome in SUCCESS_OUTCOMES for r in everything) else 1
