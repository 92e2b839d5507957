"""What only upstream main's rLLM gateway has, used for real: weight versions and ``POST /sessions/batch_delete``.

Every test here runs on the upstream gateway alone (``gateway_flavor`` pinned to ``upstream-main``; skipped with
the reason when ``make`` could not install it), on both stores.

* Weight versions: the trainer bumps ``POST /admin/weight_version`` DURING the straggler race, right before the
  first straggler's session is deleted, and again after it. Upstream stamps each trace with the version at
  dispatch, so a straggler whose late call was already at the worker keeps the old version although its trace
  is written after the bump. ``gatewayscope scan --format json`` reports the gateway's current version and the
  orphans' weight lag, and never flags a one-trace session at (or within ``--max-weight-lag`` of) the current
  version, however idle.
* Batch delete: ``gatewayscope plan --include-suspected`` + ``apply --yes --allow-delete`` against the gateway's
  URL delete exactly the race's orphans through ``POST /sessions/batch_delete``; live sessions keep every trace.
* WAL: the SQLite reader (``mode=ro``) on upstream's WAL file while the gateway runs, after it was killed (the
  traces only in the -wal) and after a clean stop (no -wal, no -shm).
* The exporter's orphan gauge follows the gateway's current weight version.

gatewayscope's SQLite writers on upstream's WAL file are tested under load where they are tested on both
gateways (test_sqlite_guard_e2e.py, test_apply_under_load.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import httpx
import pytest

from gatewayscope.sandbox.rollouts import RolloutRun, run_rollouts
from gatewayscope.sandbox.stub_protocol import TAG_HEADER, AsyncStubClient
from tests.helpers import gateway_sessions, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.parametrize("gateway_flavor", ["upstream-main"], indirect=True)]

STORES = ["memory", "sqlite"]
IDLE = 1.0  # seconds: the orphans are fresh; only the weight version keeps an idle one-trace session live
TAIL = "0 refused, 0 unconfirmed, 0 gone, 0 stale, 0 already-done"


def set_weight_version(url: str, version: int) -> None:
    answer = httpx.post(f"{url}/admin/weight_version", json={"weight_version": version}, timeout=10)
    answer.raise_for_status()
    assert answer.json() == {"weight_version": version}


def chat(url: str, session_id: str, text: str = "still here") -> None:
    httpx.post(f"{url}/sessions/{quote(session_id, safe='')}/v1/chat/completions", timeout=30,
               json={"model": "stub", "messages": [{"role": "user", "content": text}]}).raise_for_status()


def traces_of(url: str, session_id: str) -> list[dict[str, Any]]:
    return list(httpx.get(f"{url}/sessions/{quote(session_id, safe='')}/traces", timeout=10).json())


def wait_traces(url: str, wanted: dict[str, int]) -> None:
    """Until every session in ``wanted`` has that many traces (the gateway persists after it answers)."""
    wait_for("the traces stored", lambda: {sid: len(traces_of(url, sid)) for sid in wanted},
             lambda counts: counts == wanted)


def gatewayscope(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it, without the caller's config file."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd)}
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return subprocess.run([sys.executable, "-c", "from gatewayscope.cli import run; run()", *args],
                          capture_output=True, text=True, timeout=180, cwd=cwd, env=env)


def scan_entry(address: str, cwd: Path, *flags: str) -> dict[str, Any]:
    done = gatewayscope("scan", "--format", "json", "--trace-store", address, "--orphan-idle-seconds", str(IDLE),
                        *flags, cwd=cwd)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (entry,) = json.loads(done.stdout)["targets"]
    assert entry["up"] and entry["error"] is None, entry
    return dict(entry)


# -- a weight-version bump in the middle of the race ---------------------------------------------------------


class BumpBeforeTheFirstStragglerDelete(httpx.AsyncBaseTransport):
    """The rollout driver's HTTP, with one ``POST /admin/weight_version`` sent right before the first
    ``DELETE /sessions/{uid}`` of a straggler (a session whose late call, tagged with its uid, was sent); every
    straggler's delete waits until the bump was answered.

    At that moment it asks the stub worker which late calls are there: the gateway dispatched those already
    (upstream stamps a trace with the version at dispatch), and none of them has answered (each is held at
    the worker until its own session's delete was answered)."""

    def __init__(self, gateway_url: str, worker_url: str, version: int) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.gateway_url = gateway_url
        self.worker_url = worker_url
        self.version = version
        #: uid -> when its late call was handed to the gateway (before it was sent)
        self.late_sent: dict[str, float] = {}
        #: (sent, answered) of the bump
        self.bump: tuple[float, float] | None = None
        #: late calls in flight at the worker when the bump was sent: dispatched at the old version
        self.at_worker: set[str] = set()
        self._bumping: asyncio.Future[None] | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        tag = request.headers.get(TAG_HEADER)
        if tag and request.method == "POST" and request.url.path.endswith("/chat/completions"):
            self.late_sent.setdefault(tag, time.time())
        elif request.method == "DELETE" and unquote(request.url.path.rsplit("/", 1)[-1]) in self.late_sent:
            if self._bumping is None:  # the first straggler delete bumps; every one waits for the bump
                self._bumping = asyncio.ensure_future(self._bump())
            await self._bumping
        return await self.inner.handle_async_request(request)

    async def _bump(self) -> None:
        async with httpx.AsyncClient(timeout=10) as side:
            worker = AsyncStubClient(side, self.worker_url)
            for uid in sorted(self.late_sent):
                if (await worker.inflight(uid)).inflight:
                    self.at_worker.add(uid)
            sent = time.time()
            answer = await side.post(f"{self.gateway_url}/admin/weight_version",
                                     json={"weight_version": self.version})
            answer.raise_for_status()
            self.bump = (sent, time.time())

    async def aclose(self) -> None:
        await self.inner.aclose()


def expected_versions(run: RolloutRun, transport: BumpBeforeTheFirstStragglerDelete, before: int,
                      after: int) -> dict[str, set[int]]:
    """The weight version each raced straggler's trace may carry: ``before`` when its late call was at the
    worker at the bump, ``after`` when it was sent after the bump was answered, either in between."""
    assert transport.bump is not None
    _, answered = transport.bump
    versions: dict[str, set[int]] = {}
    for uid in set(run.straggler_uids) - set(run.race_lost_uids):
        if uid in transport.at_worker:
            versions[uid] = {before}
        elif transport.late_sent[uid] > answered:
            versions[uid] = {after}
        else:
            versions[uid] = {before, after}
    return versions


@pytest.mark.parametrize("store", STORES)
def test_a_bump_during_the_race_stamps_at_dispatch_and_scan_reports_the_lag(
        rllm_gateway: Any, stub_worker: str, store: str, tmp_path: Path) -> None:
    gateway = rllm_gateway(store)
    url = gateway.url
    assert httpx.get(f"{url}/admin/weight_version", timeout=10).json() == {"weight_version": None}
    set_weight_version(url, 1)

    transport = BumpBeforeTheFirstStragglerDelete(url, stub_worker, 2)
    run = run_rollouts(url, n_rollouts=20, n_stragglers=6, n_live=3, live_calls=[1, 2, 3], straggler_delay=1.0,
                       transport=transport)
    assert run.errors == [], run.to_dict()
    assert transport.bump is not None, "no straggler's session was deleted: the race did not happen"
    raced = set(run.straggler_uids) - set(run.race_lost_uids)
    assert len(raced) >= len(run.straggler_uids) // 2, run.to_dict()
    assert transport.at_worker & raced, "no late call was at the worker when the version was bumped"
    expected = expected_versions(run, transport, 1, 2)

    # Each raced straggler's trace was written after the bump (after its session's delete, which came after
    # the bump), and carries the version its call was dispatched at.
    listed = {s["session_id"]: s for s in httpx.get(f"{url}/sessions", timeout=10).json()}
    for uid in raced:
        [trace] = traces_of(url, uid)
        assert trace["weight_version"] in expected[uid], (uid, trace["weight_version"], expected[uid])
        assert listed[uid]["created_at"] > run.deleted_at[uid] > transport.bump[0], (
            uid, listed[uid], run.straggler_timeline.get(uid), transport.bump, trace["timestamp"])
    for uid in run.live_uids:
        assert {t["weight_version"] for t in traces_of(url, uid)} <= {1, 2}

    # After the race: one session at version 3 (within the default lag of 2 of the last version), then the
    # trainer moves to 5; the live sessions call again, and a new one-trace session starts at 5.
    set_weight_version(url, 3)
    chat(url, "lag-two:0")
    wait_traces(url, {"lag-two:0": 1})
    set_weight_version(url, 5)
    fresh = "fresh-live:0"
    for uid in [*run.live_uids, fresh]:
        chat(url, uid)
    wait_traces(url, {**{uid: n + 1 for uid, n in run.live_uids.items()}, fresh: 1})
    assert [t["weight_version"] for t in traces_of(url, fresh)] == [5]
    time.sleep(IDLE + 0.2)  # every one-trace session is idle past the threshold now: only versions tell them apart

    addresses = [url] if store == "memory" else [str(gateway.db_path), url]
    for address in addresses:
        entry = scan_entry(address, tmp_path)
        assert entry["access"] == ("sqlite" if address == gateway.db_path else "rest")
        assert entry["capabilities"]["weight_version"] is True
        assert entry["current_weight_version"] == 5
        orphans = {o["session_id"]: o for o in entry["orphan_sessions"]}
        assert set(orphans) == raced, address
        assert entry["orphans"] == {"confirmed": 0, "suspected": len(raced)}
        for uid, orphan in orphans.items():
            assert orphan["weight_version"] in expected[uid]
            assert orphan["weight_lag"] == 5 - orphan["weight_version"]
            assert f"{orphan['weight_lag']} weight versions behind" in orphan["reason"]
        assert entry["max_orphan_weight_lag"] == 4  # a straggler at the worker during the bump: version 1
        # the live sessions, the new one-trace session at the current version, and the one 2 versions behind
        assert not set(orphans) & {*run.live_uids, fresh, "lag-two:0"}

        # a stricter policy: 2 versions behind is too far now, the current version still is not
        strict = scan_entry(address, tmp_path, "--max-weight-lag", "1")
        flagged = {o["session_id"]: o for o in strict["orphan_sessions"]}
        assert set(flagged) == raced | {"lag-two:0"}
        assert (flagged["lag-two:0"]["weight_version"], flagged["lag-two:0"]["weight_lag"]) == (3, 2)
    assert gateway.process.running()


# -- plan and apply through POST /sessions/batch_delete ------------------------------------------------------


@pytest.mark.parametrize("store", STORES)
def test_plan_and_apply_delete_the_race_orphans_through_batch_delete(rllm_gateway: Any, store: str,
                                                                      tmp_path: Path) -> None:
    gateway = rllm_gateway(store)
    url = gateway.url
    set_weight_version(url, 1)
    run = run_rollouts(url, n_rollouts=12, n_stragglers=5, n_live=3, live_calls=[1, 2, 3], straggler_delay=1.0)
    assert run.ok, run.to_dict()
    raced = set(run.straggler_uids) - set(run.race_lost_uids)
    assert len(raced) >= 3, run.to_dict()
    # the trainer moved on; the live rollouts call again at the new version, and one starts
    set_weight_version(url, 4)
    fresh = "fresh-live:0"
    for uid in [*run.live_uids, fresh]:
        chat(url, uid)
    live = {**{uid: n + 1 for uid, n in run.live_uids.items()}, fresh: 1}
    wait_traces(url, live)
    before = gateway_sessions(url)
    assert {sid: n for sid, n in before.items() if sid in set(run.deleted_uids)} == dict.fromkeys(raced, 1)
    time.sleep(IDLE + 0.2)

    # one config for plan and apply: apply re-checks every orphan against the policy before it deletes
    (tmp_path / "gatewayscope.toml").write_text(
        f'[[targets]]\nname = "upstream"\nkind = "rllm"\nurl = "{url}"\n\n[policy]\norphan_idle_seconds = {IDLE}\n')
    planned = gatewayscope("plan", "--config", "gatewayscope.toml", "--include-suspected", "--out", "plan.json",
                           cwd=tmp_path)
    assert planned.returncode == 0, planned.stdout[-2000:] + planned.stderr[-2000:]
    assert "POST /sessions/batch_delete" in planned.stdout + planned.stderr
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert sorted(a["subject"] for a in plan["actions"] if a["kind"] == "session_delete") == sorted(raced)
    assert len(plan["actions"]) == len(raced)

    applied = gatewayscope("apply", "plan.json", "--config", "gatewayscope.toml", "--yes", "--allow-delete",
                           cwd=tmp_path)
    assert applied.returncode == 0, applied.stdout[-2000:] + applied.stderr[-2000:]
    assert applied.stdout.splitlines()[-1] == f"{len(raced)} done, {TAIL}"
    events = [json.loads(line) for line in (tmp_path / "plan.journal.jsonl").read_text().splitlines()]
    attempts = [e for e in events if e["event"] == "attempt"]
    assert sorted(e["subject"] for e in attempts) == sorted(raced)
    assert {e["what"] for e in attempts} == {"POST /sessions/batch_delete"}  # no session deleted one by one

    assert gateway_sessions(url) == {sid: before[sid] for sid in live} == live  # live: every trace kept
    with httpx.Client(base_url=url, timeout=10) as client:
        for uid in raced:
            assert client.get(f"/sessions/{quote(uid, safe='')}").status_code == 404
    if store == "sqlite":
        assert gateway.db_path is not None
        with sqlite3.connect(f"{Path(gateway.db_path).resolve().as_uri()}?mode=ro", uri=True) as conn:
            left = {row[0] for row in conn.execute("SELECT DISTINCT session_id FROM trace_sessions")}
            unlinked = conn.execute("SELECT COUNT(*) FROM traces WHERE trace_id NOT IN "
                                    "(SELECT trace_id FROM trace_sessions)").fetchone()[0]
        assert (left, unlinked) == (set(live), 0)

    again = gatewayscope("apply", "plan.json", "--config", "gatewayscope.toml", "--yes", "--allow-delete",
                         cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "was already applied" in again.stdout
    assert gateway_sessions(url) == live


# -- the SQLite reader on upstream's WAL file -----------------------------------------------------------------


def file_bytes(path: Path) -> bytes:
    return path.read_bytes() if path.exists() else b""


@pytest.mark.parametrize("end", ["killed", "stopped"])
def test_scan_reads_the_wal_store_while_it_runs_after_a_crash_and_after_a_clean_stop(rllm_gateway: Any, end: str,
                                                                                     tmp_path: Path) -> None:
    """``mode=ro`` on a WAL file: with the gateway's -wal and -shm (running), with a -wal full of committed
    traces the main file does not have yet (the gateway was killed), and with neither (a clean stop
    checkpoints and removes them). The scan sees every trace, changes no byte of the store or its WAL, and
    the gateway starts again on the file afterwards."""
    db = tmp_path / end / "gateway_traces.db"
    db.parent.mkdir()
    wal, shm = Path(f"{db}-wal"), Path(f"{db}-shm")
    gateway = rllm_gateway("sqlite", db_path=db)
    stored = {f"{end}-task:{k}": 1 for k in range(5)}
    for sid in stored:
        chat(gateway.url, sid)
    wait_traces(gateway.url, stored)
    assert wal.exists() and shm.exists()
    running = scan_entry(str(db), tmp_path)
    assert (running["access"], running["sessions"], running["traces"]) == ("sqlite", 5, 5)

    if end == "killed":
        os.killpg(gateway.process.pid, signal.SIGKILL)
        gateway.process.popen.wait(timeout=30)
        assert wal.stat().st_size > 0  # committed, not yet checkpointed into the main file
    else:
        gateway.stop()  # upstream checkpoints (TRUNCATE) and closes: the last connection removes -wal and -shm
        assert not wal.exists() and not shm.exists()
    store_before, wal_before = db.read_bytes(), file_bytes(wal)
    time.sleep(IDLE + 0.2)  # every session's one trace is idle past the threshold now

    after = scan_entry(str(db), tmp_path)
    assert (after["sessions"], after["traces"]) == (5, 5)
    assert {o["session_id"] for o in after["orphan_sessions"]} == set(stored)  # one trace each, idle: suspected
    assert db.read_bytes() == store_before  # read only: not a byte of the store changed
    # nor of its WAL; where there was none, SQLite makes even a read-only reader of a WAL file create the -wal
    # (and -shm) files, which stay empty
    assert file_bytes(wal) == wal_before

    again = rllm_gateway("sqlite", db_path=db)  # the same upstream gateway on the same file
    chat(again.url, "after-restart:0")
    wait_traces(again.url, {"after-restart:0": 1})
    assert gateway_sessions(again.url) == {**stored, "after-restart:0": 1}


# -- the exporter follows the gateway's weight version ---------------------------------------------------------


def orphan_gauges(exporter_url: str) -> dict[str, float]:
    """``gatewayscope_trace_store_orphan_sessions`` of the target ``upstream``, by confidence."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{exporter_url}/metrics", timeout=30).text
    return {sample.labels["confidence"]: sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.name == "gatewayscope_trace_store_orphan_sessions" and sample.labels["target"] == "upstream"}


@pytest.mark.parametrize("store", STORES)
def test_the_exporter_counts_no_orphan_at_the_current_weight_version(rllm_gateway: Any, store: str,
                                                                     tmp_path: Path) -> None:
    from tests.helpers import start_server

    gateway = rllm_gateway(store)
    url = gateway.url
    set_weight_version(url, 1)
    run = run_rollouts(url, n_rollouts=8, n_stragglers=3, n_live=1, live_calls=[2], straggler_delay=1.0)
    assert run.ok, run.to_dict()
    raced = set(run.straggler_uids) - set(run.race_lost_uids)
    set_weight_version(url, 4)
    fresh = "fresh-live:0"
    chat(url, fresh)  # a rollout of the new policy: one trace, at the current version
    wait_traces(url, {fresh: 1})
    time.sleep(IDLE + 0.2)

    config = tmp_path / "gatewayscope.toml"
    config.write_text(f'[exporter]\nmin_interval_seconds = 1\n\n[[targets]]\nname = "upstream"\nkind = "rllm"\n'
                      f'url = "{url}"\n\n[policy]\norphan_idle_seconds = {IDLE}\n')
    process, exporter_url = start_server(
        "exporter", lambda port: [sys.executable, "-c", "from gatewayscope.cli import run; run()", "export",
                                  "--config", str(config), "--listen", f"127.0.0.1:{port}"], "/-/healthy")
    try:
        # the stragglers (3 versions behind) are suspected; the fresh one-trace session at version 4 is not
        wait_for("the orphans exported", lambda: orphan_gauges(exporter_url),
                 lambda gauges: gauges == {"confirmed": 0.0, "suspected": float(len(raced))})
        # the trainer moves 6 versions on: the idle one-trace session of version 4 is now an orphan too
        set_weight_version(url, 10)
        wait_for("the new weight version read", lambda: orphan_gauges(exporter_url),
                 lambda gauges: gauges == {"confirmed": 0.0, "suspected": float(len(raced) + 1)})
    finally:
        process.stop()
