"""Session deletes through ``POST /sessions/batch_delete`` (upstream gateways have it; 0.1.0 does not).

A scripted gateway stands in here because no released rLLM gateway has the batch route; the same
protocol as a single delete must hold for a batch: re-read each session first, never resend after no
answer, re-read and resend only what is still there after a 5xx.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from urllib.parse import unquote

import httpx

from gatewayscope.config import Config, Policy, Target
from gatewayscope.remediate.apply import ApplyOptions, apply_plan
from gatewayscope.remediate.journal import Journal
from gatewayscope.remediate.plan import Action, Plan, session_fingerprint

URL = "http://gw.test:9090"
#: the traces' time: long past the idle threshold, so apply's live re-check finds them orphans
DAY_OLD = time.time() - 86400


class FakeGateway:
    """Sessions -> trace ids, a batch route, and faults on the batch route."""

    def __init__(self, sessions: dict[str, list[str]]) -> None:
        self.sessions = {k: list(v) for k, v in sessions.items()}
        self.batch_calls: list[list[str]] = []
        self.faults: list[str] = []  # "500", "timeout", "500-after-delete"
        self.on_read: dict[str, list[str]] = {}

    def handler(self, request: httpx.Request) -> httpx.Response:
        path = unquote(request.url.path)
        if request.method == "GET" and path.startswith("/sessions/") and path.endswith("/traces"):
            sid = path[len("/sessions/"):-len("/traces")]
            return httpx.Response(200, json=[{"trace_id": t, "session_id": sid, "timestamp": DAY_OLD}
                                               for t in self.sessions.get(sid, [])])
        if request.method == "POST" and path == "/sessions/batch_delete":
            ids = json.loads(request.content)["session_ids"]
            self.batch_calls.append(ids)
            fault = self.faults.pop(0) if self.faults else None
            if fault == "500":
                return httpx.Response(500, json={"error": "store busy"})
            deleted = sum(len(self.sessions.pop(sid, [])) for sid in ids)
            if fault == "timeout":
                raise httpx.ReadTimeout("no answer", request=request)
            if fault == "500-after-delete":
                return httpx.Response(500, json={"error": "answered badly"})
            return httpx.Response(200, json={"deleted": deleted})
        if request.method == "DELETE":
            raise AssertionError("a gateway with batch delete gets no single deletes")
        return httpx.Response(404, json={"detail": "Not Found"})


def plan_for(sessions: dict[str, list[str]]) -> Plan:
    actions = [
        Action(id=f"a{i:05d}", kind="session_delete", target="gw", subject=sid, before={"trace_count": len(ids)},
               after={"trace_count": 0}, reason="confirmed orphan", fingerprint=session_fingerprint(len(ids), ids),
               details={"trace_ids": sorted(ids)})
        for i, (sid, ids) in enumerate(sorted(sessions.items()), start=1)
    ]
    plan = Plan(created_at=1.0, targets=[{"name": "gw", "kind": "rllm", "address": URL, "access": "rest",
                                          "capabilities": {"batch_delete": True}}],
                actions=actions, policy={})
    plan.id = plan.compute_id()
    return plan


def run(gateway: FakeGateway, plan: Plan, tmp_path: Path, waits: list[float] | None = None):
    config = Config(targets=[Target(name="gw", kind="rllm", url=URL)], policy=Policy())
    options = ApplyOptions(write=True, allow_delete=True, rate=1e9,
                           sleep=(waits.append if waits is not None else (lambda _s: None)))
    return apply_plan(plan, config, options=options, journal=Journal(tmp_path / "j.jsonl"),
                      transports={"gw": httpx.MockTransport(gateway.handler)})


def orphans(n: int) -> dict[str, list[str]]:
    return {f"task:{i}": [f"t{i}"] for i in range(n)}


def test_one_batch_call_deletes_every_session_and_journals_each(tmp_path: Path) -> None:
    gateway = FakeGateway(orphans(5))
    report = run(gateway, plan_for(orphans(5)), tmp_path)
    assert [r.outcome for r in report.results] == ["done"] * 5
    assert gateway.batch_calls == [sorted(orphans(5))]
    assert not gateway.sessions
    events = Journal(tmp_path / "j.jsonl").read()
    assert sum(e["event"] == "attempt" for e in events) == 5
    assert sum(e["event"] == "outcome" and e["outcome"] == "done" for e in events) == 5


def test_a_changed_session_is_stale_and_left_out_of_the_batch(tmp_path: Path) -> None:
    planned = orphans(3)
    gateway = FakeGateway(planned)
    gateway.sessions["task:1"].append("a-new-trace")  # it came alive after planning
    report = run(gateway, plan_for(planned), tmp_path)
    outcomes = {r.subject: r.outcome for r in report.results}
    assert outcomes == {"task:0": "done", "task:1": "stale", "task:2": "done"}
    assert gateway.batch_calls == [["task:0", "task:2"]]
    assert gateway.sessions == {"task:1": ["t1", "a-new-trace"]}


def test_5xx_waits_rereads_and_resends_only_what_is_left(tmp_path: Path) -> None:
    gateway = FakeGateway(orphans(4))
    gateway.faults = ["500"]
    waits: list[float] = []
    report = run(gateway, plan_for(orphans(4)), tmp_path, waits)
    assert waits == [0.25]
    assert [r.outcome for r in report.results] == ["done"] * 4
    assert len(gateway.batch_calls) == 2 and all(r.sends == 2 for r in report.results)


def test_5xx_for_a_batch_that_landed_is_done_without_a_resend(tmp_path: Path) -> None:
    gateway = FakeGateway(orphans(3))
    gateway.faults = ["500-after-delete"]
    waits: list[float] = []
    report = run(gateway, plan_for(orphans(3)), tmp_path, waits)
    assert [r.outcome for r in report.results] == ["done"] * 3
    assert len(gateway.batch_calls) == 1 and waits == [0.25]


def test_no_answer_is_read_back_and_never_sent_again(tmp_path: Path) -> None:
    gateway = FakeGateway(orphans(3))
    gateway.faults = ["timeout"]
    report = run(gateway, plan_for(orphans(3)), tmp_path)
    assert len(gateway.batch_calls) == 1
    assert [r.outcome for r in report.results] == ["done"] * 3  # the read-back found them gone


def test_persistent_5xx_ends_unconfirmed_after_the_schedule(tmp_path: Path) -> None:
    gateway = FakeGateway(orphans(2))
    gateway.faults = ["500"] * 10
    waits: list[float] = []
    report = run(gateway, plan_for(orphans(2)), tmp_path, waits)
    assert waits == [0.25, 0.75, 2.0]
    assert len(gateway.batch_calls) == 4
    assert [r.outcome for r in report.results] == ["unconfirmed"] * 2
    assert report.tally_line() == "0 done, 0 refused, 2 unconfirmed, 0 gone, 0 stale, 0 already-done"
