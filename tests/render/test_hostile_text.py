"""Hostile session ids and record names through every view: HTML, Markdown, text, charts and logs.

Whoever calls a gateway chooses its session ids and Bifrost record names. Each one here tries something:
live markup in HTML (a tag, an attribute breaker, a script end), a Markdown link or image, an ANSI
sequence with a newline that forges an "ALL CLEAR" line in a terminal, a right-to-left override. Every
view must show them as text: no tag or event attribute in HTML, no link in Markdown, no control character
in text or a log line, while ``scan --format json`` keeps them exactly as they are.
"""

from __future__ import annotations

import asyncio
import html
import io
import json
import logging
import sqlite3
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest

from gatewayscope.cli import main
from gatewayscope.cli.common import setup_logging
from gatewayscope.config import Config, Policy, Target
from gatewayscope.notebook import PlanController, PlanReview, ScanController, SnapshotView
from gatewayscope.notebook.charts import boot_memory_chart
from gatewayscope.remediate.apply import ActionResult, ApplyReport
from gatewayscope.remediate.journal import Journal
from gatewayscope.remediate.plan import Plan, build_plan
from gatewayscope.remediate.review import render_plan
from gatewayscope.render import markdown_code, markdown_safe, terminal_safe
from gatewayscope.snapshot import (
    CANDIDATE_TRACES_SCHEMA,
    REACHABILITY_SCHEMA,
    RECORDS_SCHEMA,
    SESSIONS_SCHEMA,
    BifrostData,
    Snapshot,
    TargetSnapshot,
    TraceStoreData,
    frame_from_rows,
)
from tests.helpers import NOW

OLD = NOW - 5 * 3600.0  # idle well past the default threshold: a suspected orphan
SAFE = {"drop_excess_requests": False, "enforce_auth_on_inference": True, "disable_content_logging": True}

XSS = "<img src=x onerror=alert(1)>:0"
DOUBLE_QUOTE = 'x" onmouseover="alert(2)" data-x=":0'
SINGLE_QUOTE = "x' onfocus='alert(3)' data-x=':0"
SCRIPT = "</script><script>alert(4)</script>:0"
MD_LINK = "[click](http://evil.example/) ![i](http://evil.example/i.png):0"
FORGED = "x\x1b[2J\nALL CLEAR: 0 orphans"
BIDI = "abc\u202egpj.exe:0"
SESSION_IDS = [XSS, DOUBLE_QUOTE, SINGLE_QUOTE, SCRIPT, MD_LINK, FORGED, BIDI]
RECORD_NAMES = ["<img src=y onerror=alert(5)>", "rec\x1b]0;owned\x07\nALL CLEAR", "rec\u202eevil"]
TARGET_NAME = "gw<svg onload=alert(6)>[x](http://evil.example/)$\\frac$"
#: characters no output may carry raw (ESC, BEL, the bidi override); a forged line is checked on its own
RAW = ("\x1b", "\x07", "\u202e")


@pytest.fixture(autouse=True)
def _restore_log_record_factory() -> Iterator[None]:
    """The CLI's logging setup changes the process's record factory; each test starts from the default."""
    before = logging.getLogRecordFactory()
    yield
    logging.setLogRecordFactory(before)


# -- snapshots, plans and controllers holding the hostile ids ---------------------------------------------

def rllm_target() -> TargetSnapshot:
    rows = [(sid, 1, OLD - 10.0, OLD) for sid in SESSION_IDS]
    candidates = [(sid, f"{sid}/t0", OLD, None, 100, 400, "stub", OLD - 1.0) for sid in SESSION_IDS]
    data = TraceStoreData(sessions=frame_from_rows(rows, SESSIONS_SCHEMA),
                          candidate_traces=frame_from_rows(candidates, CANDIDATE_TRACES_SCHEMA),
                          tombstoned_ids=[], guard=None, capabilities={"guard": False}, access="rest")
    return TargetSnapshot(name="rl", kind="rllm", address="http://127.0.0.1:9090", up=True, started_at=NOW,
                          duration_seconds=0.01, trace_store=data)


def bifrost_target() -> TargetSnapshot:
    records = [(name, True, "openai", 1000, 5000, None, "active", f"fp-{i}") for i, name in enumerate(RECORD_NAMES)]
    data = BifrostData(records=frame_from_rows(records, RECORDS_SCHEMA), client_config=dict(SAFE),
                       reachability=frame_from_rows([], REACHABILITY_SCHEMA))
    return TargetSnapshot(name=TARGET_NAME, kind="bifrost", address="http://127.0.0.1:8080", up=True,
                          started_at=NOW, duration_seconds=0.01, bifrost=data)


