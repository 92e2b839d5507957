"""The guard's orphan index with the REAL gateways: a scan read from it reports exactly what the full read reports.

On both gateways (``gateway_flavor``): the unmodified ``rllm-model-gateway --store sqlite`` with the guard installed
into its file while it runs, after an unguarded run left orphans behind; and gatewayscope's guarded launcher
(``--store memory``), read through its ``POST /guard/index``. Each store gets one-trace sessions on both sides of
the idle cut-off, rollouts with stragglers, deletes, a tombstone on a session that still has its trace, and a
retry that lifts a tombstone; then the same store is read through the index and in full, with the same clock.
The launcher's read is taken three ways: with the trace summaries it serves (no trace read whole), as from an older
launcher that serves none, and with every other candidate's left out (those read through ``POST /traces/query``).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from gatewayscope.analysis.findings import findings
from gatewayscope.config import Config, Policy, Target
from gatewayscope.guard import sqlite as guard
from gatewayscope.remediate.plan import build_plan
from gatewayscope.sandbox.rollouts import DEFAULT_MODEL, retry_rollout, run_rollouts
from gatewayscope.scan import read_target, scan_report
from gatewayscope.snapshot import Snapshot, TargetSnapshot
from gatewayscope.sources.rllm_http import read_trace_store_http
from gatewayscope.sources.rllm_sqlite import read_trace_store_sqlite
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e

IDLE = 3600.0
POLICY = Policy(orphan_idle_seconds=IDLE)
ROLLOUTS: dict[str, Any] = {"n_rollouts": 10, "n_stragglers": 3, "straggler_delay": 1.0, "calls_per_rollout": 2,
                            "n_live": 3, "group_size": 5, "concurrency": 8}


def chat(url: str, sid: str, marker: str = "hello") -> None:
    body = {"model": DEFAULT_MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": marker}]}
    with httpx.Client(base_url=url, timeout=30) as client:
        client.post(f"/sessions/{quote(sid, safe='')}/v1/chat/completions", json=body).raise_for_status()


def listed(url: str) -> dict[str, int]:
    with httpx.Client(base_url=url, timeout=30) as client:
        return {s["session_id"]: s["trace_count"] for s in client.get("/sessions").json()}


def settle(url: str) -> None:
    """One more call, answered after every earlier one, and wait for its trace: the gateway has persisted the
    fire-and-forget writes of every call answered before it (its writes land in order)."""
    sid = f"barrier-{uuid.uuid4()}"
    chat(url, sid, "barrier")
    wait_for("the barrier trace", lambda: listed(url).get(sid), lambda n: n == 1)


def singles(url: str, prefix: str, n: int) -> list[str]:
    ids = [f"{prefix}-{uuid.uuid4().hex[:6]}:{i}" for i in range(n)]
    for sid in ids:
        chat(url, sid)
    return ids


class LauncherTransport(httpx.BaseTransport):
    """The real network to a launcher, watched: it counts the ``POST /traces/query`` requests and keeps the trace
    summaries ``POST /guard/index`` served, and with ``mode`` it plays a launcher that summarizes less: "older"
    takes the ``summaries`` flag out of the request (the real launcher then answers as one that does not know
    it), "half" takes the summaries of every other candidate out of the answer."""

    def __init__(self, mode: str = "summaries") -> None:
        self.inner = httpx.HTTPTransport()
        self.mode = mode
        self.trace_queries = 0
        self.served: dict[str, list[Any]] = {}

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.trace_queries += path == "/traces/query"
        if path == "/guard/index" and self.mode == "older":
            body = json.loads(request.content)
            assert body.pop("summaries") is True
            request = httpx.Request(request.method, request.url, json=body)
        response = self.inner.handle_request(request)
        if path != "/guard/index" or response.status_code != 200:
            return response
        answer = json.loads(response.read())
        response.close()
        for position, candidate in enumerate(answer["candidates"]):
            if self.mode == "half" and position % 2:
                candidate.pop("summaries", None)
            if "summaries" in candidate:
                self.served[candidate["session_id"]] = candidate["summaries"]
        return httpx.Response(200, json=answer)

    def close(self) -> None:
        self.inner.close()


def both_reads_agree(target: Target, now: float, transport: httpx.BaseTransport | None = None) -> dict[str, Any]:
    """Read ``target`` through the scan (the index) and in full, at the same ``now``: same report, orphans, plan."""
    config = Config(targets=[target], policy=POLICY)
    index_snap = read_target(target, POLICY, now=now, transport=transport)
    assert index_snap.up, index_snap.error
    if target.path:
        full_data = read_trace_store_sqlite(target, POLICY, now=now, guard_reader=guard.read_for_scan, full=True)
    else:
        full_data = read_trace_store_http(target, POLICY, now=now, full=True)
    full_snap = TargetSnapshot(name=target.name, kind="rllm", address=target.address, up=True, started_at=now,
                               duration_seconds=0.0, trace_store=full_data)
    index_snap.duration_seconds = 0.0
    results = []
    for snap in (index_snap, full_snap):
        found = findings(Snapshot(taken_at=now, targets=[snap]), config)
        plan = build_plan(found, include_suspected=True, created_at=now).to_dict()
        results.append((scan_report(found), found.orphans, {k: v for k, v in plan.items() if k != "id"}))
    (report, orphans, plan), (full_report, full_orphans, full_plan) = results
    assert report == full_report
    assert orphans.equals(full_orphans)
    assert plan == full_plan
    data = index_snap.trace_store
    assert data is not None and full_data.session_total is None
    assert data.session_total is not None, "the scan did not read the index"
    assert data.sessions.height < data.session_total  # only the candidates were read
    entry: dict[str, Any] = report["targets"][0]
    return entry


def test_the_sqlite_index_reads_like_a_full_scan_of_the_real_gateway(rllm_gateway: Any, gateway_flavor: Any) -> None:
    gw = rllm_gateway("sqlite")
    db = gw.db_path
    assert db is not None
    unguarded = run_rollouts(gw.url, **ROLLOUTS, seed=3)  # leaves its raced stragglers as orphans
    assert unguarded.errors == [], unguarded.to_dict()
    early = singles(gw.url, "early", 8)
    settle(gw.url)
    cut = time.time()  # everything above is idle at ``cut + IDLE``, nothing below is
    time.sleep(0.05)

    result = guard.install(db)  # into the running gateway's file, which holds orphans already
    assert result.created and result.indexed_sessions == len(listed(gw.url))
    guarded = run_rollouts(gw.url, **ROLLOUTS, seed=4, settle_timeout=1.0)
    assert guarded.errors == [], guarded.to_dict()
    singles(gw.url, "late", 4)
    with httpx.Client(base_url=gw.url, timeout=30) as client:
        client.delete(f"/sessions/{quote(early[0], safe='')}").raise_for_status()
    guard.add_tombstones(db, [early[1]])  # tombstoned while its trace is still there: a confirmed orphan
    retried = guarded.deleted_uids[0]  # an rLLM retry reusing a deleted uid: its calls come after the delete
    chat(gw.url, retried, "retry 1")
    chat(gw.url, retried, "retry 2")
    settle(gw.url)

    entry = both_reads_agree(Target(name="sqlite", kind="rllm", path=db), cut + IDLE)
    assert entry["guard"]["index"] == "ready"
    orphan_ids = {row["session_id"] for row in entry["orphan_sessions"]}
    raced = set(unguarded.straggler_uids) - set(unguarded.race_lost_uids)
    assert raced | set(early[1:]) <= orphan_ids
    assert early[0] not in orphan_ids and retried not in orphan_ids
    assert entry["orphans"]["confirmed"] == 1


def set_weight_version(url: str, version: int) -> None:
    httpx.post(f"{url}/admin/weight_version", json={"weight_version": version}, timeout=10).raise_for_status()


def test_the_launcher_index_reads_like_a_full_scan(guarded_gateway: Any, gateway_flavor: Any) -> None:
    gw = guarded_gateway("memory")
    status = httpx.get(f"{gw.url}/guard/status", timeout=10).json()
    assert status["index"] == "ready"
    if gateway_flavor.weight_version:  # upstream main stamps each trace with the policy's weight version
        set_weight_version(gw.url, 3)
    run = run_rollouts(gw.url, **ROLLOUTS, seed=5, settle_timeout=1.0)
    assert run.errors == [], run.to_dict()
    early = singles(gw.url, "early", 8)
    multi = f"multi-{uuid.uuid4().hex[:6]}:0"
    for call in range(3):
        chat(gw.url, multi, f"call {call}")
    settle(gw.url)
    cut = time.time()
    time.sleep(0.05)

    if gateway_flavor.weight_version:
        set_weight_version(gw.url, 9)  # the early sessions are 6 versions behind: stale (policy: 2)
    singles(gw.url, "late", 4)
    with httpx.Client(base_url=gw.url, timeout=30) as client:
        client.delete(f"/sessions/{quote(early[0], safe='')}").raise_for_status()
        # tombstoned while their traces are still there: confirmed orphans, one of them with three traces
        client.post("/guard/tombstones", json={"session_ids": [early[1], multi]}).raise_for_status()
    retried = run.deleted_uids[0]  # rLLM's retry reusing a deleted uid: kept, with or without POST /sessions
    retry = retry_rollout(gw.url, retried, calls=2, explicit_create=False)
    assert retry.errors == [] and retry.trace_count == 2
    settle(gw.url)

    target = Target(name="launcher", kind="rllm", url=gw.url)
    # the launcher's trace summaries, an older launcher's answer without them, and one with every other candidate's
    for mode in ("summaries", "older", "half"):
        launcher = LauncherTransport(mode)
        entry = both_reads_agree(target, cut + IDLE, transport=launcher)
        assert entry["guard"]["index"] == "ready"
        orphan_ids = {row["session_id"] for row in entry["orphan_sessions"]}
        assert set(early[1:]) | {multi} <= orphan_ids and early[0] not in orphan_ids and retried not in orphan_ids
        assert entry["orphans"]["confirmed"] == 2
        orphans = {row["session_id"]: row for row in entry["orphan_sessions"]}
        assert orphans[multi]["trace_count"] == 3
        assert all(orphans[sid]["prompt_tokens"] and orphans[sid]["prompt_chars"] for sid in early[1:])
        if gateway_flavor.weight_version:
            assert {orphans[sid]["weight_version"] for sid in early[1:]} == {3}
        if mode == "summaries":  # every candidate's traces came summarized: no trace was read whole
            assert launcher.trace_queries == 0
            assert len(launcher.served[multi]) == 3 and len(launcher.served[early[1]]) == 1
        elif mode == "older":
            assert launcher.served == {} and launcher.trace_queries > 0
        else:
            assert launcher.served and launcher.trace_queries > 0

    # one page at a time: the same candidates, in id order, the totals from the first page
    with httpx.Client(base_url=gw.url, timeout=30) as client:
        whole = client.post("/guard/index", json={"idle_before": cut}).json()
        paged: list[str] = []
        after = None
        for _ in range(100):
            page = client.post("/guard/index", json={"idle_before": cut, "after": after, "limit": 3}).json()
            assert len(page["candidates"]) <= 3
            paged += [c["session_id"] for c in page["candidates"]]
            after = page["next"]
            if after is None:
                break
        assert paged == [c["session_id"] for c in whole["candidates"]] == sorted(paged)
        assert whole["next"] is None and whole["sessions"] == len(listed(gw.url))
        bad = client.post("/guard/index", json={"limit": 0})
        assert bad.status_code == 400 and "limit" in bad.json()["error"]
