"""Shared pytest fixtures, and the two rLLM gateways every gateway test runs on.

Real processes on loopback (see ``gatewayscope.sandbox.processes``): every fixture picks free ports, waits
a bounded time for its process to answer, and stops everything it started at teardown, also when the test
fails.

* ``gateway_flavor`` (function, parametrized): which rLLM gateway a test runs on, a :class:`GatewayFlavor`:

  - ``pypi-0.1.0``: PyPI's ``rllm-model-gateway`` 0.1.0, installed in the test environment (``.venv``);
  - ``upstream-main``: the gateway of the rLLM repository's main branch, installed by ``make test`` (target
    ``.venv-upstream/.installed``) into ``.venv-upstream`` from the archive the Makefile names
    (``UPSTREAM_ARCHIVE``), together with gatewayscope itself (so the guarded launcher runs under upstream's
    Python). ``$GATEWAYSCOPE_UPSTREAM_VENV`` points elsewhere.

  A flavour that is not installed is a skip that says why (for upstream: the reason ``make`` left in
  ``.venv-upstream/.unavailable``). Every test that uses ``rllm_gateway`` or ``guarded_gateway`` (or asks
  for ``gateway_flavor``) runs once per flavour; a test pins one with
  ``@pytest.mark.parametrize("gateway_flavor", ["upstream-main"], indirect=True)``. ``module_gateway_flavor``
  is the same for module-scoped fixtures.
* ``stub_worker`` (session): the stub inference worker's base URL.
* ``rllm_gateway`` (function): a factory ``rllm_gateway(store="memory" | "sqlite", *, db_path=None,
  open_store=True)`` that starts the real, unmodified ``rllm-model-gateway`` of the test's flavour in front of
  the stub worker and returns a :class:`~gatewayscope.sandbox.processes.RllmGatewayProcess` (``.url``,
  ``.db_path``, ``.process``, ``.store``). SQLite databases go under the test's ``tmp_path`` unless ``db_path``
  is given.
* ``guarded_gateway`` (function): the same for ``python -m gatewayscope.guard.gateway`` (see its docstring).

At the end of a session that selected gateway tests, the summary says how many passed on each flavour, and the
run FAILS when neither flavour passed any (all skipped: no gateway was tested at all).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest

from gatewayscope.sandbox.processes import RllmGatewayProcess, start_rllm_gateway, start_stub_worker
from tests.helpers import PYPI, UPSTREAM

ROOT = Path(__file__).resolve().parents[1]

GATEWAY_FLAVORS = (PYPI, UPSTREAM)

#: the environment ``make test`` installs the upstream gateway into (see the Makefile)
UPSTREAM_VENV = Path(os.environ.get("GATEWAYSCOPE_UPSTREAM_VENV") or ROOT / ".venv-upstream")
UPSTREAM_STAMP = UPSTREAM_VENV / ".installed"
UPSTREAM_UNAVAILABLE = UPSTREAM_VENV / ".unavailable"

#: run by the upstream environment's Python: its gateway is upstream's, and its gatewayscope is this tree
_UPSTREAM_PROBE = """
import json, sys
import rllm_model_gateway.server
from rllm_model_gateway.models import TraceRecord
import gatewayscope, gatewayscope.guard.gateway
print(json.dumps({"weight_version": "weight_version" in TraceRecord.model_fields,
                  "gatewayscope": gatewayscope.__file__}))
"""


@dataclass(frozen=True)
class GatewayFlavor:
    """One rLLM gateway the tests run on, and what it does differently (read from its source)."""

    name: str
    #: the interpreter that runs ``rllm_model_gateway`` and ``gatewayscope.guard.gateway`` for this flavour
    python: str

    @property
    def upstream(self) -> bool:
        return self.name == UPSTREAM

    @property
    def journal_mode(self) -> str:
        """The journal mode the gateway's SQLite store sets when it opens its file."""
        return "wal" if self.upstream else "delete"

    @property
    def batch_delete(self) -> bool:
        """Whether the gateway has ``POST /sessions/batch_delete``."""
        return self.upstream

    @property
    def weight_version(self) -> bool:
        """Whether the gateway has ``GET``/``POST /admin/weight_version`` and stamps traces with it."""
        return self.upstream

    def __str__(self) -> str:
        return self.name


