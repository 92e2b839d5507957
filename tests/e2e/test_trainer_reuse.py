"""rLLM's trainers reuse session ids, on the real gateways, guarded and not (issue: the guard must not drop the
training data it exists to protect).

The trainers name a rollout ``{task id}:{rollout index}`` and sample a task again in later steps, so every step
writes to the ids the step before deleted (with one ``POST /sessions/batch_delete`` where the gateway has it);
the retry path deletes an id and reruns under it, without ``POST /sessions``. On each gateway flavour and each
guard (the in-process guard of ``gatewayscope gateway`` over either store, and the SQLite triggers of ``guard
install`` inside an unmodified gateway's file) this counts what each session kept, from the gateway itself:

* ids reused in the next step keep every one of their new traces;
* a delete followed at once by a rerun of the id keeps the rerun's traces;
* a straggler of one step, landing while its id is in use again, is dropped (unguarded, it joins the new use);
* the straggler race still leaves no orphan (the guards' own e2e files run it too).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gatewayscope.cli import main as cli_main
from gatewayscope.guard import sqlite as sqlite_guard
from gatewayscope.sandbox.rollouts import retry_rollout, run_rollouts, trainer_steps

pytestmark = pytest.mark.e2e

UIDS = ["task-a:0", "task-a:1", "task-b:0", "task-b:1"]
GUARDS = ["launcher-memory", "launcher-sqlite", "triggers-sqlite"]


def start(kind: str, rllm_gateway: Any, guarded_gateway: Any) -> Any:
    """A gateway with the guard ``kind`` ("unguarded-memory"/"unguarded-sqlite" for none)."""
    if kind.startswith("launcher-"):
        return guarded_gateway(kind.removeprefix("launcher-"))
    gateway = rllm_gateway(kind.split("-")[1])
    if kind == "triggers-sqlite":
        assert gateway.db_path is not None
        assert cli_main(["guard", "install", gateway.db_path]) == 0
    return gateway


@pytest.mark.parametrize("kind", GUARDS)
def test_ids_reused_in_the_next_step_keep_every_trace_and_a_straggler_of_the_old_step_is_dropped(
        kind: str, rllm_gateway: Any, guarded_gateway: Any, gateway_flavor: Any) -> None:
    gateway = start(kind, rllm_gateway, guarded_gateway)
    run = trainer_steps(gateway.url, UIDS, steps=3, calls=3, straggler=UIDS[0])
    assert run.errors == []
    assert run.batch_delete == gateway_flavor.batch_delete
    assert run.kept == [dict.fromkeys(UIDS, 3)] * 3, "every step keeps every call of every reused id"
    assert run.straggler_joined is False, "the old step's late trace did not join the new use"
    if kind == "triggers-sqlite":
        status = sqlite_guard.status(gateway.db_path)
        assert status.dropped_writes >= 1 and status.kept_after_fence >= 2 * len(UIDS) * 3


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_unguarded_the_same_steps_mix_the_straggler_into_the_next_use(store: str, rllm_gateway: Any) -> None:
    """What the guard prevents, on the plain gateway: the old step's late trace joins the new rollout."""
    gateway = rllm_gateway(store)
    run = trainer_steps(gateway.url, UIDS, steps=2, calls=3, straggler=UIDS[0])
    assert run.errors == []
    assert run.kept[0] == dict.fromkeys(UIDS, 3)
    assert run.straggler_joined is True and run.kept[1][UIDS[0]] == 4


@pytest.mark.parametrize("kind", GUARDS)
def test_a_delete_then_an_immediate_rerun_of_the_id_keeps_the_rerun(kind: str, rllm_gateway: Any,
                                                                    guarded_gateway: Any) -> None:
    """rLLM's retry: the failed attempt's session is deleted and the id rerun at once, without a create."""
    gateway = start(kind, rllm_gateway, guarded_gateway)
    first = retry_rollout(gateway.url, "task-r:0", calls=2, delete_first=False, explicit_create=False)
    assert first.errors == [] and first.trace_count == 2
    retry = retry_rollout(gateway.url, "task-r:0", calls=2, delete_first=True, explicit_create=False)
    assert retry.errors == [] and retry.deleted_before == 2
    assert retry.trace_count == 2


@pytest.mark.parametrize("kind", GUARDS)
def test_the_seed_race_still_leaves_no_orphan(kind: str, rllm_gateway: Any, guarded_gateway: Any) -> None:
    gateway = start(kind, rllm_gateway, guarded_gateway)
    run = run_rollouts(gateway.url, n_rollouts=8, n_stragglers=8, straggler_delay=1.0, calls_per_rollout=2,
                       n_live=0, group_size=4, seed=3, settle_timeout=3.0)
    assert run.errors == [] and len(run.deleted_uids) == 8
    assert all(run.in_flight_confirmed.values()), "every straggler's call was in flight at its delete"
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        listed = {s["session_id"] for s in client.get("/sessions").json()}
    assert not set(run.deleted_uids) & listed, "no deleted session came back"
