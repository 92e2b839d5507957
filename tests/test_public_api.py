"""The public API: ``import gatewayscope as gs`` and the names of ``gs.__all__``.

* ``import gatewayscope`` loads none of polars, jinja2 or the notebook stack (``-X importtime``); the notebook
  controllers import without ipywidgets, and the widget views name the extra to install when it is missing;
* every public name is presented as ``gatewayscope.<name>``, documented, and its examples run;
* the library's six lines (config, snapshot, findings, plan, save/load, apply) against the Bifrost emulator,
  with a config file and with a config built in code: a dry run writes nothing, a real apply repairs exactly
  what was planned and is journaled, and a second apply does nothing;
* the policy is recorded the same way in the scan report and in a plan.
"""

from __future__ import annotations

import ast
import doctest
import importlib
import inspect
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import gatewayscope as gs
from gatewayscope.remediate.apply import ActionResult
from gatewayscope.sandbox.bifrost_emulator import BifrostEmulator, seed_small

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("polars", "jinja2", "ipywidgets", "IPython", "matplotlib", "httpx", "prometheus_client")
EXTRA = "pip install 'gatewayscope[notebook]'"


def python(code: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, check=False)


def imported(importtime_stderr: str) -> set[str]:
    """The modules an ``-X importtime`` run imported (the last column of its report)."""
    return {line.rsplit("|", 1)[-1].strip() for line in importtime_stderr.splitlines()
            if line.startswith("import time:") and "|" in line} - {"imported package"}


# -- import cost --------------------------------------------------------------------------------------------

@pytest.mark.e2e  # starts a process
def test_import_gatewayscope_loads_no_dataframe_template_or_notebook_library() -> None:
    run = python("import gatewayscope", "-X", "importtime")
    assert run.returncode == 0, run.stderr
    modules = imported(run.stderr)
    assert "gatewayscope" in modules
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert heavy == [], f"import gatewayscope imported {heavy}"
    assert sorted(m for m in modules if m.startswith("gatewayscope.")) == []


@pytest.mark.e2e  # starts a process
def test_the_notebook_controllers_import_without_ipywidgets_and_the_views_load_it_on_use() -> None:
    run = python("import sys, gatewayscope.notebook as nb\n"
                 "from gatewayscope.notebook import ScanController, PlanController\n"
                 "print('ipywidgets' in sys.modules)\n"
                 "nb.SnapshotView\n"
                 "print('ipywidgets' in sys.modules)")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "True"]


@pytest.mark.e2e  # starts a process
def test_the_views_without_ipywidgets_say_which_extra_to_install() -> None:
    # ipywidgets made unimportable, as in an install without the notebook extra
    run = python("import sys\n"
                 "sys.modules['ipywidgets'] = None\n"
                 "from gatewayscope.notebook import PlanController, ScanController\n"
                 "ScanController()\n"
                 "try:\n"
                 "    from gatewayscope.notebook import SnapshotView\n"
                 "except ImportError as err:\n"
                 "    print(err)\n")
    assert run.returncode == 0, run.stderr
    assert EXTRA in run.stdout and "SnapshotView" in run.stdout


# -- the names ------------------------------------------------------------------------------------------------

def public_names() -> list[str]:
    return [name for name in gs.__all__ if name != "__version__"]


#: public names still without a docstring of their own (a dataclass's generated signature does not count)
UNDOCUMENTED = {"Config"}


def test_every_public_name_is_presented_as_gatewayscope_and_documented() -> None:
    assert len(gs.__all__) == len(set(gs.__all__))
    undocumented = set()
    for name in public_names():
        value = getattr(gs, name)
        assert value.__module__ == "gatewayscope", name
        doc = (inspect.getdoc(value) or "").strip()
        if not doc or doc.startswith(f"{name}("):
            undocumented.add(name)
    assert undocumented <= UNDOCUMENTED, f"no docstring: {sorted(undocumented - UNDOCUMENTED)}"
    assert set(gs.__all__) <= set(dir(gs))
    assert issubclass(gs.PlanError, gs.GatewayscopeError) and issubclass(gs.AuthError, gs.SourceError)
    assert all(issubclass(getattr(gs, n), gs.GatewayscopeError) for n in public_names() if n.endswith("Error"))
    assert gs.ConfigError is importlib.import_module("gatewayscope.errors").ConfigError
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        gs.nope  # noqa: B018


