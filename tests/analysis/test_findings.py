"""Findings: every target's findings computed once, on hand-made snapshots, and nothing else computing them.

* one rLLM trace store (a suspected orphan, a tombstoned one, a live session), one Bifrost gateway (pools over
  policy, an unreachable record, posture drift) and one target that did not answer: each target's findings and
  the frames over all targets agree with the rows written here;
* the frames keep their columns when no target has any;
* the views (scan report, exporter, notebook controllers, plan) call no analysis function themselves: the
  package's source is searched for such calls outside ``gatewayscope/analysis``.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import polars as pl
import pytest

from gatewayscope.analysis.findings import Findings, findings, target_findings
from gatewayscope.analysis.orphans import ORPHANS_SCHEMA
from gatewayscope.config import DEFAULT_MEMORY_LIMIT_BYTES, Config, Policy, Target
from gatewayscope.errors import GatewayscopeError
from gatewayscope.snapshot import GuardStats, Snapshot, TargetSnapshot
from tests.helpers import NOW, bifrost_target, trace_store_target

HOUR = 3600.0
MIB = 1024 * 1024
PACKAGE = Path(__file__).resolve().parents[2] / "gatewayscope"


def rllm(name: str = "rl") -> TargetSnapshot:
    return trace_store_target(
        [
            ("taskA:0", 1, NOW - 3 * HOUR, None),  # one trace, idle 3 h: suspected
            ("taskA:1", 1, NOW - 60, NOW - 60),  # tombstoned: confirmed although fresh
            ("taskB:0", 4, NOW - 5 * HOUR, NOW - 30),  # live
        ],
        [("taskA:0", "t0", NOW - 3 * HOUR, None, 300, 1200, "m", NOW - 3 * HOUR - 1),
         ("taskA:1", "t1", NOW - 60, None, 50, 200, "m", NOW - 61)],
        name=name, address="/srv/traces.db", duration_seconds=0.2, warnings=["a warning"],
        tombstoned_ids=["taskA:1"],
        guard=GuardStats(tombstones=7, capacity=100, dropped_writes=2),
        access="sqlite",
        also_read=frozenset({"taskA:0", "taskB:0"}),  # the ids the tests give as deleted were read
    )


def bifrost(name: str = "bf") -> TargetSnapshot:
    rows = [("openai", False, None, 1000, 5000, None, "active", "f1"),  # standard over 512
            ("acme__m", True, "openai", 64, 1024, None, "active", "f2"),  # custom at its pool
            ("acme__gone", True, "openai", 1000, 5000, "http://gone.invalid/v1", "active", "f3"),  # unreachable
            ("acme__m__anthropic", False, None, 200, 800, None, "error", "f4")]  # a lane: custom; status error
    return bifrost_target(rows, [("gone.invalid", False, "no such host")],
                          client_config={"drop_excess_requests": True, "enforce_auth_on_inference": True},
                          name=name, address="http://bf:8080", duration_seconds=0.3)


def down(name: str = "down") -> TargetSnapshot:
    return TargetSnapshot(name=name, kind="rllm", address="http://gone:9090", up=False, started_at=NOW,
                          duration_seconds=10.0, error="Cannot reach http://gone:9090", error_kind="unreachable")


def config(*names_kinds: tuple[str, str], memory_limit: int = 64 * MIB) -> Config:
    targets = [Target(name=n, kind=k, url="http://x:1", memory_limit_bytes=memory_limit) for n, k in names_kinds]
    return Config(targets=targets, policy=Policy())


def test_each_target_has_its_findings_and_the_frames_over_all_targets_agree() -> None:
    snapshot = Snapshot(taken_at=NOW, targets=[rllm(), bifrost(), down()])
    found = findings(snapshot, config(("rl", "rllm"), ("bf", "bifrost"), ("down", "rllm")))

    assert [t.name for t in found.targets] == ["rl", "bf", "down"]
    assert found.taken_at == NOW and not found.up
    rl, bf, gone = found.targets
    assert (rl.up, rl.warnings, rl.guard and rl.guard.tombstones) == (True, ("a warning",), 7)
    assert rl.orphans is not None and rl.orphans_by_task is not None
    assert rl.orphans.select("session_id", "confidence").rows() == [("taskA:1", "confirmed"),
                                                                      ("taskA:0", "suspected")]
    assert rl.orphans_by_task.rows() == [("taskA", 2, 1, 350)]
    assert (rl.records, rl.boot, rl.posture_drift) == (None, None, ())
    assert rl.summary["orphans"] == {"confirmed": 1, "suspected": 1} and rl.summary["sessions"] == 3

    assert bf.records is not None and bf.pools is not None and bf.unreachable is not None and bf.boot is not None
    assert bf.records.select("name", "kind", "over_pool", "unreachable").rows() == [
        ("openai", "standard", True, False), ("acme__m", "custom", False, False),
        ("acme__gone", "custom", True, True), ("acme__m__anthropic", "custom", True, True)]
    assert bf.unreachable["name"].to_list() == ["acme__gone", "acme__m__anthropic"]
    assert bf.pools.select("kind", "records", "parked_workers", "over_pool", "pool_policy").rows() == [
        ("standard", 1, 1000, 1, 512), ("custom", 3, 1064, 2, 64)]  # the error record parks nothing
    assert (bf.boot.parked_workers, bf.boot.memory_limit_bytes, bf.memory_limit_bytes) == (2064, 64 * MIB, 64 * MIB)
    assert bf.posture_drift == ("drop_excess_requests", "disable_content_logging")
    assert bf.orphans is None

    assert (gone.up, gone.error_kind, gone.orphans, gone.records, gone.summary) == (
        False, "unreachable", None, None, {})

    # over all targets: the same rows, with the target first
    assert found.orphans.columns == ["target", *ORPHANS_SCHEMA]
    assert found.orphans.select("target", "session_id").rows() == [("rl", "taskA:1"), ("rl", "taskA:0")]
    assert found.orphans_by_task.rows() == [("rl", "taskA", 2, 1, 350)]
    assert found.records["target"].unique().to_list() == ["bf"] and found.records.height == 4
    assert found.pools.select("target", "kind").rows() == [("bf", "standard"), ("bf", "custom")]
    assert found.boot.select("target", "parked_workers", "survives_restart").rows() == [("bf", 2064, "yes")]
    assert found.posture.filter("drifted")["setting"].to_list() == ["drop_excess_requests",
                                                                     "disable_content_logging"]
    assert found.posture.row(0, named=True) == {"target": "bf", "setting": "drop_excess_requests",
                                                "reported": "true", "safe": "false", "drifted": True}
    assert found.unreachable.select("target", "name").rows() == [("bf", "acme__gone"), ("bf", "acme__m__anthropic")]
    assert found.guard.rows() == [("rl", "sqlite", True, 7, 100, 2, 0)]
    assert found.counts == {"orphans": 2, "confirmed_orphans": 1, "records_over_pool": 3, "posture_drift": 2,
                            "unreachable_records": 2, "targets_down": 1}
    assert found.target("bf") is bf
    with pytest.raises(KeyError, match="rl, bf, down"):
        found.target("nope")


def test_findings_are_frozen_and_keep_their_own_policy_and_deleted_ids() -> None:
    cfg = config(("rl", "rllm"))
    deleted = {"taskA:0": NOW - 10, "taskB:0": NOW - 10}  # earlier deletes, and when they were made
    found = findings(Snapshot(taken_at=NOW, targets=[rllm()]), cfg, deleted_ids=deleted)
    cfg.policy.orphan_idle_seconds = 1.0
    deleted.clear()
    assert found.policy.orphan_idle_seconds == 7200.0
    assert found.deleted_ids == {"taskA:0": NOW - 10, "taskB:0": NOW - 10}
    assert found.orphans.filter(pl.col("session_id") == "taskA:0")["reason"].to_list() == [
        "was deleted before and came back"]
    # taskB:0 is live (four traces, the latest after nothing): its delete makes no orphan of it
    assert found.orphans.filter(pl.col("session_id") == "taskB:0").height == 0
    with pytest.raises(TypeError, match="moment of its delete"):
        findings(Snapshot(taken_at=NOW, targets=[rllm()]), cfg, deleted_ids={"taskB:0"})  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        found.taken_at = 0.0  # type: ignore[misc]


def test_a_target_the_config_does_not_name_is_judged_against_the_default_limit() -> None:
    found = findings(Snapshot(taken_at=NOW, targets=[bifrost("elsewhere")]), config(("bf", "bifrost")))
    boot = found.target("elsewhere").boot
    assert boot is not None and boot.memory_limit_bytes == DEFAULT_MEMORY_LIMIT_BYTES


def test_the_frames_keep_their_columns_when_no_target_has_any() -> None:
    found = findings(Snapshot(taken_at=NOW, targets=[down()]), config(("down", "rllm")))
    frames = {"orphans": found.orphans, "orphans_by_task": found.orphans_by_task, "records": found.records,
              "pools": found.pools, "boot": found.boot, "posture": found.posture, "unreachable": found.unreachable,
              "guard": found.guard}
    assert all(frame.height == 0 and frame.columns[0] == "target" for frame in frames.values()), frames
    assert {"name", "kind", "over_pool", "parked_workers", "unreachable", "unreachable_reason"} <= set(
        found.records.columns)
    assert found.orphans_by_task.columns == ["target", "task", "orphans", "confirmed", "prompt_tokens"]
    # the same columns and types as when there are rows
    full = findings(Snapshot(taken_at=NOW, targets=[rllm(), bifrost()]), config(("rl", "rllm"), ("bf", "bifrost")))
    for name, frame in frames.items():
        assert frame.schema == getattr(full, name).schema, name


def test_target_findings_is_what_findings_computes_per_target() -> None:
    snap = bifrost()
    alone = target_findings(snap, Policy(), now=NOW, memory_limit_bytes=64 * MIB)
    within = findings(Snapshot(taken_at=NOW, targets=[snap]), config(("bf", "bifrost"))).target("bf")
    assert alone.summary == within.summary
    assert alone.records is not None and within.records is not None and alone.records.equals(within.records)
    assert isinstance(findings(Snapshot(taken_at=NOW, targets=[]), config()), Findings)


# -- nothing but the analysis computes findings ---------------------------------------------------------------

#: the analysis functions that make findings; only gatewayscope/analysis calls them
ANALYSIS_FUNCTIONS = frozenset({"find_orphans", "orphans_by_task", "trace_store_summary", "classify_records",
                                "unreachable_records", "per_kind", "boot_estimate", "bifrost_summary",
                                "posture_drift"})
#: (file, function): apply re-judges the posture of the client config it has just re-read, right before it
#: writes, so a fix is never sent for a setting that is no longer drifted (a check of live state, not a view)
ALLOWED = {("remediate/apply/bifrost.py", "posture_drift")}


def analysis_calls(path: Path) -> list[tuple[str, int]]:
    """(function, line) of every call of, or import of, an analysis function in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name in ANALYSIS_FUNCTIONS:
                found.append((name, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            found += [(alias.name, node.lineno) for alias in node.names if alias.name in ANALYSIS_FUNCTIONS]
    return found


def test_no_view_computes_findings_itself() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith("analysis/"):
            continue
        offenders += [f"{relative}:{line}: {name}" for name, line in analysis_calls(path)
                      if (relative, name) not in ALLOWED]
    assert offenders == [], "these compute findings outside gatewayscope/analysis (use gatewayscope.findings)"
    # the search itself finds such calls
    assert {name for name, _ in analysis_calls(PACKAGE / "analysis" / "findings.py")} >= {
        "find_orphans", "orphans_by_task", "classify_records", "unreachable_records", "posture_drift"}
    assert ("posture_drift" in {name for name, _ in analysis_calls(PACKAGE / "remediate" / "apply" / "bifrost.py")}), \
        "apply no longer re-judges the posture: drop its exception"


def test_deleted_ids_the_read_did_not_name_are_refused_with_what_to_do() -> None:
    snap = rllm()
    assert snap.trace_store is not None
    unread = TargetSnapshot(name="rl", kind="rllm", address=snap.address, up=True, started_at=NOW,
                            duration_seconds=0.1,
                            trace_store=dataclasses.replace(snap.trace_store, also_read=frozenset({"taskA:0"})))
    with pytest.raises(GatewayscopeError, match=r"read without 1 of the session ids.*also_sessions"):
        findings(Snapshot(taken_at=NOW, targets=[unread]), config(("rl", "rllm")),
                 deleted_ids={"taskA:0": NOW - 10, "gone:0": NOW - 10})
