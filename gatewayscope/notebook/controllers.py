"""Controllers for the notebooks: state holders over the public API; the widgets only bind to them.

* :class:`ScanController`: targets (a config file, or rLLM/Bifrost addresses) -> a Snapshot through
  :func:`gatewayscope.take_snapshot` -> its :func:`gatewayscope.findings`, made once per snapshot and
  exposed as polars frames (orphans, records, pools, boot survival, posture, guard), as HTML through the
  same jinja2 templates the CLI uses, as charts, and saves a snapshot for a bug report.
* :class:`PlanController`: a plan built from the scan controller's findings (or loaded from a file),
  a per-action selection with kind and target filters, the before/after diff, a dry run, and a real
  apply that needs a typed confirmation (a prefix of at least 8 characters of the id of the plan that
  is applied) and, for deletes, a second one (the number of deletes). Progress is reported live through
  callbacks; the outcome tally and the journal are exposed as tables.

Everything a widget can do is a method here, so tests drive the controllers (and click the widgets'
buttons) without a kernel, and a notebook run unattended by papermill does the same through its parameters.
Nothing here imports ipywidgets: the views live in :mod:`gatewayscope.notebook.widgets`.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import os
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import polars as pl

from gatewayscope.analysis.findings import Findings, findings
from gatewayscope.config import Config, Policy, Target, build_config, is_remote_address
from gatewayscope.errors import ConfigError, GatewayscopeError, PlanError
from gatewayscope.notebook.wording import notebook_words
from gatewayscope.orphan_rule import delete_fences
from gatewayscope.remediate.apply import ActionResult, ApplyOptions, ApplyReport, apply_plan
from gatewayscope.remediate.journal import FINAL_OUTCOMES, Journal
from gatewayscope.remediate.plan import ACTION_KINDS, Action, Plan, build_plan, load_plan, plan_summary
from gatewayscope.remediate.review import before_after, render_plan
from gatewayscope.render import human_bytes, human_seconds, render, terminal_safe
from gatewayscope.scan import scan_report, take_snapshot
from gatewayscope.snapshot import Snapshot

#: the sections of the snapshot view, in the order the triage notebook looks at them
SECTIONS = ("targets", "leak", "pools", "boot", "posture")
#: the shortest plan-id prefix accepted as the confirmation of a real apply
MIN_CONFIRMATION_CHARS = 8
#: rows an HTML table shows before saying how many more there are
DEFAULT_MAX_ROWS = 200
#: the config file used when none is given (the same variable the command line reads)
CONFIG_ENV = "GATEWAYSCOPE_CONFIG"
#: where a notebook's files go when no run_dir is given: one folder per run, under the working directory
RUNS_FOLDER = "gatewayscope-runs"
#: actions the review shows at once; the pages and the filters reach the rest
DEFAULT_PAGE_SIZE = 20
#: action rows one run's record lists before saying how many more there are
RECORD_MAX_ROWS = 200


def run_directory(run_dir: str | Path | None = None, *, now: dt.datetime | None = None) -> Path:
    """The folder a notebook run writes its files to (snapshot export, ``plan-<id>.json``, the journal).

    ``run_dir`` when given; otherwise ``./gatewayscope-runs/<UTC timestamp>/`` (under the working
    directory, which ``.gitignore`` ignores wherever it is). Not created here: what writes there creates it.

    >>> run_directory(now=dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)).as_posix()
    'gatewayscope-runs/20260102T030405Z'
    >>> run_directory("runs/today").as_posix()
    'runs/today'
    """
    if run_dir is not None and str(run_dir).strip():
        return Path(str(run_dir).strip())
    when = (now or dt.datetime.now(dt.timezone.utc)).astimezone(dt.timezone.utc)
    return Path(RUNS_FOLDER) / when.strftime("%Y%m%dT%H%M%SZ")


def _escape(value: Any) -> str:
    """Any text for hand-built HTML: markup escaped, control and bidi characters shown as escapes."""
    return html.escape(terminal_safe(str(value)))


class ConfirmationError(PlanError):
    """A real apply was asked for without the right typed confirmation; nothing was written."""

    kind = "confirmation"


def render_table(frame: pl.DataFrame | Sequence[dict[str, Any]], *, title: str = "", empty: str = "",
                 max_rows: int = DEFAULT_MAX_ROWS, css_class: str = "frame",
                 formats: dict[str, Callable[[Any], str]] | None = None) -> str:
    """Any frame (or list of dict rows) as an HTML table through ``table.html.j2``.

    ``formats`` maps a column to a function that formats its cells (default: ``str``, ``-`` for null);
    numeric columns are right-aligned.

    >>> html = render_table(pl.DataFrame({"kind": ["custom"], "workers": [1000]}), title="pools")
    >>> "<th>workers</th>" in html and '<td class="num">1,000</td>' in html
    True
    """
    if not isinstance(frame, pl.DataFrame):
        frame = pl.DataFrame(list(frame)) if frame else pl.DataFrame()
    formats = formats or {}
    numeric = [name for name, dtype in frame.schema.items() if dtype.is_numeric()]

    def cell(column: str, value: Any) -> str:
        if column in formats:
            return formats[column](value)
        if value is None:
            return "-"
        if isinstance(value, bool):
            return "yes" if value else "no"
        if isinstance(value, int):
            return f"{value:,}"
        if isinstance(value, float):
            return f"{value:,.1f}"
        return str(value)

    shown = frame.head(max_rows)
    rows = [[cell(c, v) for c, v in zip(shown.columns, row, strict=True)] for row in shown.iter_rows()]
    return render("table.html.j2", title=title, columns=list(frame.columns), rows=rows, numeric=numeric,
                  empty=empty or "Nothing to show.", more=max(0, frame.height - shown.height), css_class=css_class)


class ScanController:
    """Targets -> a Snapshot -> findings as frames, HTML and charts. Holds the last snapshot.

    Give a ``config_path`` (a gatewayscope.toml), rLLM ``trace_stores`` (URLs or SQLite paths) and
    ``bifrost_urls`` (the flags' quick look), or a ready ``config``. ``transports`` maps a target name
    to an httpx transport (tests); ``deleted_ids`` are the sessions known to have been deleted before, each
    with the moment of that delete (``{target: {id: epoch seconds}}`` from
    :func:`gatewayscope.remediate.journal.deleted_sessions` of an earlier apply's journal, or ``{id: seconds}``
    for every target): they confirm an orphan whose traces all came before that delete.
    """

    def __init__(self, config_path: str | Path | None = None, *, trace_stores: Sequence[str] = (),
                 bifrost_urls: Sequence[str] = (), config: Config | None = None,
                 orphan_idle_seconds: float | None = None, transports: dict[str, Any] | None = None,
                 deleted_ids: Mapping[str, Any] | None = None) -> None:
        self.transports: dict[str, Any] = dict(transports or {})
        delete_fences(deleted_ids)  # refuses ids without the moment of their delete
        self.deleted_ids: dict[str, Any] = dict(deleted_ids or {})
        self.snapshot: Snapshot | None = None
        self.config_path: str = ""
        self.trace_stores: list[str] = []
        self.bifrost_urls: list[str] = []
        self.orphan_idle_seconds = orphan_idle_seconds
        self._listeners: list[Callable[[ScanController], None]] = []
        self._findings: Findings | None = None
        self._report: dict[str, Any] | None = None
        self._lock = threading.Lock()
        if config is not None:
            self.config: Config = config
            self.config_path = config.source or ""
        else:
            self.set_targets(config_path, trace_stores=trace_stores, bifrost_urls=bifrost_urls)

    # -- targets ---------------------------------------------------------------------------------

    def set_targets(self, config_path: str | Path | None = None, *, trace_stores: Sequence[str] = (),
                    bifrost_urls: Sequence[str] = ()) -> Config:
        """Point the controller at other targets (validated now: a wrong file raises ConfigError).

        Forgets the previous snapshot. With no ``config_path`` (an empty config box), the file named by
        ``$GATEWAYSCOPE_CONFIG`` is used when the variable is set, as the command line does.
        """
        path = str(config_path).strip() if config_path else ""
        stores = [s.strip() for s in trace_stores if s and s.strip()]
        bifrosts = [s.strip() for s in bifrost_urls if s and s.strip()]
        effective = path or self.env_config_path()
        if effective or stores or bifrosts:
            config = build_config(effective or None, trace_stores=stores, bifrost_urls=bifrosts,
                                  orphan_idle_seconds=self.orphan_idle_seconds)
        else:  # nothing yet: the target picker asks for it, scan() says so
            config = Config(targets=[], policy=Policy())
            if self.orphan_idle_seconds is not None:
                config.policy.orphan_idle_seconds = self.orphan_idle_seconds
        self.config = config
        self.config_path, self.trace_stores, self.bifrost_urls = path, stores, bifrosts
        self.snapshot = None
        self._findings, self._report = None, None
        self._notify()
        return config

    @staticmethod
    def env_config_path() -> str:
        """The config file ``$GATEWAYSCOPE_CONFIG`` names (empty when unset): used when no config_path is given."""
        return os.environ.get(CONFIG_ENV, "").strip()

    @property
    def config_in_use(self) -> str:
        """The config file the targets came from: the given one, else ``$GATEWAYSCOPE_CONFIG``'s (or empty)."""
        return self.config.source or ""

    @property
    def target_names(self) -> list[str]:
        """The configured targets' names, in config order."""
        return [t.name for t in self.config.targets]

    def subscribe(self, callback: Callable[[ScanController], None]) -> None:
        """Call ``callback(self)`` whenever the snapshot or the targets change (the widgets refresh)."""
        self._listeners.append(callback)

    def _notify(self) -> None:
        for callback in list(self._listeners):
            callback(self)

    # -- reading ---------------------------------------------------------------------------------

    def scan(self, *, on_target_done: Callable[[str, bool], None] | None = None) -> Snapshot:
        """Read every target now (concurrently; a target that fails is reported, never raised)."""
        def done(snap: Any) -> None:
            if on_target_done is not None:
                on_target_done(snap.name, bool(snap.up))

        if not self.config.targets:
            raise ConfigError("No targets: give a config file (config_path, or $GATEWAYSCOPE_CONFIG) or rLLM / "
                              "Bifrost addresses (the target picker, or trace_stores / bifrost_urls).")
        snapshot = take_snapshot(self.config, transports=self.transports, on_target_done=done,
                                 also_sessions=self.deleted_ids)
        with self._lock:
            self.snapshot = snapshot
            self._findings, self._report = None, None
        self._notify()
        return snapshot

    def load_snapshot(self, folder: str | Path) -> Snapshot:
        """Analyse a snapshot saved earlier (``export_snapshot``, ``scan --save-snapshot``) instead of reading."""
        snapshot = Snapshot.load(folder)
        known = set(self.target_names)
        for snap in snapshot.targets:
            if snap.name not in known:  # a target of the snapshot's own: analysed with the default limits
                remote = is_remote_address(snap.address)
                self.config.targets.append(Target(name=snap.name, kind=snap.kind, url=snap.address if remote else None,
                                                  path=None if remote else snap.address))
        with self._lock:
            self.snapshot = snapshot
            self._findings, self._report = None, None
        self._notify()
        return snapshot

    def require_snapshot(self) -> Snapshot:
        """The last snapshot; raises a sentence saying what to do when there is none."""
        if self.snapshot is None:
            raise GatewayscopeError("No snapshot yet: scan the targets first (the Scan button, or scan()).")
        return self.snapshot

    def export_snapshot(self, folder: str | Path) -> Path:
        """Save the snapshot for a bug report: parquet frames + manifest, plus ``report.json`` (no secrets).

        ``gatewayscope scan --load-snapshot FOLDER`` re-runs the analysis offline.
        """
        snapshot = self.require_snapshot()
        out = snapshot.save(folder)
        (out / "report.json").write_text(json.dumps(self.report(), indent=2, sort_keys=True, default=str) + "\n")
        return out

    # -- findings --------------------------------------------------------------------------------

    def findings(self) -> Findings:
        """The findings of the last snapshot (:func:`gatewayscope.findings`), made again only when the
        snapshot, the policy or the deleted ids change."""
        snapshot = self.require_snapshot()
        with self._lock:
            found = self._findings
            if (found is None or found.snapshot is not snapshot or found.policy != self.config.policy
                    or found.deleted_ids != self.deleted_ids):
                found = self._findings = findings(snapshot, self.config, deleted_ids=self.deleted_ids)
                self._report = None
            return found

    def report(self) -> dict[str, Any]:
        """The scan report (the shape of ``gatewayscope scan --format json``) of :meth:`findings`."""
        found = self.findings()
        with self._lock:
            if self._report is None:
                self._report = scan_report(found)
            return self._report

    def targets_frame(self) -> pl.DataFrame:
        """One row per target: name, kind, address, up, error, read duration, warnings."""
        return pl.DataFrame(
            [{"target": t.name, "kind": t.kind, "address": t.address, "up": t.up, "error": t.error,
              "duration_seconds": round(t.duration_seconds, 3), "warnings": len(t.warnings)}
             for t in self.findings().targets],
            schema={"target": pl.String, "kind": pl.String, "address": pl.String, "up": pl.Boolean,
                    "error": pl.String, "duration_seconds": pl.Float64, "warnings": pl.Int64})

    def orphans_frame(self) -> pl.DataFrame:
        """Every orphan session of every rLLM target (``target`` first, then ORPHANS_SCHEMA)."""
        return self.findings().orphans

    def orphan_tasks_frame(self) -> pl.DataFrame:
        """Orphans grouped by target and task, most first (stragglers of one hard task come together)."""
        return self.findings().orphans_by_task

    def records_frame(self) -> pl.DataFrame:
        """Every Bifrost record with its kind, pool policy, what it parks, and whether it is unreachable."""
        found = self.findings()
        order = {t.name: index for index, t in enumerate(found.targets)}
        # targets in config order, each target's records by parked workers (most first), then name
        return (found.records.select("target", "name", "kind", "concurrency", "buffer_size", "target_pool",
                                     "target_queue", "over_pool", "parked_workers", "queue_slots", "stack_bytes_low",
                                     "stack_bytes_high", "base_url", "provider_status", "unreachable",
                                     "unreachable_reason")
                .sort(pl.col("target").replace_strict(order, return_dtype=pl.Int64), pl.col("parked_workers"),
                      pl.col("name"), descending=[False, True, False]))

    def pools_frame(self) -> pl.DataFrame:
        """Per Bifrost target and kind: records, parked workers, queue slots, records over pool, pool policy,
        and the boot stack memory at 2 and 8 KiB per worker."""
        return self.findings().pools

    def boot_frame(self) -> pl.DataFrame:
        """Per Bifrost target: would it survive a restart? Stack memory (low/high) against its limit."""
        return self.findings().boot

    def memory_frame(self) -> pl.DataFrame:
        """Per Bifrost target: the boot-memory prediction of the model used (measured from the gateway's runtime
        metrics, or the band), the measured figures beside it, and why the band was used."""
        return self.findings().memory

    def posture_frame(self) -> pl.DataFrame:
        """Per Bifrost target and posture setting: the value reported, the safe value, drifted or not."""
        return self.findings().posture

    def guard_frame(self) -> pl.DataFrame:
        """Per rLLM target: the tombstone guard's figures (null where no guard is installed)."""
        return self.findings().guard

    # -- views -----------------------------------------------------------------------------------

    def text(self, *, show_orphans: int = 10) -> str:
        """The scan as ``gatewayscope scan`` prints it (scan.txt.j2)."""
        return render("scan.txt.j2", report=self.report(), show_orphans=max(0, show_orphans))

    def html(self, sections: Iterable[str] = SECTIONS, *, target: str | None = None, show_orphans: int = 20) -> str:
        """The scan report as HTML (scan.html.j2), limited to ``sections`` and, optionally, one target."""
        from gatewayscope.analysis.posture import SAFE_POSTURE

        chosen = list(sections)
        unknown = set(chosen) - set(SECTIONS)
        if unknown:
            raise GatewayscopeError(f"Unknown section(s) {', '.join(sorted(unknown))}; choose from "
                                    f"{', '.join(SECTIONS)}.")
        report = self.report()
        if target:
            report = {**report, "targets": [t for t in report["targets"] if t["name"] == target]}
        return render("scan.html.j2", report=report, sections=chosen, show_orphans=max(0, show_orphans),
                      safe_posture=SAFE_POSTURE)

    def orphans_html(self, *, max_rows: int = DEFAULT_MAX_ROWS) -> str:
        """The orphan sessions of every rLLM target as a table."""
        frame = self.orphans_frame()
        if frame.height:
            frame = frame.select("target", "confidence", "session_id", "trace_count", "idle_seconds",
                                 "weight_lag", "prompt_tokens", "reason")
        return render_table(frame, title="Orphan sessions", empty="No orphan sessions.", max_rows=max_rows,
                            formats={"idle_seconds": human_seconds})

    def records_html(self, *, only_findings: bool = True, max_rows: int = DEFAULT_MAX_ROWS) -> str:
        """Bifrost records as a table; by default only those over pool or unreachable."""
        frame = self.records_frame()
        if frame.height:
            if only_findings:
                frame = frame.filter(pl.col("over_pool") | pl.col("unreachable"))
            frame = frame.select("target", "name", "kind", "concurrency", "target_pool", "parked_workers",
                                 "stack_bytes_high", "over_pool", "unreachable", "unreachable_reason")
        title = "Records over pool or unreachable" if only_findings else "Provider records"
        return render_table(frame, title=title, empty="No record over its pool, none unreachable.",
                            max_rows=max_rows, formats={"stack_bytes_high": human_bytes})

    def chart(self, name: str) -> bytes:
        """A chart as PNG bytes: ``boot_memory``, ``orphan_ages`` or ``weight_lag``."""
        from gatewayscope.notebook import charts

        if name == "boot_memory":
            return charts.boot_memory_chart(self.pools_frame(), self.boot_frame(), self.memory_frame())
        if name == "orphan_ages":
            return charts.orphan_age_chart(self.orphans_frame())
        if name == "weight_lag":
            return charts.weight_lag_chart(self.orphans_frame())
        raise GatewayscopeError(f"Unknown chart {name!r}; choose from {', '.join(charts.CHARTS)}.")

    def counts(self) -> dict[str, int]:
        """Headline numbers for checks and verification: orphans, records over pool, drifted settings,
        unreachable records, and targets down."""
        return self.findings().counts


# -- the plan -------------------------------------------------------------------------------------------


@dataclass
class Progress:
    """How far an apply (or a dry run) is: actions settled of the total, and the last result."""

    total: int = 0
    settled: int = 0
    last: ActionResult | None = None
    dry_run: bool = True
    running: bool = False


@dataclass
class RunRecord:
    """One dry run or apply, as the notebook keeps it for its record (:meth:`PlanController.record_html`)."""

    dry_run: bool
    plan_id: str
    parent_plan_id: str
    at: str
    results: list[ActionResult]
    resumed: int
    tally_line: str
    journal: str = ""
    plan_file: str = ""
    already_applied: bool = False
    stopped_early: str = ""

    def html(self, *, max_rows: int = RECORD_MAX_ROWS) -> str:
        """This run as static HTML (every value escaped): what ran on which plan, the tally line, the journal."""
        what = "Dry run" if self.dry_run else "Apply"
        head = f"<b>{what}</b> of plan <code>{_escape(self.plan_id)}</code> at {_escape(self.at)}"
        if self.parent_plan_id and self.parent_plan_id != self.plan_id:
            head += f" (a selection of plan <code>{_escape(self.parent_plan_id)}</code>)"
        lines = [f"<p>{head}</p>", f'<p class="tally"><code>{_escape(self.tally_line)}</code></p>']
        if self.already_applied:
            lines.append("<p>This plan was already applied (see the journal); nothing was sent.</p>")
        if self.resumed:
            lines.append(f"<p>Resumed: {self.resumed} action(s) were settled by an earlier run.</p>")
        if self.stopped_early:
            lines.append(f"<p>{_escape(self.stopped_early)}.</p>")
        if self.results:
            rows = "".join(f"<tr><td>{_escape(r.action_id)}</td><td>{_escape(r.kind)}</td><td>{_escape(r.target)}"
                           f"</td><td><code>{_escape(r.subject)}</code></td><td>{_escape(r.outcome)}</td></tr>"
                           for r in self.results[:max_rows])
            lines.append("<table><tr><th>action</th><th>kind</th><th>target</th><th>subject</th><th>outcome</th>"
                         f"</tr>{rows}</table>")
            if len(self.results) > max_rows:
                lines.append(f"<p>... and {len(self.results) - max_rows} more (see the journal).</p>")
        if self.journal:
            lines.append(f"<p>Journal: <code>{_escape(self.journal)}</code></p>")
        if self.plan_file:
            lines.append(f"<p>Plan file: <code>{_escape(self.plan_file)}</code></p>")
        return "".join(lines)


def _format_value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, list):
        return f"{len(value)} id(s)"
    return str(value)


