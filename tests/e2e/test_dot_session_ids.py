"""Session ids ``.`` and ``..`` over the real rLLM gateway's REST API, and ids it cannot address at all.

httpx collapses a bare ``.`` or ``..`` path segment (``/sessions/./traces`` becomes ``/sessions/traces``);
``session_path`` writes them ``%2E``/``%2E%2E``, which the gateway decodes back into the id. On PyPI's 0.1.0 an
id holding a ``/`` reaches no route (the gateway decodes ``%2F`` before routing): ``session_path`` refuses it.
Upstream main routes ``/sessions/{session_id:path}`` and takes multi-segment ids from the chat path itself
(``harbor/hello-world:0``, namespaced Harbor tasks): there such an id IS addressable. ``RllmClient.session_path``
asks the gateway whether it routes such ids (``routes_path_ids``) and writes them out there; on 0.1.0 it refuses
them as ``session_path`` does. ``plan`` and ``apply`` through upstream's URL delete a namespaced orphan.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gatewayscope.errors import UnaddressableSessionError
from gatewayscope.sources.rllm_http import RllmClient, session_path
from tests.helpers import gateway_sessions, wait_for

pytestmark = pytest.mark.e2e

DOT_IDS = (".", "..")


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_dot_session_ids_are_read_and_deleted_through_the_gateway(store: str, rllm_gateway: Any) -> None:
    gateway = rllm_gateway(store)
    with httpx.Client(base_url=gateway.url, timeout=30) as raw:
        for sid in DOT_IDS:  # the gateway takes the session id from the chat call's path
            answer = raw.post(f"{session_path(sid)}/v1/chat/completions",
                              json={"model": "stub", "messages": [{"role": "user", "content": "hi"}]})
            answer.raise_for_status()
        raw.post("/sessions/keep:0/v1/chat/completions",
                 json={"model": "stub", "messages": [{"role": "user", "content": "hi"}]}).raise_for_status()
    wait_for("the three sessions' traces stored", lambda: gateway_sessions(gateway.url),
             lambda listed: all(listed.get(sid) == 1 for sid in (*DOT_IDS, "keep:0")))

    with RllmClient(gateway.url, timeout=30) as client:
        for sid in DOT_IDS:
            traces = client.request("GET", f"{session_path(sid)}/traces")
            assert [t["session_id"] for t in traces] == [sid]
        for sid in DOT_IDS:
            assert client.request("DELETE", session_path(sid)) == {"deleted": 1}
    assert gateway_sessions(gateway.url) == {"keep:0": 1}, "only the dot sessions were deleted"


def test_an_id_with_a_slash_reaches_a_route_only_on_upstream(rllm_gateway: Any, gateway_flavor: Any) -> None:
    gateway = rllm_gateway("sqlite")
    # the 0.1.0 gateway never stores such an id itself (its chat route takes one path segment); another writer can
    conn = sqlite3.connect(gateway.db_path)
    with conn:
        now = time.time()
        conn.execute("INSERT INTO traces (trace_id, data, created_at) VALUES (?, ?, ?)",
                     ("t-slash", json.dumps({"trace_id": "t-slash", "session_id": "a/b"}), now))
        conn.execute("INSERT INTO trace_sessions (trace_id, session_id, created_at) VALUES (?, ?, ?)",
                     ("t-slash", "a/b", now))
    conn.close()
    assert gateway_sessions(gateway.url) == {"a/b": 1}
    with httpx.Client(base_url=gateway.url, timeout=30) as raw:
        if not gateway_flavor.upstream:
            assert raw.get("/sessions/a%2Fb/traces").status_code == 404
            assert raw.delete("/sessions/a%2Fb").status_code == 404
        else:  # /sessions/{session_id:path}: encoded or not, the path reaches the session
            assert [t["trace_id"] for t in raw.get("/sessions/a%2Fb/traces").json()] == ["t-slash"]
            assert [t["trace_id"] for t in raw.get("/sessions/a/b/traces").json()] == ["t-slash"]
            assert raw.get("/sessions/a%2Fb").json()["trace_count"] == 1
            assert raw.delete("/sessions/a%2Fb").json() == {"deleted": 1}
            assert gateway_sessions(gateway.url) == {}
    with pytest.raises(UnaddressableSessionError, match="SQLite store directly"):
        session_path("a/b")  # without asking the gateway: refused
    with RllmClient(gateway.url, timeout=30) as client:
        assert client.routes_path_ids() == gateway_flavor.upstream
        if not gateway_flavor.upstream:
            with pytest.raises(UnaddressableSessionError, match="SQLite store directly"):
                client.session_path("a/b")
        else:
            assert client.session_path("a/b") == "/sessions/a%2Fb"
            assert client.session_path("x") == "/sessions/x"  # an id without '/' is not asked about


def _chat(client: httpx.Client, sid: str) -> None:
    client.post(f"/sessions/{sid}/v1/chat/completions",
                json={"model": "stub", "messages": [{"role": "user", "content": "hi"}]}).raise_for_status()


@pytest.mark.parametrize("gateway_flavor", ["upstream-main"], indirect=True)
def test_a_namespaced_session_of_upstream_is_deleted_through_session_path(rllm_gateway: Any,
                                                                         gateway_flavor: Any) -> None:
    gateway = rllm_gateway("memory")
    namespaced = ["harbor/hello-world:0", "harbor/hello-world:1", "harbor/x/traces"]
    with httpx.Client(base_url=gateway.url, timeout=30) as raw:
        for sid in namespaced:  # upstream takes the session id from the chat path, slashes and all
            _chat(raw, sid)
        wait_for("the namespaced sessions' traces", lambda: gateway_sessions(gateway.url),
                 lambda listed: listed == dict.fromkeys(namespaced, 1))
    with RllmClient(gateway.url, timeout=30) as client:  # gatewayscope's own path to the gateway's routes
        for sid in namespaced:
            assert [t["session_id"] for t in client.request("GET", f"{client.session_path(sid)}/traces")] == [sid]
        assert client.request("DELETE", client.session_path(namespaced[0])) == {"deleted": 1}
        assert client.request("DELETE", client.session_path(namespaced[2])) == {"deleted": 1}
    assert gateway_sessions(gateway.url) == {namespaced[1]: 1}


def _gatewayscope(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it, without the caller's config file."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd)}
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return subprocess.run([sys.executable, "-c", "from gatewayscope.cli import run; run()", *args],
                          capture_output=True, text=True, timeout=180, cwd=cwd, env=env)


#: seconds a one-trace session must be idle to be planned as a suspected orphan here
IDLE = 1.0


@pytest.mark.parametrize("gateway_flavor", ["upstream-main"], indirect=True)
def test_plan_and_apply_delete_a_namespaced_orphan_through_upstreams_url(rllm_gateway: Any, gateway_flavor: Any,
                                                                         tmp_path: Path) -> None:
    """apply re-reads each orphan (GET /sessions/{id}/traces) before its batch delete: a namespaced id is read
    through upstream's path route and deleted; the live namespaced session keeps its traces."""
    gateway = rllm_gateway("memory")
    orphan, live = "harbor/hello-world:0", "harbor/hello-world:1"
    with httpx.Client(base_url=gateway.url, timeout=30) as raw:
        for sid in (orphan, live, live):
            _chat(raw, sid)
    wait_for("the traces", lambda: gateway_sessions(gateway.url), lambda listed: listed == {orphan: 1, live: 2})
    time.sleep(IDLE + 0.2)
    (tmp_path / "gatewayscope.toml").write_text(
        f'[[targets]]\nname = "upstream"\nkind = "rllm"\nurl = "{gateway.url}"\n\n'
        f'[policy]\norphan_idle_seconds = {IDLE}\n')
    planned = _gatewayscope("plan", "--config", "gatewayscope.toml", "--include-suspected", "--out", "plan.json",
                            cwd=tmp_path)
    assert planned.returncode == 0, planned.stdout[-2000:] + planned.stderr[-2000:]
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert [a["subject"] for a in plan["actions"] if a["kind"] == "session_delete"] == [orphan]
    applied = _gatewayscope("apply", "plan.json", "--config", "gatewayscope.toml", "--yes", "--allow-delete",
                            cwd=tmp_path)
    assert applied.returncode == 0, applied.stdout[-2000:] + applied.stderr[-2000:]
    assert applied.stdout.splitlines()[-1] == "1 done, 0 refused, 0 unconfirmed, 0 gone, 0 stale, 0 already-done"
    assert gateway_sessions(gateway.url) == {live: 2}