def test_type_checkers_see_the_same_names_as_the_module() -> None:
    tree = ast.parse((ROOT / "gatewayscope" / "__init__.py").read_text())
    checking = next(node for node in tree.body if isinstance(node, ast.If)
                    and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
    names = {alias.asname or alias.name for node in checking.body if isinstance(node, ast.ImportFrom)
             for alias in node.names}
    assert names == set(public_names())


def test_the_examples_of_every_public_name_run() -> None:
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    ran = 0
    for name in public_names():
        value = getattr(gs, name)
        source = importlib.import_module(gs._SOURCES[name])  # the names its examples see
        for test in finder.find(value, name, module=False, globs=dict(vars(source))):
            if test.examples:
                ran += 1
                result = runner.run(test, out=lambda _text: None)
                assert result.failed == 0, f"the example of {test.name} fails"
    assert ran >= 5  # findings, take_snapshot, build_plan, apply_plan, Policy.to_dict


# -- the six lines ---------------------------------------------------------------------------------------------

@pytest.fixture
def emu() -> Iterator[BifrostEmulator]:
    with BifrostEmulator() as emulator:
        seed_small(emulator)
        yield emulator


def over_pool(emu: BifrostEmulator, policy: gs.Policy) -> list[str]:
    state = emu.state_snapshot()
    return [row["name"] for row in state["records"]
            if row["concurrency"] > (policy.custom_pool if row["kind"] == "custom" or row["name"].endswith(
                "__anthropic") else policy.standard_pool)]


def writes(emu: BifrostEmulator) -> list[tuple[str, str]]:
    return [(r.method, r.path) for r in emu.requests() if r.method in ("PUT", "POST", "DELETE")]


def test_the_six_lines_repair_what_they_planned(emu: BifrostEmulator, tmp_path: Path) -> None:
    (tmp_path / "gatewayscope.toml").write_text(f'[[targets]]\nname = "bifrost"\nkind = "bifrost"\n'
                                                f'url = "{emu.url}"\n')
    config = gs.load_config(tmp_path / "gatewayscope.toml")
    snapshot = gs.take_snapshot(config)
    found = gs.findings(snapshot, config)
    plan = gs.build_plan(found, include_suspected=True, include_deletes=False)
    plan.save(tmp_path / "plan.json")
    plan = gs.load_plan(tmp_path / "plan.json")

    assert isinstance(found, gs.Findings) and isinstance(plan, gs.Plan)
    assert all(isinstance(a, gs.Action) for a in plan.actions)
    over = over_pool(emu, config.policy)
    assert set(found.records.filter("over_pool")["name"]) == set(over)
    shrinks = sorted(a.subject for a in plan.actions if a.kind == "pool_shrink")
    assert shrinks == sorted(found.records.filter("over_pool").filter(~found.records.filter("over_pool")[
        "unreachable"])["name"])
    assert [a.kind for a in plan.actions if a.kind != "pool_shrink"] == ["posture_fix"]

    emu.clear_requests()
    dry = gs.apply_plan(plan, config)  # write=False: a dry run
    assert isinstance(dry, gs.ApplyReport) and dry.dry_run
    assert {r.outcome for r in dry.results} == {"would-write"} and writes(emu) == []

    settled: list[ActionResult] = []
    report = gs.apply_plan(plan, config, write=True, allow_delete=True, journal=str(tmp_path / "apply.jsonl"),
                           concurrency=2, on_result=settled.append)
    assert report.tally()["done"] == len(plan.actions) == len(settled) and report.exit_code == 0
    assert sorted(over_pool(emu, config.policy)) == sorted(set(over) - set(shrinks))  # the unreachable remain
    assert emu.client_config() | {"drop_excess_requests": False} == emu.client_config()
    assert (tmp_path / "apply.jsonl").exists()

    again = gs.apply_plan(plan, config, write=True, journal=tmp_path / "apply.jsonl")
    assert again.already_applied and again.results == []
    fresh = gs.findings(gs.take_snapshot(config), config)
    assert fresh.counts["posture_drift"] == 0
    assert fresh.counts["records_over_pool"] == len(set(over) - set(shrinks))


def test_a_config_built_in_code_and_the_options_of_apply(emu: BifrostEmulator, tmp_path: Path) -> None:
    from gatewayscope.remediate.journal import Journal

    config = gs.Config(targets=[gs.Target(name="bf", kind="bifrost", url=emu.url)],
                       policy=gs.Policy(custom_pool=32))
    found = gs.findings(gs.take_snapshot(config), config)
    plan = gs.build_plan(found, include_deletes=True)
    assert {a.kind for a in plan.actions} == {"posture_fix", "pool_shrink", "record_delete"}
    assert all(a.after["concurrency"] == 32 for a in plan.actions
               if a.kind == "pool_shrink" and a.details["record_kind"] == "custom")

    with pytest.raises(gs.PlanError, match="needs a journal"):
        gs.apply_plan(plan, config, write=True)
    journal = Journal(tmp_path / "journal.jsonl")  # a Journal works as well as a path
    report = gs.apply_plan(plan, config, write=True, journal=journal)  # without allow_delete
    deletes = {a.id for a in plan.actions if a.destructive}
    assert {r.action_id for r in report.skipped} == deletes and report.exit_code == 1
    assert all(emu.get_record(a.subject) is not None for a in plan.actions if a.destructive)
    report = gs.apply_plan(plan, config, write=True, allow_delete=True, journal=journal)
    assert [r.action_id for r in report.results] == sorted(deletes) and report.exit_code == 0

    with pytest.raises(TypeError, match="findings"):
        gs.build_plan(found, deleted_ids=["x"])  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="config"):
        gs.build_plan(found.snapshot)  # type: ignore[call-overload]


