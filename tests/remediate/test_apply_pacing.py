"""How apply paces session deletes: one at a time per target, and without --rate a pause after each that
leaves the gateway a quarter of its time (DELETE_DUTY), however long a delete takes there.

The 0.1.0 memory store scans every session on each delete, on the event loop that serves the rollouts,
so a delete's cost grows with the store. A scripted gateway stands in for it; the pacing is checked on a
fake clock that only moves when the gateway "works" or apply sleeps, so nothing here depends on how fast
the machine is.
"""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import pytest

from gatewayscope.config import Config, Policy, Target
from gatewayscope.remediate.apply import ApplyOptions, apply_plan
from gatewayscope.remediate.apply import protocol as apply_protocol
from gatewayscope.remediate.journal import Journal
from gatewayscope.remediate.plan import DELETE_DUTY, Action, Plan, session_fingerprint

URL = "http://gw.test:9090"
#: the traces' time: long past the idle threshold, so apply's live re-check finds them orphans
DAY_OLD = time.time() - 86400


class Clock:
    """A monotonic clock that moves only when told to: by ``advance``, or by ``sleep``, which also keeps each
    wait in ``waits``."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.lock = threading.Lock()
        self.waits: list[float] = []

    def __call__(self) -> float:
        with self.lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self.lock:
            self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.advance(seconds)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """apply's monotonic clock, replaced by a ``Clock`` (pass its ``sleep`` to apply)."""
    fake = Clock()
    monkeypatch.setattr(apply_protocol.time, "monotonic", fake)
    return fake


class Gateway:
    """One-trace sessions; a DELETE costs ``delete_cost`` (on the clock, or really slept), a read 1 ms."""

    def __init__(self, n: int, *, delete_cost: float, clock: Clock | None = None) -> None:
        self.sessions = {f"task:{i}": [f"t{i}"] for i in range(n)}
        self.delete_cost = delete_cost
        self.clock = clock
        self.in_flight = 0
        self.most_in_flight = 0
        self.deletes: list[tuple[float, float]] = []  # (start, end) on the clock
        self.lock = threading.Lock()

    def handler(self, request: httpx.Request) -> httpx.Response:
        path = unquote(request.url.path)
        sid = path[len("/sessions/"):].removesuffix("/traces")
        if request.method == "GET" and path.endswith("/traces"):
            if self.clock:
                self.clock.advance(0.001)
            return httpx.Response(200, json=[{"trace_id": t, "session_id": sid, "timestamp": DAY_OLD}
                                               for t in self.sessions.get(sid, [])])
        if request.method == "DELETE":
            with self.lock:
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
            start = self.clock() if self.clock else time.monotonic()
            if self.clock:
                self.clock.advance(self.delete_cost)
            else:
                time.sleep(self.delete_cost)
            with self.lock:
                self.in_flight -= 1
                deleted = len(self.sessions.pop(sid, []))
                self.deletes.append((start, self.clock() if self.clock else time.monotonic()))
            return httpx.Response(200, json={"deleted": deleted})
        return httpx.Response(404, json={"detail": "Not Found"})


def plan_for(gateway: Gateway) -> Plan:
    actions = [
        Action(id=f"a{i:05d}", kind="session_delete", target="gw", subject=sid, before={"trace_count": 1},
               after={"trace_count": 0}, reason="confirmed orphan", fingerprint=session_fingerprint(1, ids),
               details={"trace_ids": ids})
        for i, (sid, ids) in enumerate(sorted(gateway.sessions.items()), start=1)
    ]
    plan = Plan(created_at=1.0, targets=[{"name": "gw", "kind": "rllm", "address": URL, "access": "rest",
                                          "capabilities": {}}], actions=actions, policy={})
    plan.id = plan.compute_id()
    return plan


def run(gateway: Gateway, tmp_path: Path, **options: Any) -> Any:
    config = Config(targets=[Target(name="gw", kind="rllm", url=URL)], policy=Policy())
    return apply_plan(plan_for(gateway), config, options=ApplyOptions(write=True, allow_delete=True, **options),
                      journal=Journal(tmp_path / "j.jsonl"), transports={"gw": httpx.MockTransport(gateway.handler)})


def test_deletes_on_one_target_never_overlap(tmp_path: Path) -> None:
    """Concurrent deletes would only queue on the gateway's one event loop, and a call of the gateway's own
    traffic would wait behind all of them: even with --concurrency 4 one delete is in flight at a time."""
    gateway = Gateway(12, delete_cost=0.005)
    report = run(gateway, tmp_path, concurrency=4, sleep=lambda _s: None)
    assert [r.outcome for r in report.results] == ["done"] * 12
    assert not gateway.sessions
    assert gateway.most_in_flight == 1


@pytest.mark.parametrize("delete_cost", [0.030, 0.300, 3.0])
def test_without_rate_deletes_take_at_most_three_quarters_of_the_gateway(clock: Clock, tmp_path: Path,
                                                                           delete_cost: float) -> None:
    gateway = Gateway(20, delete_cost=delete_cost, clock=clock)
    report = run(gateway, tmp_path, concurrency=1, sleep=clock.sleep)
    assert [r.outcome for r in report.results] == ["done"] * 20
    # a turn is the 1 ms re-read right before the delete plus the delete; the pause after it is a third of
    # the turn (less the 1 ms first read of the next action, which already passed) ...
    turn = delete_cost + 0.001
    assert clock.waits == pytest.approx([turn / 3 - 0.001] * 19)
    # ... so from one turn's start to the next, the turn takes three quarters of the gateway's time
    starts = [start for start, _ in gateway.deletes]
    cycles = [b - a for a, b in itertools.pairwise(starts)]
    assert [turn / cycle for cycle in cycles] == pytest.approx([DELETE_DUTY] * 19)


def test_with_rate_the_rate_paces_the_deletes_and_adds_no_pause(clock: Clock, tmp_path: Path) -> None:
    gateway = Gateway(5, delete_cost=0.030, clock=clock)
    report = run(gateway, tmp_path, concurrency=1, rate=4.0, sleep=clock.sleep)
    assert [r.outcome for r in report.results] == ["done"] * 5
    starts = [start for start, _ in gateway.deletes]
    # 250 ms apart, start to start: the limiter's spacing and nothing on top
    assert [b - a for a, b in itertools.pairwise(starts)] == pytest.approx([0.25] * 4)
