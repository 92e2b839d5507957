"""Every command, fed hostile servers and malformed files and flags, says one sentence and exits 1 or 2.

Each case runs ``python -m gatewayscope`` in its own process under a timeout: no traceback, no "unexpected ..."
(the sentence of an error nobody foresaw), never a hang. The servers are those of :mod:`tests.hostile` (an
answer that drips, never ends, claims 300 GB, redirects, is nested 200,000 levels deep or is not JSON); the
files are a FIFO (its open blocks until a writer comes), ``/dev/zero`` (it never ends), JSON nested too deeply,
a folder, a missing path and garbage bytes; the stores hold rows no gateway writes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from gatewayscope.remediate.plan import PLAN_KEY_ENV, PLAN_KEY_FILE_ENV, Action, Plan, session_fingerprint
from tests.hostile import (
    deep_json,
    drip_body,
    drip_head,
    endless_chunked,
    hostile,
    huge_length,
    not_json,
    redirect,
)

#: seconds a case may run: far above the one-second target timeouts the cases pass, so only a hang reaches it
CASE_TIMEOUT = 90

SERVERS = {
    "drip-body": lambda: drip_body(0.2),
    "drip-head": lambda: drip_head(0.2),
    "huge-length": huge_length,
    "endless-chunked": endless_chunked,
    "redirect": lambda: redirect("http://169.254.0.1:9/elsewhere"),
    "deep-json": deep_json,
    "not-json": not_json,
}

#: commands that read a gateway over HTTP; {url} is a hostile server's
NETWORK_COMMANDS = {
    "scan-rllm": ["scan", "--trace-store", "{url}", "--timeout", "1"],
    "scan-bifrost": ["scan", "--bifrost", "{url}", "--timeout", "1"],
    "export-rllm": ["export", "--once", "--trace-store", "{url}", "--timeout", "1"],
    "export-bifrost": ["export", "--once", "--bifrost", "{url}", "--timeout", "1"],
    "plan-rllm": ["plan", "--trace-store", "{url}", "--timeout", "1", "--out", "{tmp}/p.json"],
    "plan-bifrost": ["plan", "--bifrost", "{url}", "--timeout", "1", "--out", "{tmp}/p.json"],
    "guard-status": ["guard", "status", "{url}", "--timeout", "1"],
    "guard-lift": ["guard", "lift", "{url}", "task:0", "--timeout", "1"],
    "guard-backfill": ["guard", "backfill", "{url}", "task:0", "--timeout", "1"],
    "apply": ["apply", "{plan_for_url}", "--config", "{config_for_url}", "--yes", "--allow-delete",
              "--journal", "{tmp}/j.jsonl"],
}

#: malformed files: {bad} is one of FILES
FILES = ("fifo", "dev-zero", "nested-json", "folder", "missing", "garbage")
FILE_COMMANDS = {
    "scan-store": ["scan", "--trace-store", "{bad}"],
    "scan-config": ["scan", "--config", "{bad}"],
    "scan-snapshot": ["scan", "--load-snapshot", "{bad_snapshot}"],
    "export-store": ["export", "--once", "--trace-store", "{bad}"],
    "export-config": ["export", "--once", "--config", "{bad}"],
    "plan-store": ["plan", "--trace-store", "{bad}", "--out", "{tmp}/p.json"],
    "plan-tombstone-ids": ["plan", "--trace-store", "{unreachable}", "--tombstone-ids", "{bad}", "--out",
                           "{tmp}/p.json"],
    "plan-deleted-from": ["plan", "--trace-store", "{unreachable}", "--deleted-from", "{bad}", "--out",
                          "{tmp}/p.json"],
    "show": ["show", "{bad}"],
    "apply": ["apply", "{bad}", "--yes"],
    "apply-deleted-from": ["apply", "{good_plan}", "--deleted-from", "{bad}"],
    "apply-journal": ["apply", "{good_plan}", "--yes", "--allow-delete", "--journal", "{bad}"],
    "apply-config": ["apply", "{good_plan}", "--config", "{bad}"],
    "apply-plan-key-file": ["apply", "{good_plan}", "@env", f"{PLAN_KEY_FILE_ENV}={{bad}}"],
    "guard-install": ["guard", "install", "{bad}"],
    "guard-status": ["guard", "status", "{bad}"],
    "guard-uninstall": ["guard", "uninstall", "{bad}"],
    "guard-backfill-ids": ["guard", "backfill", "{unreachable}", "--ids-file", "{bad}", "--timeout", "1"],
    "guard-backfill-store": ["guard", "backfill", "{bad}", "task:0"],
    "gateway-config": ["gateway", "--config", "{bad}", "--port", "0"],
    "gateway-db-path": ["gateway", "--db-path", "{bad}", "--port", "0"],
}

#: flags and values no command may take with a traceback, and the rows no gateway writes
OTHER_CASES = {
    "timeout-inf": ["scan", "--trace-store", "{unreachable}", "--timeout", "inf"],
    "timeout-nan": ["scan", "--trace-store", "{unreachable}", "--timeout", "nan"],
    "timeout-negative": ["export", "--once", "--trace-store", "{unreachable}", "--timeout", "-1"],
    "idle-inf": ["plan", "--trace-store", "{unreachable}", "--orphan-idle-seconds", "inf"],
    "idle-nan": ["apply", "{good_plan}", "--orphan-idle-seconds", "nan"],
    "max-body-zero": ["scan", "--trace-store", "{unreachable}", "--max-body-bytes", "0"],
    "rate-nan": ["apply", "{good_plan}", "--rate", "nan"],
    "rate-inf": ["apply", "{good_plan}", "--rate", "inf"],
    "concurrency-zero": ["apply", "{good_plan}", "--concurrency", "0"],
    "max-errors-zero": ["apply", "{good_plan}", "--max-errors", "0"],
    "busy-timeout-nan": ["guard", "install", "{text_store}", "--busy-timeout", "nan"],
    "guard-timeout-inf": ["guard", "status", "{unreachable}", "--timeout", "inf"],
    "guard-top-negative": ["guard", "status", "{unreachable}", "--top", "-1"],
    "toml-inf": ["scan", "--config", "{toml_inf}"],
    "toml-nan": ["export", "--once", "--config", "{toml_nan}"],
    "url-ipv6-scan": ["scan", "--trace-store", "http://[::1"],
    "url-ipv6-bifrost": ["plan", "--bifrost", "http://[::1"],
    "url-ipv6-guard-status": ["guard", "status", "http://[::1"],
    "url-ipv6-guard-lift": ["guard", "lift", "http://[::1", "task:0"],
    "url-ipv6-guard-backfill": ["guard", "backfill", "http://[::1", "task:0"],
    "url-port-range": ["export", "--once", "--bifrost", "http://127.0.0.1:99999"],
    "save-snapshot-proc": ["scan", "--trace-store", "{text_store}", "--save-snapshot", "/proc/nope"],
    "blob-id-scan": ["scan", "--trace-store", "{blob_store}"],
    "blob-id-export": ["export", "--once", "--trace-store", "{blob_store}"],
    "blob-id-plan": ["plan", "--trace-store", "{blob_store}", "--out", "{tmp}/p.json"],
    "signed-plan-without-key": ["apply", "{signed_plan}"],
    "plan-key-spaces": ["apply", "{good_plan}", "@env", f"{PLAN_KEY_ENV}=   "],
    "demo-rollouts-negative": ["demo", "--once", "--rollouts", "-1", "--workdir", "{tmp}/demo"],
    "demo-workdir-proc": ["demo", "--once", "--workdir", "/proc/nope/demo", "--no-bifrost", "--no-exporter"],
    "emulate-port-range": ["emulate", "bifrost", "--port", "99999"],
    "emulate-dns-timeout-nan": ["emulate", "bifrost", "--port", "0", "--dns-timeout", "nan"],
    "gateway-port-range": ["gateway", "--port", "99999", "--db-path", "{tmp}/gw.db"],
    "gateway-max-tombstones-negative": ["gateway", "--max-tombstones", "-1"],
    "guard-run-missing-command": ["guard", "run", "--", "/nonexistent/gatewayscope-test-command"],
    "guard-run-no-command": ["guard", "run"],
    "guard-backfill-stdin-dev-zero": ["guard", "backfill", "{unreachable}", "--ids-file", "-", "@stdin", "/dev/zero"],
    "guard-backfill-stdin-not-utf8": ["guard", "backfill", "{unreachable}", "--ids-file", "-", "@stdin",
                                      "{tmp}/not-utf8.txt"],
}

#: file cases that are no error: the gateway creates a store at a path where there is none
FINE = {("gateway-db-path", "missing")}

CASES = (
    [pytest.param(argv, server, id=f"{name}-{server}") for name, argv in NETWORK_COMMANDS.items()
     for server in SERVERS]
    + [pytest.param(argv, bad, id=f"{name}-{bad}") for name, argv in FILE_COMMANDS.items() for bad in FILES
       if (name, bad) not in FINE]
    + [pytest.param(argv, None, id=name) for name, argv in OTHER_CASES.items()]
)


def _plan_against(address: str, path: Path, *, signature: str | None = None) -> Path:
    """A plan of one session delete on the rLLM gateway at ``address`` (target ``gw``), saved unsigned."""
    action = Action(id="a00001", kind="session_delete", target="gw", subject="task:0", before={"trace_count": 1},
                    after={"trace_count": 0}, reason="suspected orphan", fingerprint=session_fingerprint(1, ["t"]),
                    details={"trace_ids": ["t"], "last_trace_at": 1.0, "confidence": "suspected"})
    plan = Plan(created_at=1.0, targets=[{"name": "gw", "kind": "rllm", "address": address, "access": "rest",
                                          "capabilities": {}}], actions=[action], policy={})
    plan.id = plan.compute_id()
    plan.signature = signature  # saved as it is: an empty key signs nothing
    plan.save(path, key=b"")
    return path


def _store(path: Path, session_id: object, created: object) -> Path | None:
    """A store of the gateway's schema holding one row of ``session_id`` at ``created`` (None without the
    gateway's package, whose SqliteTraceStore makes the schema)."""
    try:
        from tests.e2e._store import _gateway_schema

        _gateway_schema(path, sys.executable)
    except RuntimeError:
        return None
    import sqlite3

    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO traces (trace_id, data, created_at) VALUES ('t', '{}', ?)", (created,))
        conn.execute("INSERT INTO trace_sessions (trace_id, session_id, created_at) VALUES ('t', ?, ?)",
                     (session_id, created))
    conn.close()
    return path


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    root = tmp_path_factory.mktemp("hostile-inputs")
    files = {"fifo": root / "fifo", "dev-zero": Path("/dev/zero"), "nested-json": root / "nested.json",
             "folder": root / "folder", "missing": root / "missing.json", "garbage": root / "garbage.bin"}
    os.mkfifo(files["fifo"])
    files["nested-json"].write_text("[" * 200_000)
    files["folder"].mkdir()
    files["garbage"].write_bytes(bytes(range(256)) * 64)
    for name, path in files.items():  # a snapshot folder whose manifest is the malformed file
        folder = root / f"snapshot-{name}"
        folder.mkdir()
        if name != "missing":
            (folder / "manifest.json").symlink_to(path)
    (root / "inf.toml").write_text('[policy]\norphan_idle_seconds = inf\n[[targets]]\nname = "s"\nkind = "rllm"\n'
                                   'path = "/nonexistent/traces.db"\n')
    (root / "nan.toml").write_text('[[targets]]\nname = "s"\nkind = "rllm"\npath = "/nonexistent/traces.db"\n'
                                   "timeout_seconds = nan\n")
    unreachable = "http://127.0.0.1:9"
    values = {"tmp": str(root), "unreachable": unreachable, "toml_inf": str(root / "inf.toml"),
              "toml_nan": str(root / "nan.toml"),
              "good_plan": str(_plan_against(unreachable, root / "good-plan.json")),
              "signed_plan": str(_plan_against(unreachable, root / "signed-plan.json",
                                               signature="hmac-sha256:" + "0" * 64))}
    values.update({f"file:{name}": str(path) for name, path in files.items()})
    values.update({f"snapshot:{name}": str(root / f"snapshot-{name}") for name in files})
    for name, sid, created in (("blob_store", b"\x00\xff", 1.0), ("text_store", "task:0", "yesterday")):
        made = _store(root / f"{name}.db", sid, created)
        values[name] = str(made) if made else ""
    with ExitStack() as stack:
        for name, behaviour in SERVERS.items():
            server = stack.enter_context(hostile(behaviour()))
            values[f"url:{name}"] = server.url
            values[f"plan:{name}"] = str(_plan_against(server.url, root / f"plan-{name}.json"))
            config = root / f"config-{name}.toml"
            config.write_text(f'[[targets]]\nname = "gw"\nkind = "rllm"\nurl = "{server.url}"\n'
                              "timeout_seconds = 1\n")
            values[f"config:{name}"] = str(config)
        yield values


