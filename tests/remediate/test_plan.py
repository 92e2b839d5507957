"""Plans from hand-built Snapshots: which findings make which actions, and what a plan file promises.

Pure: every Snapshot here is written out by hand (frames of the snapshot schemas), and the expected
actions and numbers are worked out from those rows and the seed's pool policy, never from the planner's
own helpers. One test reads the Bifrost emulator over real HTTP to prove that a plan built from a store
full of secrets carries none of them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gatewayscope.config import AuthConfig, Config, Policy, Target
from gatewayscope.errors import PlanError
from gatewayscope.remediate.plan import (
    ACTION_KINDS,
    Action,
    Plan,
    build_plan,
    load_plan,
    plan_summary,
)
from gatewayscope.snapshot import GuardStats, Snapshot, TargetSnapshot
from tests import helpers
from tests.helpers import NOW

HOUR = 3600.0
KIB = 1024
SAFE = {"drop_excess_requests": False, "enforce_auth_on_inference": True, "disable_content_logging": True}


# -- hand-built snapshots -----------------------------------------------------------------------------

def record(name: str, concurrency: int, buffer_size: int, *, custom: bool = True, base_url: str | None = None,
           status: str = "active") -> tuple[Any, ...]:
    """One RECORDS_SCHEMA row; the fingerprint is a stand-in naming the record."""
    base = "openai" if custom else None
    return (name, custom, base, concurrency, buffer_size, base_url, status, f"fp-{name}")


def bifrost_target(records: list[tuple[Any, ...]], *, client_config: dict[str, Any] | None = None,
                   dead_hosts: tuple[str, ...] = (), live_hosts: tuple[str, ...] = (),
                   name: str = "bifrost") -> TargetSnapshot:
    reach = [(h, False, "no such host") for h in dead_hosts] + [(h, True, None) for h in live_hosts]
    return helpers.bifrost_target(records, reach, client_config=dict(SAFE if client_config is None else client_config),
                                  name=name)


def rllm_target(sessions: list[tuple[str, int, float]], *, tombstoned: tuple[str, ...] = (),
                guard: GuardStats | None = None, access: str = "rest", name: str = "rl",
                address: str = "http://127.0.0.1:9090", also: tuple[str, ...] = ()) -> TargetSnapshot:
    """``sessions``: (id, trace count, last trace time). Like the sources, candidate traces are read for
    one-trace sessions idle past the default threshold, for tombstoned ones and for those of ``also`` (the ids
    the findings will be given as deleted); one trace each here, dispatched a second before its time."""
    rows = [(sid, count, last - 10.0, last) for sid, count, last in sessions]
    candidates = [
        (sid, f"{sid}/t{i}", last, None, 100, 400, "stub", last - 1.0)
        for sid, count, last in sessions
        if (count == 1 and NOW - last > 2 * HOUR) or sid in tombstoned or sid in also
        for i in range(count)
    ]
    return helpers.trace_store_target(rows, candidates, name=name, address=address, tombstoned_ids=list(tombstoned),
                                      guard=guard, capabilities={"guard": guard is not None}, access=access,
                                      also_read=frozenset(also))


def snapshot(*targets: TargetSnapshot) -> Snapshot:
    return Snapshot(taken_at=NOW, targets=list(targets))


def config_for(snap: Snapshot, policy: Policy | None = None) -> Config:
    targets = [Target(name=t.name, kind=t.kind, url=t.address if t.address.startswith("http") else None,
                      path=None if t.address.startswith("http") else t.address) for t in snap.targets]
    return Config(targets=targets, policy=policy or Policy())


def plan_of(snap: Snapshot, policy: Policy | None = None, **kwargs: Any) -> Plan:
    return build_plan(snap, config_for(snap, policy), created_at=NOW, **kwargs)


def by_subject(plan: Plan) -> dict[str, Action]:
    return {a.subject: a for a in plan.actions}


GUARD = GuardStats(tombstones=7, capacity=1_000_000, dropped_writes=2)
OLD = NOW - 5 * HOUR  # idle well past the default 7,200 s threshold
FRESH = NOW - 60.0


# -- pool_shrink ----------------------------------------------------------------------------------------

def test_pool_shrink_to_the_kind_pool_with_a_queue_16_deep_per_worker() -> None:
    snap = snapshot(bifrost_target([
        record("openai", 1000, 5000, custom=False),
        record("acme__vllm__llama", 1000, 5000, base_url="http://localhost:8000/v1"),
        record("acme__openrouter__claude__anthropic", 1000, 5000, custom=False),  # the lane: custom pool
        record("anthropic", 512, 8192, custom=False),  # at its pool: nothing to do
        record("acme__small", 32, 512),  # under its pool: nothing to do
    ], live_hosts=("localhost",)))
    plan = plan_of(snap)
    actions = by_subject(plan)
    assert sorted(actions) == ["acme__openrouter__claude__anthropic", "acme__vllm__llama", "openai"]
    assert {a.kind for a in plan.actions} == {"pool_shrink"}
    assert actions["openai"].after == {"concurrency": 512, "buffer_size": 512 * 16}
    assert actions["acme__vllm__llama"].after == {"concurrency": 64, "buffer_size": 64 * 16}
    assert actions["acme__openrouter__claude__anthropic"].after == {"concurrency": 64, "buffer_size": 1024}
    assert actions["openai"].before == {"concurrency": 1000, "buffer_size": 5000}
    # planned against the record as read: its fingerprint, and whether it carries a base URL (the remedy)
    assert actions["acme__vllm__llama"].fingerprint == "fp-acme__vllm__llama"
    assert actions["acme__vllm__llama"].details["has_base_url"] is True
    assert actions["openai"].details["has_base_url"] is False
    assert not any(a.destructive for a in plan.actions)


def test_a_read_without_plan_fingerprints_is_refused_not_planned() -> None:
    """A plan action carries the fingerprint apply compares before writing; a report-only read (the
    exporter's, a scan that saved no snapshot) has none, and planning from it must say so."""
    rows = [record("acme__vllm__llama", 1000, 5000, base_url="http://gpu.example/v1")]
    unprinted = [(*row[:-1], None) for row in rows]
    with pytest.raises(PlanError, match="without plan fingerprints.*--save-snapshot"):
        plan_of(snapshot(bifrost_target(unprinted, live_hosts=("gpu.example",))))
    assert plan_of(snapshot(bifrost_target(rows, live_hosts=("gpu.example",)))).actions


def test_pool_policy_overrides_set_the_targets() -> None:
    snap = snapshot(bifrost_target([record("openai", 1000, 5000, custom=False), record("a__m", 1000, 5000)]))
    actions = by_subject(plan_of(snap, Policy(standard_pool=256, custom_pool=100, queue_per_worker=16)))
    assert actions["openai"].after == {"concurrency": 256, "buffer_size": 4096}
    assert actions["a__m"].after == {"concurrency": 100, "buffer_size": 1600}


def test_memory_frees_summary_is_the_sum_of_freed_workers_at_2_and_8_kib() -> None:
    snap = snapshot(bifrost_target([
        record("openai", 1000, 5000, custom=False),  # 1000 - 512 = 488
        record("gemini", 700, 5000, custom=False),  # 700 - 512 = 188
        record("a__m", 1000, 5000),  # 936
        record("b__m", 300, 4800),  # 236
        record("c__m", 64, 1024),  # nothing
    ]))
    summary = plan_summary(plan_of(snap))
    freed = (1000 - 512) + (700 - 512) + (1000 - 64) + (300 - 64)
    assert summary["frees_workers"] == freed == 1848
    assert summary["frees_bytes"] == {"low": freed * 2 * KIB, "high": freed * 8 * KIB}
    assert summary["by_kind"]["pool_shrink"] == 4
    assert summary["destructive"] == 0


# -- record_delete ----------------------------------------------------------------------------------------

def unreachable_snapshot() -> Snapshot:
    return snapshot(bifrost_target([
        record("dead__m", 1000, 5000, base_url="https://vllm.dead.invalid/v1"),
        record("broken", 1000, 5000, custom=False, status="error"),  # the core cannot build it: parks 0
        record("live__m", 1000, 5000, base_url="http://localhost:8000/v1"),
    ], dead_hosts=("vllm.dead.invalid",), live_hosts=("localhost",)))


def test_unreachable_records_over_pool_are_not_shrunk_but_warned_about() -> None:
    plan = plan_of(unreachable_snapshot())
    assert [(a.kind, a.subject) for a in plan.actions] == [("pool_shrink", "live__m")]
    warning = next(w for w in plan.warnings if "cannot be resized" in w)
    assert warning.startswith("bifrost: 2 record(s) over their pool cannot be resized")
    assert "--include-deletes" in warning
    assert not any("--allow-delete" in w for w in plan.warnings)


def test_record_delete_only_with_include_deletes() -> None:
    plan = plan_of(unreachable_snapshot(), include_deletes=True)
    assert [(a.kind, a.subject) for a in plan.actions] == [
        ("pool_shrink", "live__m"), ("record_delete", "broken"), ("record_delete", "dead__m")]
    actions = by_subject(plan)
    assert all(actions[n].destructive for n in ("broken", "dead__m"))
    assert actions["dead__m"].before == {"concurrency": 1000, "buffer_size": 5000,
                                         "base_url": "https://vllm.dead.invalid/v1"}
    assert actions["dead__m"].after == {"exists": False}
    assert "vllm.dead.invalid does not resolve" in actions["dead__m"].reason
    assert "provider_status is error" in actions["broken"].reason
    assert not any("cannot be resized" in w for w in plan.warnings)
    assert plan.warnings[0].startswith("This plan deletes things: apply needs --allow-delete")
    # a record in status error parks no workers, so deleting it frees nothing
    summary = plan_summary(plan)
    assert actions["broken"].details["frees_workers"] == 0
    assert summary["frees_workers"] == (1000 - 64) + 1000 + 0
    assert summary["destructive"] == 2


def test_never_two_actions_on_one_subject() -> None:
    """A record both over its pool and unreachable gets the delete only, never a resize as well."""
    snap = snapshot(
        unreachable_snapshot().targets[0],
        rllm_target([("t:0", 1, OLD)], tombstoned=("t:0",), guard=GUARD),
    )
    plan = plan_of(snap, include_deletes=True, include_suspected=True, tombstone_ids=["t:0", "x:1"])
    keys = [(a.target, a.subject) for a in plan.actions]
    assert len(keys) == len(set(keys))
    assert [a.kind for a in plan.actions if a.subject == "dead__m"] == ["record_delete"]
    assert [a.id for a in plan.actions] == [f"a{i:05d}" for i in range(1, len(plan.actions) + 1)]


# -- posture_fix -------------------------------------------------------------------------------------------

def test_posture_fix_only_for_the_drifted_settings() -> None:
    drifted = {"drop_excess_requests": True, "enforce_auth_on_inference": True, "disable_content_logging": False,
               "log_retention_days": 30}
    plan = plan_of(snapshot(bifrost_target([], client_config=drifted)))
    assert len(plan.actions) == 1
    fix = plan.actions[0]
    assert (fix.kind, fix.subject) == ("posture_fix", "client_config")
    assert fix.before == {"drop_excess_requests": True, "disable_content_logging": False}
    assert fix.after == {"drop_excess_requests": False, "disable_content_logging": True}
    assert not fix.destructive


def test_no_posture_action_without_drift() -> None:
    assert plan_of(snapshot(bifrost_target([], client_config=SAFE))).actions == []
    # an older build that reports only the predecessor setting is judged by it
    older = {"drop_excess_requests": False, "enforce_governance_header": True, "disable_content_logging": True}
    assert plan_of(snapshot(bifrost_target([], client_config=older))).actions == []


# -- session_delete and tombstone_backfill -----------------------------------------------------------------

SESSIONS = [
    ("confirmed:0", 1, OLD),  # tombstoned: deleted before, brought back by a late write
    ("suspect:0", 1, OLD),  # one idle trace, nothing proves it was deleted
    ("live:0", 1, FRESH),  # a live session with its first trace: never an orphan
    ("busy:0", 3, OLD),  # many traces: not an orphan however idle
]


def test_session_delete_for_confirmed_orphans_only() -> None:
    plan = plan_of(snapshot(rllm_target(SESSIONS, tombstoned=("confirmed:0",))))
    deletes = [a for a in plan.actions if a.kind == "session_delete"]
    assert [a.subject for a in deletes] == ["confirmed:0"]
    assert deletes[0].details["confidence"] == "confirmed"
    assert deletes[0].details["trace_ids"] == ["confirmed:0/t0"]
    assert deletes[0].before == {"trace_count": 1} and deletes[0].after == {"trace_count": 0}
    assert deletes[0].destructive
    assert any("1 suspected orphan session(s) left out; --include-suspected" in w for w in plan.warnings)


def test_suspected_orphans_only_with_include_suspected() -> None:
    plan = plan_of(snapshot(rllm_target(SESSIONS, tombstoned=("confirmed:0",))), include_suspected=True)
    deletes = {a.subject: a for a in plan.actions if a.kind == "session_delete"}
    assert sorted(deletes) == ["confirmed:0", "suspect:0"]  # never the live or the busy session
    assert deletes["suspect:0"].details["confidence"] == "suspected"
    assert any("deletes suspected orphans" in w for w in plan.warnings)


def test_orphans_confirmed_by_earlier_deletes() -> None:
    """An id an earlier apply deleted that came back is confirmed, even while it is too fresh to be suspected."""
    sessions = [("back:0", 1, FRESH), ("live:0", 1, FRESH)]
    plan = plan_of(snapshot(rllm_target(sessions, also=("back:0",))), deleted_ids={"back:0": NOW})
    assert [(a.kind, a.subject) for a in plan.actions] == [("session_delete", "back:0")]
    assert plan.actions[0].details["confidence"] == "confirmed"
    assert plan.actions[0].details["deleted_before"] == {"deleted_at": NOW}
    # an id used again since its delete is no orphan: its trace came after the delete
    again = plan_of(snapshot(rllm_target(sessions, also=("back:0",))), deleted_ids={"back:0": FRESH - 60})
    assert again.actions == []


def test_tombstones_are_planned_before_the_deletes_on_a_guarded_store() -> None:
    snap = snapshot(rllm_target(SESSIONS, tombstoned=("confirmed:0",), guard=GUARD))
    plan = plan_of(snap, include_suspected=True, tombstone_ids=["gone:7"])
    kinds = [a.kind for a in plan.actions]
    assert kinds == ["tombstone_backfill", "session_delete", "session_delete"]
    backfill = plan.actions[0]
    assert backfill.subject == "tombstones"
    # the ids asked for; not the confirmed orphan, whose tombstone is there already, nor the suspected orphan,
    # which may be live: its delete records its tombstone itself, atomically
    assert backfill.after == {"session_ids": ["gone:7"]}
    assert backfill.before == {"tombstones": 7}
    assert not backfill.destructive
    assert not any("no tombstone guard" in w for w in plan.warnings)


def test_orphans_proven_by_an_earlier_delete_are_backfilled_and_tombstoned_ones_are_not() -> None:
    """A tombstoned orphan already has what a backfill would write (the action would end 'already-done');
    an orphan confirmed by an earlier delete has no tombstone yet and gets one before its delete."""
    sessions = [("confirmed:0", 1, OLD), ("back:0", 1, FRESH)]
    plan = plan_of(snapshot(rllm_target(sessions, tombstoned=("confirmed:0",), guard=GUARD, also=("back:0",))),
                   deleted_ids={"back:0": NOW})
    assert [(a.kind, a.subject, a.after.get("session_ids")) for a in plan.actions] == [
        ("tombstone_backfill", "tombstones", ["back:0"]),
        ("session_delete", "back:0", None), ("session_delete", "confirmed:0", None)]
    only_tombstoned = plan_of(snapshot(rllm_target(sessions[:1], tombstoned=("confirmed:0",), guard=GUARD)))
    assert [a.kind for a in only_tombstoned.actions] == ["session_delete"]


def test_tombstone_ids_alone_make_a_backfill_and_no_delete() -> None:
    plan = plan_of(snapshot(rllm_target([("live:0", 2, FRESH)], guard=GUARD)), tombstone_ids=["a:0", "b:1"])
    assert [(a.kind, a.after) for a in plan.actions] == [("tombstone_backfill", {"session_ids": ["a:0", "b:1"]})]


@pytest.mark.parametrize(("access", "address", "how"), [
    ("rest", "http://127.0.0.1:9090", "run the gateway with 'gatewayscope gateway' instead of 'rllm-model-gateway'"),
    ("sqlite", "/srv/rllm/gateway_traces.db", "gatewayscope guard install /srv/rllm/gateway_traces.db"),
])
def test_an_unguarded_store_gets_no_backfill_but_a_warning_naming_the_guard(access: str, address: str,
                                                                             how: str) -> None:
    snap = snapshot(rllm_target(SESSIONS, tombstoned=(), access=access, address=address))
    plan = plan_of(snap, include_suspected=True, tombstone_ids=["gone:7"])
    assert [(a.kind, a.subject) for a in plan.actions] == [  # no fake backfill
        ("session_delete", "confirmed:0"), ("session_delete", "suspect:0")]
    warning = next(w for w in plan.warnings if "no tombstone guard" in w)
    assert warning.endswith(f"to stop that: {how}.")


@pytest.mark.parametrize(("access", "address", "how"), [
    ("rest", "http://127.0.0.1:9090", "restart the gateway with --max-tombstones above 0"),
    ("sqlite", "/srv/rllm/gateway_traces.db",
     "re-run 'gatewayscope guard install /srv/rllm/gateway_traces.db' (its triggers are missing or altered)"),
])
def test_a_disabled_guard_gets_no_backfill_and_the_remedy_for_it(access: str, address: str, how: str) -> None:
    disabled = GuardStats(tombstones=0, capacity=0, dropped_writes=0, enabled=False)
    snap = snapshot(rllm_target(SESSIONS, tombstoned=(), guard=disabled, access=access, address=address))
    plan = plan_of(snap, include_suspected=True)
    assert {a.kind for a in plan.actions} == {"session_delete"}
    warning = next(w for w in plan.warnings if "tombstone guard is disabled" in w)
    assert warning.endswith(f"to stop that: {how}.")


# -- the plan file ---------------------------------------------------------------------------------------

def mixed_snapshot() -> Snapshot:
    return snapshot(
        bifrost_target([record("openai", 1000, 5000, custom=False),
                        record("dead__m", 1000, 5000, base_url="https://x.invalid/v1")],
                       client_config={"drop_excess_requests": True}, dead_hosts=("x.invalid",)),
        rllm_target(SESSIONS, tombstoned=("confirmed:0",), guard=GUARD),
    )


def test_plan_id_is_the_hash_of_its_content(tmp_path: Path) -> None:
    plan = plan_of(mixed_snapshot(), include_deletes=True)
    again = plan_of(mixed_snapshot(), include_deletes=True)
    assert plan.id == again.id == plan.compute_id()
    assert re.fullmatch(r"[0-9a-f]{32}", plan.id)
    later = build_plan(mixed_snapshot(), config_for(mixed_snapshot()), include_deletes=True, created_at=NOW + 1)
    assert later.id != plan.id
    assert plan_of(mixed_snapshot()).id != plan.id  # other options, other actions, other id

    path = plan.save(tmp_path / "plan.json")
    loaded = load_plan(path)
    assert loaded.id == plan.id
    assert loaded.to_dict() == plan.to_dict()
    assert [a.to_dict() for a in loaded.actions] == [a.to_dict() for a in plan.actions]


@pytest.mark.parametrize("edit", [
    lambda d: d["actions"][1]["after"].update(concurrency=1),  # a bigger shrink than planned
    lambda d: d["actions"].pop(),  # an action dropped
    lambda d: d["targets"][0].update(address="http://10.0.0.9:8080"),  # another gateway
    lambda d: d.update(warnings=[]),
])
def test_load_plan_refuses_an_edited_plan(tmp_path: Path, edit: Any) -> None:
    path = plan_of(mixed_snapshot(), include_deletes=True, tombstone_ids=["gone:7"]).save(tmp_path / "plan.json")
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    with pytest.raises(PlanError, match="was changed after it was made"):
        load_plan(path)


def test_load_plan_refuses_other_schemas_and_non_plans(tmp_path: Path) -> None:
    path = plan_of(mixed_snapshot()).save(tmp_path / "plan.json")
    data = json.loads(path.read_text())
    data["schema_version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(PlanError, match="schema 99"):
        load_plan(path)
    path.write_text("{}")
    with pytest.raises(PlanError, match="not a gatewayscope plan"):
        load_plan(path)
    with pytest.raises(PlanError, match="no such plan file"):
        load_plan(tmp_path / "missing.json")


def test_only_keeps_the_chosen_kinds() -> None:
    snap = mixed_snapshot()
    everything = plan_of(snap, include_deletes=True, include_suspected=True, tombstone_ids=["gone:7"])
    assert {a.kind for a in everything.actions} == set(ACTION_KINDS)
    only = plan_of(snap, include_deletes=True, include_suspected=True, only=("pool_shrink", "posture_fix"))
    assert [a.kind for a in only.actions] == ["posture_fix", "pool_shrink"]
    assert [a.id for a in only.actions] == ["a00001", "a00002"]
    assert not any("--allow-delete" in w for w in only.warnings)
    with pytest.raises(PlanError, match="Unknown action kind"):
        plan_of(snap, only=("pool_resize",))


def test_a_target_that_did_not_answer_is_not_planned() -> None:
    down = TargetSnapshot(name="bifrost", kind="bifrost", address="http://127.0.0.1:1", up=False,
                          started_at=NOW, duration_seconds=0.1, error="connection refused")
    plan = plan_of(snapshot(down))
    assert plan.actions == []
    assert plan.targets == [{"name": "bifrost", "kind": "bifrost", "address": "http://127.0.0.1:1", "skipped": True}]
    assert plan.warnings == ["bifrost: not planned, it did not answer (connection refused)."]


# -- no secret in a plan (real store, real HTTP) -----------------------------------------------------------

def test_a_plan_from_a_store_full_of_secrets_holds_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gatewayscope.sandbox.bifrost_emulator import (
        BifrostEmulator,
        CustomProviderConfig,
        NetworkConfig,
        ProviderRecord,
        ProxyConfig,
        Secret,
        redact,
        seed_realistic,
        seed_small,
    )
    from gatewayscope.sources.bifrost import HostResolver, read_bifrost

    password = "Plan-Admin-Pw-7731!"
    monkeypatch.setenv("GS_TEST_PLAN_PW", password)
    auth = AuthConfig(username="admin", password_env="GS_TEST_PLAN_PW")
    for seed in (seed_small, seed_realistic):
        with BifrostEmulator(auth=("admin", password)) as emu:
            seed(emu)
            # a dead record whose base URL carries credentials (a record_delete names its base URL)
            emu.put_record(ProviderRecord(
                "orgx__creds__m",
                network_config=NetworkConfig(base_url="https://bob:urlpass-9911@creds.invalid/v1?token=qtok-5521",
                                             extra_headers={"Authorization": "Bearer hdr-secret-6610"}),
                proxy_config=ProxyConfig(type="http", url=Secret("http://proxyuser:proxpw@10.1.1.1:3128"),
                                         username=Secret("proxy-user-4242"), password=Secret("proxy-pass-8484")),
                custom_provider_config=CustomProviderConfig(base_provider_type="openai")))
            target = Target(name="bifrost", kind="bifrost", url=emu.url, auth=auth)
            config = Config(targets=[target], policy=Policy())
            data = read_bifrost(target, config.policy, resolver=HostResolver())
            snap = Snapshot(taken_at=NOW, targets=[TargetSnapshot(
                name="bifrost", kind="bifrost", address=emu.url, up=True, started_at=NOW, duration_seconds=0.1,
                bifrost=data)])
            plan = build_plan(snap, config, include_deletes=True, created_at=NOW)
            text = plan.save(tmp_path / f"{seed.__name__}.json").read_text()

            secrets = {password, "urlpass-9911", "qtok-5521", "hdr-secret-6610"}
            for name in emu.record_names():
                stored = emu.get_record(name)
                assert stored is not None
                secrets.update(k.value.value for k in stored.keys)
                proxy = stored.proxy_config
                if proxy is not None:
                    secrets.update(s.value for s in (proxy.url, proxy.username, proxy.password, proxy.ca_cert_pem)
                                   if s is not None)
            secrets.discard("")
            assert len(secrets) > 10
            assert "orgx__creds__m" in {a.subject for a in plan.actions}
            leaked = sorted(s for s in secrets if s in text or redact(s) in text)
            assert leaked == [], f"{seed.__name__}: secrets in the plan file"
            assert "BEGIN CERTIFICATE" not in text
            assert not re.search(r".{4}\*{24}.{4}", text), "a masked value in the plan file"
            assert "<REDACTED>" not in text  # the gateway's FullyRedacted marker


# -- the input: findings ------------------------------------------------------------------------------------------

def test_a_plan_from_findings_is_the_plan_from_their_snapshot() -> None:
    from gatewayscope.analysis.findings import findings

    snap = snapshot(rllm_target(SESSIONS, tombstoned=("confirmed:0",), guard=GUARD, also=("back:0",)),
                    bifrost_target([record("acme__m", 1000, 5000), record("acme__gone", 1000, 5000,
                                                                            base_url="http://gone.invalid/v1")],
                                   client_config={}, dead_hosts=("gone.invalid",)))
    config = config_for(snap)
    deleted = {"back:0": NOW}
    found = findings(snap, config, deleted_ids=deleted)
    kwargs: dict[str, Any] = {"include_suspected": True, "include_deletes": True, "created_at": NOW}
    from_findings = build_plan(found, **kwargs)
    assert from_findings.to_dict() == build_plan(snap, config, deleted_ids=deleted, **kwargs).to_dict()
    # the findings decide: the orphans it found are the sessions it deletes, the records it flags the ones it acts on
    deletes = {a.subject for a in from_findings.actions if a.kind == "session_delete"}
    assert deletes == set(found.orphans["session_id"])
    record_delete = next(a for a in from_findings.actions if a.kind == "record_delete")
    assert record_delete.subject == "acme__gone"
    assert found.unreachable.row(0, named=True)["reason"] in record_delete.reason
    with pytest.raises(TypeError):
        build_plan(found, config)  # type: ignore[call-overload]