def diff_rows(action: Action) -> list[dict[str, Any]]:
    """What one action changes, one row per field: ``field``, ``before``, ``after`` (as text).

    >>> a = Action(id="a00001", kind="pool_shrink", target="b", subject="acme__m",
    ...            before={"concurrency": 1000, "buffer_size": 5000}, after={"concurrency": 64, "buffer_size": 1024},
    ...            reason="", fingerprint="")
    >>> [(r["field"], r["before"], r["after"]) for r in diff_rows(a)]
    [('concurrency', '1,000', '64'), ('buffer_size', '5,000', '1,024')]
    """
    if action.kind == "session_delete":
        changes = [("session", f"{_format_value(action.before.get('trace_count'))} trace(s)", "deleted")]
    elif action.kind == "record_delete":
        changes = [("record", f"{_format_value(action.before.get('concurrency'))} workers, base URL "
                              f"{action.before.get('base_url') or 'none'}", "deleted")]
    elif action.kind == "tombstone_backfill":
        ids = action.after.get("session_ids") or []
        changes = [("tombstones", _format_value(action.before.get("tombstones")), f"+ {len(ids)} id(s)")]
    else:
        keys = list(dict.fromkeys([*action.before, *action.after]))
        changes = [(k, _format_value(action.before.get(k)), _format_value(action.after.get(k))) for k in keys]
    return [{"id": action.id, "kind": action.kind, "target": action.target, "subject": action.subject,
             "field": name, "before": before, "after": after, "destructive": action.destructive}
            for name, before, after in changes]