@pytest.mark.parametrize(("argv", "variant"), CASES)
def test_every_command_says_one_sentence_and_exits_1_or_2(inputs: dict[str, str], argv: list[str],
                                                          variant: str | None, tmp_path: Path) -> None:
    fields = {"tmp": str(tmp_path), "unreachable": inputs["unreachable"], **{
        key: inputs[key] for key in ("toml_inf", "toml_nan", "good_plan", "signed_plan", "blob_store", "text_store")}}
    if variant in SERVERS:
        fields.update(url=inputs[f"url:{variant}"], plan_for_url=inputs[f"plan:{variant}"],
                      config_for_url=inputs[f"config:{variant}"])
    elif variant is not None:
        fields.update(bad=inputs[f"file:{variant}"], bad_snapshot=inputs[f"snapshot:{variant}"])
    if any(f"{{{key}}}" in word and not fields[key] for word in argv for key in ("blob_store", "text_store")):
        pytest.skip("needs rllm-model-gateway for the gateway's schema")
    env = {key: value for key, value in os.environ.items()
           if key not in (PLAN_KEY_ENV, PLAN_KEY_FILE_ENV, "GATEWAYSCOPE_CONFIG")}
    words = [word.format(**fields) for word in argv]
    if "@env" in words:
        at = words.index("@env")
        name, _, value = words[at + 1].partition("=")
        env[name] = value
        del words[at:at + 2]
    stdin = "/dev/null"
    if "@stdin" in words:  # the next word is the file the command reads as its standard input
        at = words.index("@stdin")
        stdin = words[at + 1]
        del words[at:at + 2]
    (tmp_path / "not-utf8.txt").write_bytes(b"\xff\xfe task:0\n")
    try:
        with open(stdin, "rb") as given:
            done = subprocess.run([sys.executable, "-m", "gatewayscope", *words], capture_output=True, text=True,
                                  timeout=CASE_TIMEOUT, env=env, stdin=given, cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail(f"gatewayscope {' '.join(words)} still ran after {CASE_TIMEOUT} s")
    said = done.stdout + done.stderr
    assert "Traceback" not in said, said[-3000:]
    assert "unexpected " not in said, said[-3000:]
    assert done.returncode in (1, 2), (done.returncode, said[-3000:])
    assert said.strip(), "it said nothing"