def hostile_snapshot() -> tuple[Snapshot, Config]:
    snapshot = Snapshot(taken_at=NOW, targets=[rllm_target(), bifrost_target()])
    config = Config(targets=[Target(name=t.name, kind=t.kind, url=t.address) for t in snapshot.targets],
                    policy=Policy())
    return snapshot, config


def hostile_plan() -> Plan:
    snapshot, config = hostile_snapshot()
    plan = build_plan(snapshot, config, created_at=NOW, include_suspected=True)
    assert {a.subject for a in plan.actions} >= {*SESSION_IDS, *RECORD_NAMES}
    return plan


def scan_controller() -> ScanController:
    snapshot, config = hostile_snapshot()
    scan = ScanController(config=config)
    scan.snapshot = snapshot
    return scan


# -- what the outputs may hold --------------------------------------------------------------------------

class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.event_attributes: list[tuple[str, str, str | None]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.event_attributes += [(tag, name, value) for name, value in attrs if name.startswith("on")]

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def assert_inert_html(page: str, *shown: str) -> None:
    """No tag or event handler an id could have brought; each of ``shown`` is there as visible text."""
    parsed = _Tags()
    parsed.feed(page)
    parsed.close()
    assert not parsed.tags & {"img", "script", "a", "svg"}, parsed.tags
    assert not parsed.event_attributes, parsed.event_attributes
    assert not any(char in page for char in RAW), "a control or bidi character reached the page"
    text = "".join(parsed.text)
    for value in shown:
        assert terminal_safe(value) in text, value


def assert_inert_text(text: str) -> None:
    """No control or bidi character, and no line a value forged."""
    assert not any(char in text for char in RAW), repr(text)
    assert not any(line.lstrip().startswith("ALL CLEAR") for line in text.splitlines()), text


# -- terminal_safe and markdown ---------------------------------------------------------------------------

def test_terminal_safe_shows_every_control_and_bidi_character_as_an_escape() -> None:
    assert terminal_safe(FORGED) == "x\\x1b[2J\\nALL CLEAR: 0 orphans"
    assert terminal_safe("a\rb\x00c\x7fd\x9be\u2028f\u2066g\u200fh\ti") == \
        "a\\rb\\x00c\\x7fd\\x9be\\u2028f\\u2066g\\u200fh\ti"
    assert terminal_safe("ordinary id: task-7:0 ünïcödé") == "ordinary id: task-7:0 ünïcödé"


def test_markdown_code_spans_hold_any_id() -> None:
    assert markdown_code("s:0") == "`s:0`"
    assert markdown_code("a``b|c") == "```a``b\\|c```"
    assert markdown_code("`x") == "`` `x ``"
    assert markdown_safe("- [x](y) <i>&amp;") == "\\- \\[x\\](y) \\<i>\\&amp;"


# -- HTML -------------------------------------------------------------------------------------------------

def test_plan_html_shows_the_ids_as_text() -> None:
    page = render_plan(hostile_plan(), "html")
    assert_inert_html(page, *SESSION_IDS, *RECORD_NAMES)
    assert "&lt;img src=x onerror=alert(1)&gt;:0" in page


def test_scan_html_and_the_notebook_tables_show_the_ids_as_text() -> None:
    scan = scan_controller()
    assert_inert_html(scan.html(show_orphans=50), *SESSION_IDS, TARGET_NAME)
    assert_inert_html(scan.orphans_html(), *SESSION_IDS)
    assert_inert_html(scan.records_html(only_findings=False), *RECORD_NAMES, TARGET_NAME)


def test_snapshot_view_tabs_show_the_ids_as_text() -> None:
    view = SnapshotView(scan_controller(), show_orphans=50)
    for widget in [*view.sections.values(), view.orphans, view.records]:
        assert_inert_html(widget.value)
    assert_inert_html(view.orphans.value, *SESSION_IDS)


def test_plan_review_shows_the_ids_as_text(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    plan = PlanController(scan_controller(), journal_path=journal, include_suspected=True)
    review = PlanReview(plan)
    plan.build()
    plan.deselect(next(a.id for a in plan.actions if a.subject == XSS))  # a selection: a plan of its own
    assert_inert_html(plan.plan_html(), *SESSION_IDS[1:], *RECORD_NAMES)
    assert_inert_html(plan.diff_html(), *SESSION_IDS[1:], *RECORD_NAMES)
    assert_inert_html(review.selection_summary.value)
    assert_inert_html(review.plan_view.value)
    assert_inert_html(review.diff.value)
    labels = [box.description for box in review.checkboxes.values()]
    assert labels and not any(char in label for label in labels for char in RAW)

    results = [ActionResult(action_id=a.id, kind=a.kind, target=a.target, subject=a.subject, outcome="refused",
                            detail=f"the gateway said: {a.subject}") for a in plan.actions]
    plan.last_report = ApplyReport(plan_id=plan.require_plan().id, dry_run=False, results=results,
                                   stopped_early=f"stopped at {SCRIPT}")
    assert_inert_html(plan.outcome_html(), *SESSION_IDS, *RECORD_NAMES)

    Journal(journal).append("action-end", plan_id="p" * 16, action_id="a00001", kind="session_delete",
                            target=TARGET_NAME, subject=XSS, outcome="refused", detail=FORGED)
    assert_inert_html(plan.journal_html(), XSS, FORGED, TARGET_NAME)


def test_the_charts_take_any_target_name() -> None:
    scan = scan_controller()
    png = scan.chart("boot_memory")  # the name holds "$\frac$", which matplotlib would read as a formula
    assert png.startswith(b"\x89PNG")
    assert boot_memory_chart(scan.pools_frame(), scan.boot_frame()) == png


# -- Markdown ---------------------------------------------------------------------------------------------

def test_plan_markdown_has_no_link_image_or_markup() -> None:
    mistune = pytest.importorskip("mistune")
    text = render_plan(hostile_plan(), "md")
    assert_inert_text(text)
    to_html = mistune.create_markdown(escape=False, plugins=["table", "strikethrough"])
    page = to_html(text)
    parsed = _Tags()
    parsed.feed(page)
    assert not parsed.tags & {"img", "script", "a", "svg"} and not parsed.event_attributes, parsed.tags
    # each id is one code span in its row of the actions table
    for sid in [XSS, SCRIPT, MD_LINK, DOUBLE_QUOTE]:
        assert f"<code>{_html_text(sid)}</code>" in page, sid
    assert "<code>x\\x1b[2J\\nALL CLEAR: 0 orphans</code>" in page


def _html_text(value: str) -> str:
    return html.escape(value, quote=False).replace('"', "&quot;")


# -- text and logs -------------------------------------------------------------------------------------------

def test_plan_text_has_no_control_characters() -> None:
    text = render_plan(hostile_plan(), "text")
    assert_inert_text(text)
    assert "x\\x1b[2J\\nALL CLEAR: 0 orphans" in text and "abc\\u202egpj.exe:0" in text


def make_store(path: Path, sessions: list[str]) -> None:
    """Write ``sessions`` (one trace each) through the rLLM gateway's own SQLite store class, idle 5 h."""
    store_module = pytest.importorskip("rllm_model_gateway.store.sqlite_store")

    async def go() -> None:
        store = store_module.SqliteTraceStore(db_path=str(path))
        for sid in sessions:
            data = {"trace_id": f"{sid}/0", "session_id": sid, "messages": [{"role": "user", "content": "x"}],
                    "prompt_token_ids": [1, 2, 3], "token_counts": {"prompt": 3}, "model": "stub",
                    "timestamp": time.time()}
            await store.store_trace(f"{sid}/0", sid, data)
        await store.close()

    asyncio.run(go())
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE trace_sessions SET created_at = created_at - ?", (5 * 3600.0,))
        conn.execute("UPDATE traces SET created_at = created_at - ?", (5 * 3600.0,))


def test_scan_show_orphans_prints_no_forged_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "traces.db"
    make_store(db, SESSION_IDS)
    assert main(["scan", "--trace-store", str(db), "--show-orphans", "20"]) == 0
    out = capsys.readouterr().out
    assert_inert_text(out)
    assert "x\\x1b[2J\\nALL CLEAR: 0 orphans" in out and "abc\\u202egpj.exe:0" in out

    # the JSON keeps every id exactly as the gateway stored it
    assert main(["scan", "--trace-store", str(db), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    listed = {s["session_id"] for t in report["targets"] for s in t["orphan_sessions"]}
    assert listed == set(SESSION_IDS)


def test_cli_errors_print_no_forged_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", str(tmp_path / FORGED)]) != 0
    err = capsys.readouterr().err
    assert_inert_text(err)
    assert "x\\x1b[2J\\nALL CLEAR" in err


def test_log_lines_escape_control_characters_whatever_the_handler(caplog: pytest.LogCaptureFixture) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)  # the handler a command (or basicConfig) would install itself
    logger = logging.getLogger("gatewayscope.test_hostile_text")
    logger.addHandler(handler)
    try:
        setup_logging()  # what the CLI's main() does first
        with caplog.at_level(logging.WARNING, logger=logger.name):
            logger.warning("reading %s failed", FORGED)
            logger.warning("record %s\nALL CLEAR", RECORD_NAMES[1])
    finally:
        logger.removeHandler(handler)
    for text in (stream.getvalue(), caplog.text):
        assert_inert_text(text)
    assert stream.getvalue().splitlines() == ["reading x\\x1b[2J\\nALL CLEAR: 0 orphans failed",
                                              "record rec\\x1b]0;owned\\x07\\nALL CLEAR\\nALL CLEAR"]
    assert caplog.records[0].args == (FORGED,)  # handlers that read the arguments still get them