class PlanController:
    """A plan for review: build or load it, select actions, diff, dry-run, and apply with confirmation.

    ``scan`` supplies the snapshot and the config (targets and credentials). ``journal_path`` is the
    append-only journal a real apply writes (required for one). ``apply_options`` sets concurrency, rate,
    max errors (``yes`` and ``allow_delete`` are decided by :meth:`apply` from the confirmations).
    ``page_size`` is how many actions a page of the review shows.
    """

    def __init__(self, scan: ScanController, *, journal_path: str | Path | None = None,
                 include_suspected: bool = False, include_deletes: bool = False, only: Collection[str] = (),
                 tombstone_ids: Collection[str] = (), apply_options: ApplyOptions | None = None,
                 page_size: int = DEFAULT_PAGE_SIZE) -> None:
        self.scan = scan
        self.journal_path: Path | None = Path(journal_path) if journal_path else None
        self.include_suspected = include_suspected
        self.include_deletes = include_deletes
        self.only: tuple[str, ...] = tuple(only)
        self.tombstone_ids: list[str] = list(tombstone_ids)
        self.apply_options = apply_options or ApplyOptions()
        self.page_size = max(1, int(page_size))
        self.page = 0
        #: every dry run and apply of this controller, oldest first: the notebook's record
        self.runs: list[RunRecord] = []
        self.plan: Plan | None = None
        self.plan_source: str = ""
        self.kind_filter: set[str] = set()
        self.target_filter: set[str] = set()
        self.progress = Progress()
        self.last_report: ApplyReport | None = None
        self.applied_plan: Plan | None = None
        self.applied_plan_path: Path | None = None
        self._selected: set[str] = set()
        #: the snapshot an apply wrote after: what it read is no longer what the targets hold
        self._written_after: Snapshot | None = None
        self._listeners: list[Callable[[PlanController], None]] = []
        self._progress_listeners: list[Callable[[Progress], None]] = []
        self._lock = threading.Lock()
        self._progress_lock = threading.Lock()

    # -- listeners -------------------------------------------------------------------------------

    def subscribe(self, callback: Callable[[PlanController], None]) -> None:
        """Call ``callback(self)`` when the plan, the selection, the filters or the outcome change."""
        self._listeners.append(callback)

    def on_progress(self, callback: Callable[[Progress], None]) -> None:
        """Call ``callback(progress)`` after every settled action of a dry run or an apply (live)."""
        self._progress_listeners.append(callback)

    def _notify(self) -> None:
        for callback in list(self._listeners):
            callback(self)

    # -- the plan --------------------------------------------------------------------------------

    def build(self, *, include_suspected: bool | None = None, include_deletes: bool | None = None,
              only: Collection[str] | None = None, rescan: bool = False) -> Plan:
        """Build the plan from the scan controller's snapshot (scanning first if there is none, if an apply
        ran since it was taken, or ``rescan``).

        Every action starts selected; the filters are cleared.
        """
        if include_suspected is not None:
            self.include_suspected = include_suspected
        if include_deletes is not None:
            self.include_deletes = include_deletes
        if only is not None:
            self.only = tuple(only)
        if rescan or self.scan.snapshot is None or self.scan.snapshot is self._written_after:
            self.scan.scan()
        plan = build_plan(self.scan.findings(), only=self.only, include_suspected=self.include_suspected,
                          include_deletes=self.include_deletes, tombstone_ids=self.tombstone_ids)
        self._set_plan(plan, "built from the scan")
        return plan

    def load(self, path: str | Path) -> Plan:
        """Review an existing plan file (``gatewayscope plan --out``); its id is checked against its content."""
        plan = load_plan(path)
        self._check_targets(plan)
        self._set_plan(plan, str(path))
        return plan

    def _set_plan(self, plan: Plan, source: str) -> None:
        with self._lock:
            self.plan = plan
            self.plan_source = source
            self._selected = {a.id for a in plan.actions}
            self.kind_filter, self.target_filter = set(), set()
            self.page = 0
            self.last_report = None
            self.progress = Progress(total=len(plan.actions))
        self._notify()

    def _check_targets(self, plan: Plan) -> None:
        """A plan applies only with the config it was made with (same targets at the same addresses)."""
        for entry in plan.targets:
            target = next((t for t in self.scan.config.targets if t.name == entry["name"]), None)
            if target is None:
                if entry.get("skipped"):
                    continue
                raise ConfigError(f"The plan acts on target {entry['name']!r}, which the scan's config does not "
                                  "name; open it with the config it was made with.")
            if target.address != entry.get("address"):
                raise ConfigError(f"Target {entry['name']!r} is {target.address} in the config but the plan was "
                                  f"made against {entry.get('address')}; use the config the plan was made with.")

    def require_plan(self) -> Plan:
        """The plan; raises a sentence saying what to do when there is none."""
        if self.plan is None:
            raise PlanError("No plan yet: build one (the Build button, or build()) or load a plan file.")
        return self.plan

    # -- selection and filters -------------------------------------------------------------------

    @property
    def actions(self) -> list[Action]:
        """Every action of the plan, selected or not, in plan order."""
        return list(self.plan.actions) if self.plan is not None else []

    @property
    def selected_ids(self) -> list[str]:
        """The selected actions' ids, in plan order."""
        return [a.id for a in self.actions if a.id in self._selected]

    def is_selected(self, action_id: str) -> bool:
        return action_id in self._selected

    def _known(self, ids: Iterable[str]) -> list[str]:
        known = {a.id for a in self.require_plan().actions}
        wanted = list(ids)
        unknown = [i for i in wanted if i not in known]
        if unknown:
            raise PlanError(f"The plan has no action {', '.join(unknown[:5])}.")
        return wanted

    def select(self, *action_ids: str) -> None:
        """Select actions by id."""
        self._selected.update(self._known(action_ids))
        self._notify()

    def deselect(self, *action_ids: str) -> None:
        """Deselect actions by id (they are left out of the plan that is applied)."""
        self._selected.difference_update(self._known(action_ids))
        self._notify()

    def set_selected(self, action_id: str, selected: bool) -> None:
        """Select or deselect one action (a checkbox)."""
        if selected:
            self.select(action_id)
        else:
            self.deselect(action_id)

    def select_all(self) -> None:
        self._selected = {a.id for a in self.require_plan().actions}
        self._notify()

    def select_none(self) -> None:
        self.require_plan()
        self._selected = set()
        self._notify()

    def set_filter(self, *, kinds: Iterable[str] | None = None, targets: Iterable[str] | None = None) -> None:
        """Show only actions of these kinds and targets (empty or None = all). Filters never change the selection."""
        kinds_set = set(kinds or ())
        unknown = kinds_set - set(ACTION_KINDS)
        if unknown:
            raise PlanError(f"Unknown action kind(s) {', '.join(sorted(unknown))}; "
                            f"choose from {', '.join(ACTION_KINDS)}.")
        self.kind_filter = kinds_set
        self.target_filter = set(targets or ())
        self.page = 0
        self._notify()

    def visible_actions(self) -> list[Action]:
        """The actions the filters let through, in plan order."""
        return [a for a in self.actions
                if (not self.kind_filter or a.kind in self.kind_filter)
                and (not self.target_filter or a.target in self.target_filter)]

    # -- pages ---------------------------------------------------------------------------------

    @property
    def page_count(self) -> int:
        """Pages of the actions the filters show (at least 1)."""
        return max(1, -(-len(self.visible_actions()) // self.page_size))

    def page_actions(self) -> list[Action]:
        """The actions of the current page (at most ``page_size``), in plan order."""
        visible = self.visible_actions()
        self.page = min(self.page, self.page_count - 1)
        return visible[self.page * self.page_size:(self.page + 1) * self.page_size]

    def set_page(self, page: int) -> None:
        """Show page ``page`` (0-based; clamped to the pages there are)."""
        self.page = min(max(0, int(page)), self.page_count - 1)
        self._notify()

    def next_page(self) -> None:
        self.set_page(self.page + 1)

    def previous_page(self) -> None:
        self.set_page(self.page - 1)

    def select_visible(self) -> None:
        """Select every action the filters show."""
        self._selected.update(a.id for a in self.visible_actions())
        self._notify()

    def deselect_visible(self) -> None:
        """Deselect every action the filters show."""
        self._selected.difference_update(a.id for a in self.visible_actions())
        self._notify()

    def kinds(self) -> list[str]:
        """The action kinds present in the plan, in apply order."""
        present = {a.kind for a in self.actions}
        return [k for k in ACTION_KINDS if k in present]

    def targets(self) -> list[str]:
        """The targets the plan acts on, in plan order."""
        return list(dict.fromkeys(a.target for a in self.actions))

    def selected_plan(self) -> Plan:
        """A plan of only the selected actions.

        All selected: the plan itself (same id, so a plan file reviewed here and applied from the CLI share
        one journal history). Otherwise a new plan, deterministic for the selection: the same targets,
        policy and creation time, the selected actions with their ids unchanged, a warning naming the plan
        it was selected from, hence its own content-hash id. The typed confirmation is checked against THIS
        id, so a confirmation typed for one selection does not apply another. Its journal history is its own:
        re-applying the same selection resumes; a different selection re-reads every subject (the actions an
        earlier selection settled come out as already-done).
        """
        plan = self.require_plan()
        chosen = [a for a in plan.actions if a.id in self._selected]
        if len(chosen) == len(plan.actions):
            return plan
        warnings = [w for w in plan.warnings if not w.startswith("This plan deletes things")]
        if any(a.destructive for a in chosen):
            warnings.insert(0, next((w for w in plan.warnings if w.startswith("This plan deletes things")),
                                    "This plan deletes things."))
        warnings.append(f"Selected {len(chosen)} of the {len(plan.actions)} actions of plan {plan.id}.")
        subset = Plan(created_at=plan.created_at, targets=[dict(t) for t in plan.targets],
                      actions=[Action.from_dict(a.to_dict()) for a in chosen], policy=dict(plan.policy),
                      warnings=warnings, tool_version=plan.tool_version, schema_version=plan.schema_version)
        subset.id = subset.compute_id()
        return subset

    def summary(self) -> dict[str, Any]:
        """``plan_summary`` of the selected plan (counts by kind and target, memory freed, deletes)."""
        return plan_summary(self.selected_plan())

    def actions_frame(self) -> pl.DataFrame:
        """Every action with its selection, kind, target, subject, change and reason."""
        rows = [{"selected": a.id in self._selected, "id": a.id, "kind": a.kind, "target": a.target,
                 "subject": a.subject, "change": before_after(a), "destructive": a.destructive, "reason": a.reason}
                for a in self.actions]
        return pl.DataFrame(rows, schema={"selected": pl.Boolean, "id": pl.String, "kind": pl.String,
                                          "target": pl.String, "subject": pl.String, "change": pl.String,
                                          "destructive": pl.Boolean, "reason": pl.String})

    def diff(self) -> list[dict[str, Any]]:
        """Before/after of the selected actions, one row per changed field."""
        return [row for a in self.selected_plan().actions for row in diff_rows(a)]

    def diff_frame(self) -> pl.DataFrame:
        schema = {"id": pl.String, "kind": pl.String, "target": pl.String, "subject": pl.String,
                  "field": pl.String, "before": pl.String, "after": pl.String, "destructive": pl.Boolean}
        return pl.DataFrame(self.diff(), schema=schema)

    def plan_html(self) -> str:
        """The selected plan through plan.html.j2 (what ``gatewayscope show --format html`` prints), its warnings
        worded for the notebook (the widgets and parameters, not the CLI flags)."""
        plan = self.selected_plan()
        return render_plan(replace(plan, warnings=[notebook_words(w) for w in plan.warnings]), "html")

    def plan_text(self) -> str:
        """The selected plan through plan.txt.j2 (what ``gatewayscope show`` prints)."""
        return render_plan(self.selected_plan(), "text")

    def diff_html(self, *, max_rows: int = DEFAULT_MAX_ROWS) -> str:
        return render_table(self.diff_frame().drop("destructive"), title="Before and after (selected actions)",
                            empty="No action selected.", max_rows=max_rows, css_class="diff")

    def save_selected(self, path: str | Path) -> Path:
        """Write the selected plan to ``path`` (``gatewayscope show`` / ``apply`` read it)."""
        return self.selected_plan().save(path)

    # -- confirmations ---------------------------------------------------------------------------

    def required_confirmation(self) -> str:
        """What to type to apply the current selection: the first 8 characters of its plan id."""
        return self.selected_plan().id[:MIN_CONFIRMATION_CHARS]

    def deletes_selected(self) -> int:
        """How many selected actions delete something (each needs the delete confirmation)."""
        return sum(1 for a in self.selected_plan().actions if a.destructive)

    def required_delete_confirmation(self) -> str:
        """What to type to let the deletes run: their number (empty when none is selected)."""
        deletes = self.deletes_selected()
        return str(deletes) if deletes else ""

    def check_confirmation(self, confirmation: str, delete_confirmation: str | None = None) -> bool:
        """Check the typed confirmations against the selected plan; returns whether the deletes may run.

        ``confirmation`` must be at least 8 leading characters of the selected plan's id. With deletes
        selected, ``delete_confirmation`` empty leaves them out (they are skipped and stay open in the
        journal, like ``apply --yes`` without ``--allow-delete``); anything else must be their number.
        Raises :class:`ConfirmationError` otherwise.
        """
        plan = self.selected_plan()
        typed = (confirmation or "").strip().lower()
        if not plan.actions:
            raise ConfirmationError("No action is selected: nothing to apply.")
        if len(typed) < MIN_CONFIRMATION_CHARS:
            raise ConfirmationError(
                f"Type at least the first {MIN_CONFIRMATION_CHARS} characters of the plan id "
                f"({plan.id[:MIN_CONFIRMATION_CHARS]}...) to apply it; nothing was written.")
        if not plan.id.startswith(typed):
            raise ConfirmationError(
                f"The confirmation {typed!r} does not match the plan being applied "
                f"({plan.id[:MIN_CONFIRMATION_CHARS]}...; the id changes with the selection); nothing was written.")
        deletes = self.deletes_selected()
        typed_deletes = (delete_confirmation or "").strip()
        if not deletes or not typed_deletes:
            return False
        if typed_deletes != str(deletes):
            raise ConfirmationError(
                f"The delete confirmation {typed_deletes!r} is not the number of deletes selected ({deletes}); "
                "type that number to run them, or leave it empty to skip them; nothing was written.")
        return True

    # -- running ---------------------------------------------------------------------------------

    def _journal(self) -> Journal | None:
        return Journal(self.journal_path) if self.journal_path is not None else None

    def _progress_callback(self, user: Callable[[ActionResult], None] | None) -> Callable[[ActionResult], None]:
        def on_result(result: ActionResult) -> None:
            # apply calls this from its worker threads: one at a time, so a progress bar only moves forward
            with self._progress_lock:
                self.progress.settled += 1
                self.progress.last = result
                progress = replace(self.progress)
                for callback in list(self._progress_listeners):
                    callback(progress)
                if user is not None:
                    user(result)
        return on_result

    def _run(self, plan: Plan, options: ApplyOptions, journal: Journal | None,
             on_result: Callable[[ActionResult], None] | None) -> ApplyReport:
        settled = len(journal.outcomes(plan.id)) if journal is not None else 0
        self.progress = Progress(total=len(plan.actions), settled=settled, dry_run=not options.write, running=True)
        for callback in list(self._progress_listeners):
            callback(replace(self.progress))
        try:
            report = apply_plan(plan, self.scan.config, options=options, journal=journal,
                                transports=self.scan.transports, on_result=self._progress_callback(on_result),
                                deleted_ids=self.scan.deleted_ids)
        finally:
            self.progress.running = False
        if report.already_applied:
            self.progress.settled = self.progress.total
        for callback in list(self._progress_listeners):
            callback(replace(self.progress))
        self.last_report = report
        parent = self.plan.id if self.plan is not None else plan.id
        self.runs.append(RunRecord(
            dry_run=report.dry_run, plan_id=plan.id, parent_plan_id=parent,
            at=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"), results=list(report.results),
            resumed=len(report.previous), tally_line=self.tally_line(),
            journal=str(self.journal_path) if (journal is not None and not report.dry_run) else "",
            plan_file=str(self.applied_plan_path) if (self.applied_plan_path and not report.dry_run) else "",
            already_applied=report.already_applied, stopped_early=report.stopped_early or ""))
        self._notify()
        return report

    def dry_run(self, *, on_result: Callable[[ActionResult], None] | None = None) -> ApplyReport:
        """Re-read every selected subject and say what would be written; writes nothing, journals nothing."""
        plan = self.selected_plan()
        self._check_targets(plan)
        options = replace(self.apply_options, write=False, allow_delete=False)
        return self._run(plan, options, self._journal(), on_result)

    def apply(self, confirmation: str, delete_confirmation: str | None = None, *,
              on_result: Callable[[ActionResult], None] | None = None) -> ApplyReport:
        """Apply the selected actions for real, with every safeguard of ``gatewayscope apply``.

        Needs the typed confirmation (and, to run deletes, the delete confirmation; see
        :meth:`check_confirmation`) and a journal. A wrong confirmation raises ConfirmationError before
        anything is written, the journal included. The applied plan is saved next to the journal
        (``plan-<id>.json``), so ``gatewayscope show`` and ``gatewayscope apply`` can pick it up, and the
        journal records which plan a selection came from.
        """
        allow_delete = self.check_confirmation(confirmation, delete_confirmation)
        if self.journal_path is None:
            raise PlanError("A real apply needs a journal: give the controller a journal_path.")
        plan = self.selected_plan()
        self._check_targets(plan)
        journal = Journal(self.journal_path)
        parent = self.require_plan()
        self.journal_path.parent.mkdir(parents=True, exist_ok=True)
        self.applied_plan_path = self.journal_path.with_name(f"plan-{plan.id}.json")
        if not self.applied_plan_path.exists():
            plan.save(self.applied_plan_path)
        if plan.id != parent.id:
            journal.append("selection", plan_id=plan.id, parent_plan_id=parent.id,
                           actions=[a.id for a in plan.actions], plan_file=str(self.applied_plan_path))
        self.applied_plan = plan
        options = replace(self.apply_options, write=True, allow_delete=allow_delete)
        self._written_after = self.scan.snapshot
        return self._run(plan, options, journal, on_result)

    # -- outcome ---------------------------------------------------------------------------------

    def tally(self) -> dict[str, int]:
        """The last apply's outcome counts (zeros included); empty before any apply."""
        return self.last_report.tally() if self.last_report is not None else {}

    def tally_line(self) -> str:
        """``<n> done, <n> refused, <n> unconfirmed, <n> gone, <n> stale, <n> already-done`` of the last run."""
        if self.last_report is None:
            return ""
        if self.last_report.dry_run:
            counts = self._dry_counts(self.last_report)
            if not counts:
                return "Dry run: no action selected, nothing to do."
            return "Dry run, nothing was sent: " + ", ".join(f"{n} {k}" for k, n in counts.items()) + "."
        return self.last_report.tally_line()

    @staticmethod
    def _dry_counts(report: ApplyReport) -> dict[str, int]:
        counts: dict[str, int] = {}
        for result in report.results:
            counts[result.outcome] = counts.get(result.outcome, 0) + 1
        return dict(sorted(counts.items()))

    def outcome_html(self, *, max_rows: int = DEFAULT_MAX_ROWS) -> str:
        """The last run's outcome (apply.html.j2): the tally line and every action's outcome."""
        report = self.last_report
        if report is None:
            return render_table([], title="Outcome", empty="Nothing run yet: dry run first, then apply.")
        results = [*report.previous, *report.results]
        return render("apply.html.j2", report=report, results=results[:max_rows],
                      more=max(0, len(results) - max_rows),
                      dry_counts=self._dry_counts(report) if report.dry_run else {},
                      journal=str(self.journal_path) if (self.journal_path and not report.dry_run) else "")

    def record_html(self, *, max_rows: int = RECORD_MAX_ROWS) -> str:
        """Every dry run and apply of this controller, oldest first, as static HTML: the notebook's record.

        A plain ``text/html`` output (no widget, no script), so the saved notebook and its HTML export show
        what was done with or without widget state; every value (ids, subjects, paths) is escaped.
        """
        body = "".join(f"<li>{run.html(max_rows=max_rows)}</li>" for run in self.runs)
        if not body:
            body = "<li>Nothing run yet: no dry run, no apply.</li>"
        return ('<div class="gatewayscope gatewayscope-record" style="font-family:sans-serif;font-size:13px">'
                f"<h4>Record of this notebook's runs</h4><ol>{body}</ol></div>")

    def journal_rows(self, *, plan_id: str | None = None,
                     events: Collection[str] | None = None) -> list[dict[str, Any]]:
        """The journal as table rows (oldest first): time, event, plan, action, kind, target, subject,
        outcome, detail. ``plan_id`` keeps one plan's events; ``events`` keeps those event kinds."""
        journal = self._journal()
        if journal is None:
            return []
        rows = []
        for record in journal.read():
            if plan_id is not None and record.get("plan_id") != plan_id:
                continue
            if events is not None and record.get("event") not in events:
                continue
            ts = record.get("ts")
            when = (dt.datetime.fromtimestamp(float(ts), tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
                    if isinstance(ts, (int, float)) else "")
            detail = record.get("detail") or record.get("what") or ""
            if record.get("event") == "apply-end":
                tally = record.get("tally") or {}
                detail = ", ".join(f"{tally.get(k, 0)} {k}" for k in FINAL_OUTCOMES)
            elif record.get("event") == "selection":
                detail = f"{len(record.get('actions') or [])} action(s) of plan {record.get('parent_plan_id')}"
            rows.append({"time": when, "event": str(record.get("event", "")),
                         "plan": str(record.get("plan_id", ""))[:MIN_CONFIRMATION_CHARS],
                         "action": str(record.get("action_id", "") or ""), "kind": str(record.get("kind", "") or ""),
                         "target": str(record.get("target", "") or ""), "subject": str(record.get("subject", "") or ""),
                         "outcome": str(record.get("outcome", "") or ""), "detail": str(detail)})
        return rows

    def journal_frame(self, **kwargs: Any) -> pl.DataFrame:
        """:meth:`journal_rows` as a frame."""
        schema = {c: pl.String for c in ("time", "event", "plan", "action", "kind", "target", "subject",
                                          "outcome", "detail")}
        return pl.DataFrame(self.journal_rows(**kwargs), schema=schema)

    def journal_html(self, *, max_rows: int = DEFAULT_MAX_ROWS, **kwargs: Any) -> str:
        """The journal's outcome events as a table (the last ``max_rows``)."""
        frame = self.journal_frame(**kwargs)
        if frame.height > max_rows:
            frame = frame.tail(max_rows)
        return render_table(frame, title=f"Journal {self.journal_path}" if self.journal_path else "Journal",
                            empty="The journal is empty: nothing applied yet.", max_rows=max_rows, css_class="journal")