@functools.cache
def flavor_unavailable(name: str) -> str | None:
    """Why the gateway of flavour ``name`` cannot run here, or None when it can."""
    if name == PYPI:
        if importlib.util.find_spec("rllm_model_gateway") is None:
            return "needs the 'gateway' extra (rllm-model-gateway) in the test environment"
        from rllm_model_gateway.models import TraceRecord

        if "weight_version" in TraceRecord.model_fields:
            return (f"the rllm-model-gateway in {sys.prefix} is not PyPI's 0.1.0 (its traces have a "
                    "weight_version): install PyPI's with pip install 'rllm-model-gateway==0.1.0'")
        return None
    if name != UPSTREAM:
        raise ValueError(f"unknown gateway flavour {name!r}")
    python = UPSTREAM_VENV / "bin" / "python"
    if not UPSTREAM_STAMP.exists():
        if UPSTREAM_UNAVAILABLE.exists():
            return UPSTREAM_UNAVAILABLE.read_text(errors="replace").strip() or f"see {UPSTREAM_UNAVAILABLE}"
        return f"no {UPSTREAM_STAMP} (run `make upstream`, or `make test`, which installs it)"
    try:
        probe = subprocess.run([str(python), "-c", _UPSTREAM_PROBE], capture_output=True, text=True,
                               timeout=120, cwd="/", check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"{python} does not run: {err}"
    if probe.returncode != 0:
        return f"{python} cannot import the gateway and gatewayscope: {probe.stderr.strip()[-500:]}"
    import json

    found = json.loads(probe.stdout.strip().splitlines()[-1])
    if not found["weight_version"]:
        return f"the rllm-model-gateway in {UPSTREAM_VENV} has no weight_version: it is not upstream main"
    here = (ROOT / "gatewayscope").resolve()
    if Path(found["gatewayscope"]).resolve().parent != here:
        return f"{UPSTREAM_VENV}'s gatewayscope is {found['gatewayscope']}, not this tree's ({here}): rerun make"
    return None


def flavor_python(name: str) -> str:
    return sys.executable if name == PYPI else str(UPSTREAM_VENV / "bin" / "python")


def flavor_or_skip(name: str) -> GatewayFlavor:
    """The flavour ``name``, or a skip that says why its gateway is not installed."""
    reason = flavor_unavailable(name)
    if reason is not None:
        if name == UPSTREAM:
            pytest.skip(f"upstream rLLM gateway not installed: {reason}")
        pytest.skip(f"PyPI rLLM gateway 0.1.0 not installed: {reason}")
    return GatewayFlavor(name=name, python=flavor_python(name))


@pytest.fixture(params=GATEWAY_FLAVORS)
def gateway_flavor(request: pytest.FixtureRequest) -> GatewayFlavor:
    """The rLLM gateway this test runs on (one case per flavour); skips when it is not installed."""
    return flavor_or_skip(str(request.param))


@pytest.fixture(scope="module", params=GATEWAY_FLAVORS)
def module_gateway_flavor(request: pytest.FixtureRequest) -> GatewayFlavor:
    """``gateway_flavor`` for module-scoped fixtures (a sandbox shared by a module's tests)."""
    return flavor_or_skip(str(request.param))


#: the fixtures whose parameter is the flavour a test runs on (the per-flavour tally reads them)
FLAVOR_FIXTURES = ("gateway_flavor", "module_gateway_flavor")


class RllmGatewayFactory(Protocol):
    """The type of the ``rllm_gateway`` fixture."""

    def __call__(self, store: str = "memory", *, db_path: str | Path | None = None,
                 open_store: bool = True) -> RllmGatewayProcess: ...


@pytest.fixture(scope="session")
def stub_worker() -> Iterator[str]:
    """Start the stub inference worker once per test session; yields its base URL."""
    pytest.importorskip("uvicorn", reason="the stub worker needs the 'gateway' extra")
    worker = start_stub_worker()
    try:
        yield worker.url
    finally:
        worker.stop()


@pytest.fixture
def rllm_gateway(gateway_flavor: GatewayFlavor, stub_worker: str, tmp_path: Path) -> Iterator[RllmGatewayFactory]:
    """A factory that starts unmodified rLLM gateways of the test's flavour in front of the stub worker; all
    stopped at teardown."""
    started: list[RllmGatewayProcess] = []

    def start(store: str = "memory", *, db_path: str | Path | None = None,
              open_store: bool = True) -> RllmGatewayProcess:
        if store == "sqlite" and db_path is None:
            db_path = tmp_path / f"gateway-traces-{len(started)}.db"
        gateway = start_rllm_gateway(stub_worker, store=store, db_path=db_path, open_store=open_store,
                                     python=gateway_flavor.python)
        started.append(gateway)
        return gateway

    try:
        yield start
    finally:
        for gateway in reversed(started):
            gateway.stop()


# -- the guarded gateway (gatewayscope.guard.gateway) -------------------------------------------------


class GuardedGatewayFactory(Protocol):
    """The type of the ``guarded_gateway`` fixture."""

    def __call__(self, store: str = "memory", *, max_tombstones: int | None = None,
                 db_path: str | Path | None = None, open_store: bool = True,
                 via_cli: bool = False) -> RllmGatewayProcess: ...


@pytest.fixture
def guarded_gateway(gateway_flavor: GatewayFlavor, stub_worker: str,
                    tmp_path: Path) -> Iterator[GuardedGatewayFactory]:
    """A factory that starts gatewayscope's guarded gateway (``python -m gatewayscope.guard.gateway``, or
    ``gatewayscope gateway`` with ``via_cli``) under the flavour's Python, in front of the stub worker, with
    the same flags as the ``rllm_gateway`` fixture plus ``--max-tombstones`` (the launcher's default when
    None). Returns a :class:`~gatewayscope.sandbox.processes.RllmGatewayProcess`; everything is stopped at
    teardown."""
    import httpx

    from gatewayscope.sandbox.processes import ManagedProcess, free_port, python_argv

    started: list[RllmGatewayProcess] = []

    def start(store: str = "memory", *, max_tombstones: int | None = None,
              db_path: str | Path | None = None, open_store: bool = True,
              via_cli: bool = False) -> RllmGatewayProcess:
        if store == "sqlite" and db_path is None:
            db_path = tmp_path / f"guarded-traces-{len(started)}.db"
        last: RuntimeError | None = None
        for _attempt in range(3):  # a free port can be taken between picking and binding it
            port = free_port()
            flags = ["--host", "127.0.0.1", "--port", str(port), "--store", store, "--worker", stub_worker,
                     "--log-level", "warning"]
            if db_path is not None:
                flags += ["--db-path", str(db_path)]
            if max_tombstones is not None:
                flags += ["--max-tombstones", str(max_tombstones)]
            argv = ([gateway_flavor.python, "-c", "from gatewayscope.cli import run; run()", "gateway", *flags]
                    if via_cli else python_argv("gatewayscope.guard.gateway", *flags, python=gateway_flavor.python))
            proc = ManagedProcess(f"guarded-gateway-{store}", argv)
            url = f"http://127.0.0.1:{port}"
            gateway = RllmGatewayProcess(url=url, process=proc, store=store, worker_url=stub_worker,
                                         db_path=str(db_path) if db_path is not None else None)
            started.append(gateway)
            try:
                proc.wait_http(url + "/health")
                if open_store:  # see start_rllm_gateway: 0.1.0's SQLite store opens lazily, unguarded
                    httpx.get(f"{url}/sessions", params={"limit": 1}, timeout=30.0).raise_for_status()
            except (RuntimeError, httpx.HTTPError) as err:
                proc.stop()
                last = RuntimeError(f"the guarded gateway did not start ({err}):\n{proc.output()[-4000:]}")
                continue
            return gateway
        assert last is not None
        raise last

    try:
        yield start
    finally:
        for gateway in reversed(started):
            gateway.stop()


# -- per-flavour tally, and the run fails when no gateway was tested at all -----------------------------


class _Tally:
    """Gateway tests by flavour: selected, and their outcomes (``passed`` counts call phases that passed)."""

    def __init__(self) -> None:
        self.flavor_of: dict[str, str] = {}
        self.outcomes: dict[str, Counter[str]] = {name: Counter() for name in GATEWAY_FLAVORS}
        self.skip_reasons: dict[str, set[str]] = {name: set() for name in GATEWAY_FLAVORS}
        self.verdict: str | None = None

    def selected(self) -> int:
        return len(self.flavor_of)

    def passed(self, name: str) -> int:
        return self.outcomes[name]["passed"]


_TALLY = _Tally()


def pytest_collection_finish(session: pytest.Session) -> None:
    _TALLY.flavor_of.clear()
    for item in session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        for fixture in FLAVOR_FIXTURES:
            if params.get(fixture) in GATEWAY_FLAVORS:
                _TALLY.flavor_of[item.nodeid] = str(params[fixture])


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    flavor = _TALLY.flavor_of.get(report.nodeid)
    if flavor is None:
        return
    counts = _TALLY.outcomes[flavor]
    if report.skipped:
        if hasattr(report, "wasxfail"):
            counts["xfailed"] += 1
        else:
            counts["skipped"] += 1
            if isinstance(report.longrepr, tuple):
                _TALLY.skip_reasons[flavor].add(str(report.longrepr[2]).removeprefix("Skipped: "))
    elif report.failed:
        counts["failed" if report.when == "call" else "error"] += 1
    elif report.when == "call":
        counts["xpassed" if hasattr(report, "wasxfail") else "passed"] += 1


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if session.config.option.collectonly or not _TALLY.selected():
        return
    if int(exitstatus) in (int(pytest.ExitCode.INTERRUPTED), int(pytest.ExitCode.INTERNAL_ERROR)):
        return
    if not any(_TALLY.passed(name) for name in GATEWAY_FLAVORS):
        _TALLY.verdict = (f"FAILED: {_TALLY.selected()} gateway tests were selected and none passed on any "
                          f"gateway ({', '.join(GATEWAY_FLAVORS)}): no rLLM gateway was tested")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _TALLY.selected():
        return
    terminalreporter.section("rLLM gateways tested")
    for name in GATEWAY_FLAVORS:
        counts = _TALLY.outcomes[name]
        rest = ", ".join(f"{counts[k]} {k}" for k in ("failed", "error", "skipped", "xfailed", "xpassed") if counts[k])
        terminalreporter.write_line(f"{name}: {counts['passed']} gateway tests passed" + (f" ({rest})" if rest else ""))
        for reason in sorted(_TALLY.skip_reasons[name])[:3]:
            terminalreporter.write_line(f"    skipped: {reason}")
    if _TALLY.verdict:
        terminalreporter.write_line(_TALLY.verdict, red=True, bold=True)


# -- make unit: no process started ---------------------------------------------------------------------------

#: set by ``make unit``: a test that is not marked e2e and starts a process fails, saying to move it
UNIT_ONLY_ENV = "GATEWAYSCOPE_UNIT_TESTS"
E2E_DIR = Path(__file__).resolve().parent / "e2e"


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test under tests/e2e/ is an e2e test, whether or not its module says so."""
    for item in items:
        if E2E_DIR in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(autouse=True)
def _no_process_in_unit_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``make unit`` (``$GATEWAYSCOPE_UNIT_TESTS`` set), starting a process fails the test: the fast loop
    stays fast and says so when a test outgrows it."""
    if not os.environ.get(UNIT_ONLY_ENV) or request.node.get_closest_marker("e2e"):
        return
    import subprocess

    def refuse(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        raise AssertionError(f"a unit test started a process ({args!r}): move it to tests/e2e/ (make e2e runs it)")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