def test_an_apply_report_prints_its_tally_line_and_counts_its_outcomes() -> None:
    report = gs.ApplyReport(plan_id="p", dry_run=False, results=[
        ActionResult("a00001", "pool_shrink", "bf", "r1", outcome="done"),
        ActionResult("a00002", "pool_shrink", "bf", "r2", outcome="done"),
        ActionResult("a00003", "record_delete", "bf", "r3", outcome="refused", detail="400"),
    ])
    assert str(report) == "2 done, 1 refused, 0 unconfirmed, 0 gone, 0 stale, 0 already-done"
    assert report.counts == {"done": 2, "refused": 1, "unconfirmed": 0, "gone": 0, "stale": 0, "already-done": 0}
    dry = gs.ApplyReport(plan_id="p", dry_run=True, results=[
        ActionResult("a00001", "pool_shrink", "bf", "r1", outcome="would-write"),
        ActionResult("a00002", "pool_shrink", "bf", "r2", outcome="would-write"),
        ActionResult("a00003", "session_delete", "rl", "s1", outcome="stale"),
    ])
    assert str(dry) == "dry run, nothing was sent: 2 would-write, 1 stale"
    assert str(gs.ApplyReport(plan_id="p", dry_run=True)) == "dry run, nothing was sent: no action"


def test_the_policy_is_recorded_the_same_way_in_the_report_and_the_plan(emu: BifrostEmulator) -> None:
    from gatewayscope.scan import scan_report

    policy = gs.Policy(orphan_idle_seconds=600.0, max_weight_lag=1, standard_pool=256, custom_pool=16,
                       queue_per_worker=8)
    config = gs.Config(targets=[gs.Target(name="bf", kind="bifrost", url=emu.url)], policy=policy)
    found = gs.findings(gs.take_snapshot(config), config)
    plan = gs.build_plan(found, include_suspected=True)
    assert scan_report(found)["policy"] == policy.to_dict()
    assert plan.policy == {**policy.to_dict(), "include_suspected": True, "include_deletes": False}
