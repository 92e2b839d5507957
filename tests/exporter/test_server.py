"""The exporter over real HTTP on a free port, against scripted gateways (tiny local servers and transports).

No wall-clock assertions: a deadline is shown to work by the scrape answering at all (the hung gateway
would hold a read for far longer than the client waits) and by the exporter's own counters.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gatewayscope.config import Config, Policy, Target
from gatewayscope.errors import ConfigError
from gatewayscope.exporter.cache import TargetCache
from gatewayscope.exporter.server import ExporterServer, make_server
from gatewayscope.exporter.settings import ExporterSettings
from gatewayscope.sandbox.processes import free_port
from gatewayscope.snapshot import TargetSnapshot
from tests.hostile import drip_body, hostile

NOW = time.time()
SESSIONS = [
    {"session_id": "task-a:0", "trace_count": 1, "created_at": NOW - 90_000},
    {"session_id": "task-b:0", "trace_count": 4, "created_at": NOW - 90_000},
]
CLIENT_TIMEOUT = 20.0  # far below the hung gateway's own read timeout (HANG_TIMEOUT)
HANG_TIMEOUT = 120.0


# -- scripted gateways ------------------------------------------------------------------------------

class ScriptedGateway:
    """A tiny HTTP server on a free loopback port; ``reply(handler)`` answers each request."""

    def __init__(self, reply: Callable[[BaseHTTPRequestHandler], None]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                reply(self)

            do_POST = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def send_json(handler: BaseHTTPRequestHandler, status: int, body: Any) -> None:
    data = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def good_reply(handler: BaseHTTPRequestHandler) -> None:
    path = handler.path.split("?")[0]
    if path == "/openapi.json":
        send_json(handler, 200, {"paths": {"/sessions": {}}})
    elif path == "/sessions":
        send_json(handler, 200, SESSIONS)
    elif path == "/traces/query":
        length = int(handler.headers.get("Content-Length") or 0)
        ids = json.loads(handler.rfile.read(length))["session_ids"]
        send_json(handler, 200, [{"session_id": sid, "trace_id": "t-" + sid, "timestamp": NOW - 80_000,
                                  "messages": [{"role": "user", "content": "hi"}]} for sid in ids])
    else:
        send_json(handler, 404, {"detail": "Not Found"})


def garbage_reply(handler: BaseHTTPRequestHandler) -> None:
    data = b"<html>this is not the gateway you are looking for</html>"
    handler.send_response(200)
    handler.send_header("Content-Type", "text/html")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


@pytest.fixture
def gateways() -> Iterator[dict[str, str]]:
    """URLs of a good, a hanging, a garbage-answering and a down gateway; all stopped at teardown."""
    release = threading.Event()

    def hang_reply(handler: BaseHTTPRequestHandler) -> None:
        release.wait(HANG_TIMEOUT)
        send_json(handler, 503, {"detail": "released"})

    good, hang, garbage = ScriptedGateway(good_reply), ScriptedGateway(hang_reply), ScriptedGateway(garbage_reply)
    try:
        yield {"good": good.url, "hang": hang.url, "garbage": garbage.url,
               "down": f"http://127.0.0.1:{free_port()}"}
    finally:
        release.set()
        for server in (good, hang, garbage):
            server.stop()


def config_for(urls: dict[str, str], **settings: Any) -> tuple[Config, ExporterSettings]:
    targets = [Target(name=name, kind="rllm", url=url, timeout_seconds=HANG_TIMEOUT if name == "hang" else 5.0)
               for name, url in urls.items()]
    return (Config(targets=targets, policy=Policy(orphan_idle_seconds=3600)),
            ExporterSettings(listen="127.0.0.1:0", **settings))


@pytest.fixture
def serve() -> Iterator[Callable[..., ExporterServer]]:
    """Start exporter servers on free ports; every one is stopped (and its reads awaited) at teardown."""
    started: list[ExporterServer] = []

    def start(config: Config, settings: ExporterSettings, **kwargs: Any) -> ExporterServer:
        server = make_server(config, settings, **kwargs).start()
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()


def parse(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def get(found: dict, name: str, **labels: str) -> float:
    return found[(name, frozenset(labels.items()))]


def scrape(url: str, path: str = "/metrics", *, timeout_header: str | None = "1", **kwargs: Any) -> httpx.Response:
    headers = {"X-Prometheus-Scrape-Timeout-Seconds": timeout_header} if timeout_header else {}
    headers.update(kwargs.pop("headers", {}))
    return httpx.get(url + path, headers=headers, timeout=CLIENT_TIMEOUT, **kwargs)


# -- the deadline and failing targets ----------------------------------------------------------------

def test_hung_garbage_and_down_targets_give_up_zero_and_the_good_one_is_intact(
        gateways: dict[str, str], serve: Callable[..., ExporterServer]) -> None:
    server = serve(*config_for(gateways))
    response = scrape(server.url)  # answers although one gateway never does (the client would time out)
    assert response.status_code == 200
    found = parse(response.text)
    assert get(found, "gatewayscope_up", target="good", kind="rllm") == 1
    assert get(found, "gatewayscope_trace_store_sessions", target="good") == 2
    assert get(found, "gatewayscope_trace_store_orphan_sessions", target="good", confidence="suspected") == 1
    for name in ("hang", "garbage", "down"):
        assert get(found, "gatewayscope_up", target=name, kind="rllm") == 0, name
        assert not any(n.startswith("gatewayscope_trace_store_") and ("target", name) in labels
                       for n, labels in found), name
    # the hung read missed this scrape's deadline and is still running; the others completed with an error
    assert get(found, "gatewayscope_exporter_target_scrapes_total", target="hang", source="deadline") == 1
    assert get(found, "gatewayscope_exporter_read_in_progress", target="hang") == 1
    assert get(found, "gatewayscope_exporter_target_reads_total", target="garbage", result="error") == 1
    assert get(found, "gatewayscope_exporter_target_reads_total", target="down", result="error") == 1
    assert get(found, "gatewayscope_exporter_target_reads_total", target="good", result="ok") == 1

    # a second scrape joins the hung read instead of starting another (single-flight)
    found = parse(scrape(server.url).text)
    assert get(found, "gatewayscope_up", target="hang", kind="rllm") == 0
    assert get(found, "gatewayscope_exporter_target_scrapes_total", target="hang", source="deadline") == 2
    assert get(found, "gatewayscope_exporter_target_reads_total", target="hang", result="ok") == 0
    assert get(found, "gatewayscope_exporter_target_reads_total", target="hang", result="error") == 0


def test_without_the_header_the_default_timeout_applies(gateways: dict[str, str],
                                                        serve: Callable[..., ExporterServer]) -> None:
    config, settings = config_for({"hang": gateways["hang"], "good": gateways["good"]},
                                  default_scrape_timeout_seconds=1.0)
    server = serve(config, settings)
    found = parse(scrape(server.url, timeout_header=None).text)
    assert get(found, "gatewayscope_up", target="hang", kind="rllm") == 0
    assert get(found, "gatewayscope_up", target="good", kind="rllm") == 1


# -- /probe -----------------------------------------------------------------------------------------

def test_probe_serves_one_target(gateways: dict[str, str], serve: Callable[..., ExporterServer]) -> None:
    server = serve(*config_for({"good": gateways["good"], "down": gateways["down"]}))
    found = parse(scrape(server.url, "/probe?target=good").text)
    targets = {dict(labels).get("target") for _, labels in found}
    assert targets == {"good"}
    assert get(found, "gatewayscope_up", target="good", kind="rllm") == 1
    assert "gatewayscope_build_info" not in {name for name, _ in found}
    found = parse(scrape(server.url, "/probe?target=down").text)
    assert get(found, "gatewayscope_up", target="down", kind="rllm") == 0


def test_probe_unknown_or_missing_target_is_a_clear_400(gateways: dict[str, str],
                                                       serve: Callable[..., ExporterServer]) -> None:
    server = serve(*config_for({"good": gateways["good"], "down": gateways["down"]}))
    response = scrape(server.url, "/probe?target=http://evil.example:9090")
    assert response.status_code == 400
    assert "unknown target 'http://evil.example:9090'" in response.text
    assert "configured targets: good, down" in response.text
    response = scrape(server.url, "/probe")
    assert response.status_code == 400 and "needs exactly one ?target=NAME" in response.text
    # nothing was read for the unknown name
    found = parse(scrape(server.url, "/exporter-metrics").text)
    assert {dict(labels).get("target") for _, labels in found} <= {"good", "down", None}


def test_exporter_metrics_reads_no_target(gateways: dict[str, str], serve: Callable[..., ExporterServer]) -> None:
    server = serve(*config_for({"good": gateways["good"]}))
    found = parse(scrape(server.url, "/exporter-metrics").text)
    assert get(found, "gatewayscope_exporter_target_scrapes_total", target="good", source="read") == 0
    assert "gatewayscope_up" not in {name for name, _ in found}
    assert ("gatewayscope_build_info", frozenset({("version", __import__("gatewayscope").__version__)})) in found


# -- min interval and single-flight (reads counted on a scripted transport) --------------------------

class CountingGateway:
    """An httpx transport playing an rLLM gateway that counts session listings and can hold them."""

    def __init__(self) -> None:
        self.listings = 0
        self.release = threading.Event()
        self.release.set()
        self.lock = threading.Lock()

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/openapi.json":
            return httpx.Response(200, json={"paths": {"/sessions": {}}})
        if request.url.path == "/sessions":
            with self.lock:
                self.listings += 1
            self.release.wait(HANG_TIMEOUT)
            return httpx.Response(200, json=SESSIONS[1:])
        return httpx.Response(404, json={"detail": "Not Found"})

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handler)


def test_min_interval_reuses_the_last_read(serve: Callable[..., ExporterServer]) -> None:
    fake = CountingGateway()
    config = Config(targets=[Target(name="fake", kind="rllm", url="http://fake.test:9090")], policy=Policy())
    server = serve(config, ExporterSettings(listen="127.0.0.1:0", min_interval_seconds=3600),
                   transports={"fake": fake.transport()})
    first = scrape(server.url, timeout_header="10").text
    for _ in range(3):
        found = parse(scrape(server.url, timeout_header="10").text)
    parse(scrape(server.url, "/probe?target=fake", timeout_header="10").text)
    assert fake.listings == 1
    found = parse(scrape(server.url, timeout_header="10").text)
    assert get(found, "gatewayscope_exporter_target_scrapes_total", target="fake", source="read") == 1
    assert get(found, "gatewayscope_exporter_target_scrapes_total", target="fake", source="cached") == 5
    assert get(found, "gatewayscope_trace_store_sessions", target="fake") == 1
    assert "may be up to min_interval_seconds (3600 s)" in first


def test_warm_reads_do_not_ask_for_the_orphans_traces_again(serve: Callable[..., ExporterServer]) -> None:
    asked: list[list[str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/sessions":
            return httpx.Response(200, json=SESSIONS)
        if request.url.path == "/traces/query":
            ids = json.loads(request.content)["session_ids"]
            asked.append(ids)
            return httpx.Response(200, json=[{"trace_id": f"t-{sid}", "session_id": sid, "timestamp": NOW - 90_000,
                                              "model": "m", "messages": []} for sid in ids])
        return httpx.Response(404, json={"detail": "Not Found"})

    config = Config(targets=[Target(name="fake", kind="rllm", url="http://fake.test:9090")], policy=Policy())
    server = serve(config, ExporterSettings(listen="127.0.0.1:0", min_interval_seconds=0),
                   transports={"fake": httpx.MockTransport(handler)})
    for _ in range(3):
        found = parse(scrape(server.url, timeout_header="10").text)
        assert get(found, "gatewayscope_trace_store_orphan_sessions", target="fake", confidence="suspected") == 1
    assert get(found, "gatewayscope_exporter_target_reads_total", target="fake", result="ok") == 3
    assert asked == [["task-a:0"]], "three reads, one trace query: the orphan's trace is kept"


def test_a_running_read_is_never_started_twice(serve: Callable[..., ExporterServer]) -> None:
    fake = CountingGateway()
    fake.release.clear()  # the listing hangs until released
    config = Config(targets=[Target(name="fake", kind="rllm", url="http://fake.test:9090")], policy=Policy())
    server = serve(config, ExporterSettings(listen="127.0.0.1:0", min_interval_seconds=0),
                   transports={"fake": fake.transport()})
    statuses: list[int] = []

    def one() -> None:
        statuses.append(scrape(server.url, timeout_header="1").status_code)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(CLIENT_TIMEOUT + 5)
    scrape(server.url, "/probe?target=fake", timeout_header="1")
    assert statuses == [200] * 4
    assert fake.listings == 1  # five scrapes, one read

    fake.release.set()
    assert server.exporter.cache.wait_idle(timeout=CLIENT_TIMEOUT)
    found = parse(scrape(server.url, timeout_header="10").text)  # min interval 0: a new read
    assert fake.listings == 2
    assert get(found, "gatewayscope_up", target="fake", kind="rllm") == 1
    assert get(found, "gatewayscope_exporter_target_reads_total", target="fake", result="ok") == 2
    assert get(found, "gatewayscope_exporter_target_scrapes_total", target="fake", source="deadline") == 5


# -- auth, TLS, landing page, formats ----------------------------------------------------------------

def test_basic_auth(gateways: dict[str, str], serve: Callable[..., ExporterServer],
                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GS_TEST_EXPORTER_PASSWORD", "s3cret-pw")
    config, settings = config_for({"good": gateways["good"]}, basic_auth_username="prometheus",
                                  basic_auth_password_env="GS_TEST_EXPORTER_PASSWORD")
    server = serve(config, settings)
    for path in ("/metrics", "/probe?target=good", "/", "/exporter-metrics"):
        response = scrape(server.url, path)
        assert response.status_code == 401, path
        assert response.headers["WWW-Authenticate"].startswith("Basic ")
    assert scrape(server.url, auth=("prometheus", "wrong")).status_code == 401
    assert scrape(server.url, auth=("someone", "s3cret-pw")).status_code == 401
    assert scrape(server.url, headers={"Authorization": "Basic !!!not-base64"}).status_code == 401
    response = scrape(server.url, auth=("prometheus", "s3cret-pw"))
    assert response.status_code == 200
    assert get(parse(response.text), "gatewayscope_up", target="good", kind="rllm") == 1


def test_the_probe_paths_answer_without_basic_auth_and_say_nothing_else(
        gateways: dict[str, str], serve: Callable[..., ExporterServer], monkeypatch: pytest.MonkeyPatch) -> None:
    """A kubelet's liveness and readiness probes carry no credentials: /-/healthy and /-/ready answer them,
    and only with OK; every other path still asks for the password."""
    monkeypatch.setenv("GS_TEST_EXPORTER_PASSWORD", "s3cret-pw")
    config, settings = config_for({"good": gateways["good"]}, basic_auth_username="prometheus",
                                  basic_auth_password_env="GS_TEST_EXPORTER_PASSWORD")
    server = serve(config, settings)
    for path in ("/-/healthy", "/-/ready", "/-/ready?verbose=1"):
        response = scrape(server.url, path)
        assert (response.status_code, response.text) == (200, "OK\n"), path
        assert "good" not in response.text
    for path in ("/-/healthy/", "/-/other", "/metrics"):
        assert scrape(server.url, path).status_code == 401, path
    assert scrape(server.url, "/-/other", auth=("prometheus", "s3cret-pw")).status_code == 404
    head = httpx.head(f"{server.url}/-/ready", timeout=CLIENT_TIMEOUT)
    assert head.status_code == 200 and head.content == b""


def test_basic_auth_username_and_password_from_files(gateways: dict[str, str], serve: Callable[..., ExporterServer],
                                                     tmp_path: Path) -> None:
    """The chart mounts a basic-auth Secret's username and password keys as files."""
    (tmp_path / "username").write_text("scraper\n")
    (tmp_path / "password").write_text("from-a-file\n")
    config, settings = config_for({"good": gateways["good"]}, basic_auth_username_file=str(tmp_path / "username"),
                                  basic_auth_password_file=str(tmp_path / "password"))
    server = serve(config, settings)
    assert scrape(server.url).status_code == 401
    assert scrape(server.url, auth=("prometheus", "from-a-file")).status_code == 401
    response = scrape(server.url, auth=("scraper", "from-a-file"))
    assert response.status_code == 200
    assert get(parse(response.text), "gatewayscope_up", target="good", kind="rllm") == 1


def test_an_unreadable_or_empty_credential_file_is_one_sentence_without_the_secret(
        gateways: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "password").write_text("hunter2\n")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    cases = {str(tmp_path / "missing"): "cannot read", str(empty): "is empty", str(tmp_path): "cannot read"}
    for username_file, expected in cases.items():
        config, settings = config_for({"good": gateways["good"]}, basic_auth_username_file=username_file,
                                      basic_auth_password_file=str(tmp_path / "password"))
        with pytest.raises(ConfigError) as caught:
            make_server(config, settings)
        message = str(caught.value)
        assert message.startswith("exporter.basic_auth_username_file: ") and expected in message, message
        assert username_file in message and "hunter2" not in message and "\n" not in message


def test_basic_auth_password_missing_is_a_config_error(gateways: dict[str, str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GS_TEST_EXPORTER_PASSWORD", raising=False)
    config, settings = config_for({"good": gateways["good"]}, basic_auth_username="prometheus",
                                  basic_auth_password_env="GS_TEST_EXPORTER_PASSWORD")
    with pytest.raises(ConfigError, match="GS_TEST_EXPORTER_PASSWORD is not set"):
        make_server(config, settings)


@pytest.fixture
def self_signed(tmp_path: Path) -> tuple[str, str]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    try:
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
             "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
            check=True, capture_output=True, timeout=60)
    except FileNotFoundError:
        pytest.skip("the openssl command is not installed (needed to make a self-signed certificate)")
    return str(cert), str(key)


@pytest.mark.e2e  # starts a process
def test_tls(gateways: dict[str, str], serve: Callable[..., ExporterServer], self_signed: tuple[str, str]) -> None:
    cert, key = self_signed
    config, settings = config_for({"good": gateways["good"]}, tls_cert_file=cert, tls_key_file=key)
    server = serve(config, settings)
    assert server.url.startswith("https://127.0.0.1:")
    context = ssl.create_default_context(cafile=cert)
    response = scrape(server.url, verify=context)
    assert response.status_code == 200
    assert get(parse(response.text), "gatewayscope_up", target="good", kind="rllm") == 1
    with pytest.raises(httpx.HTTPError):  # a client that does not trust the certificate gets nothing
        scrape(server.url)
    with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port gets no answer
        scrape(server.url.replace("https://", "http://"))
    assert scrape(server.url, verify=context).status_code == 200  # the server survived both


@pytest.mark.e2e  # starts a process
def test_tls_with_a_key_that_does_not_match_is_a_config_error(gateways: dict[str, str], tmp_path: Path,
                                                              self_signed: tuple[str, str]) -> None:
    cert, _ = self_signed
    bad_key = tmp_path / "not-a-key.pem"
    bad_key.write_text("-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----\n")
    config, settings = config_for({"good": gateways["good"]}, tls_cert_file=cert, tls_key_file=str(bad_key))
    with pytest.raises(ConfigError, match="cannot load the TLS certificate"):
        make_server(config, settings)


def test_landing_page(gateways: dict[str, str], serve: Callable[..., ExporterServer]) -> None:
    server = serve(*config_for({"good": gateways["good"], "down": gateways["down"]}))
    page = scrape(server.url, "/")
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    assert "not read yet" in page.text
    for name in ("good", "down"):
        assert f'href="/probe?target={name}"' in page.text
    assert 'href="/metrics"' in page.text and 'href="/exporter-metrics"' in page.text
    scrape(server.url)
    rows = landing_rows(scrape(server.url, "/").text)
    assert "<td>up</td>" in rows["good"] and "<td>down</td>" in rows["down"]
    assert scrape(server.url, "/-/healthy").text == "OK\n"
    assert scrape(server.url, "/nope").status_code == 404


def landing_rows(page: str) -> dict[str, str]:
    """The landing page's table rows by target name."""
    return {re.search(r"target=([^\"]+)", row).group(1): row  # type: ignore[union-attr]
            for row in re.findall(r"<tr>.*?</tr>", page) if "/probe?target=" in row}


def test_landing_page_shows_addresses_and_errors_only_behind_basic_auth(
        gateways: dict[str, str], serve: Callable[..., ExporterServer], monkeypatch: pytest.MonkeyPatch) -> None:
    urls = {"good": gateways["good"], "down": gateways["down"]}
    open_server = serve(*config_for(urls))
    scrape(open_server.url)
    page = scrape(open_server.url, "/").text
    rows = landing_rows(page)
    assert "<td>up</td>" in rows["good"] and "<td>down</td>" in rows["down"]
    for url in urls.values():
        assert url not in page and url.split("//")[1] not in page
    assert "Cannot reach" not in page and "127.0.0.1" not in page
    assert "only when the exporter requires basic auth" in page
    # the kind of the error (a fixed word, no secret) without basic auth, as docs/runbooks.md tells the operator
    assert "<td>unreachable</td>" in rows["down"] and "<td></td>" in rows["good"]

    monkeypatch.setenv("GS_TEST_EXPORTER_PASSWORD", "s3cret-pw")
    guarded = serve(*config_for(urls, basic_auth_username="prometheus",
                                basic_auth_password_env="GS_TEST_EXPORTER_PASSWORD"))
    scrape(guarded.url, auth=("prometheus", "s3cret-pw"))
    refused = scrape(guarded.url, "/")
    assert refused.status_code == 401 and urls["good"] not in refused.text
    rows = landing_rows(scrape(guarded.url, "/", auth=("prometheus", "s3cret-pw")).text)
    assert "<td>up</td>" in rows["good"] and urls["good"] in rows["good"]
    assert "<td>down</td>" in rows["down"] and "Cannot reach the rLLM gateway" in rows["down"]


def test_openmetrics_and_gzip(gateways: dict[str, str], serve: Callable[..., ExporterServer]) -> None:
    server = serve(*config_for({"good": gateways["good"]}))
    response = scrape(server.url, headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert response.headers["Content-Type"].startswith("application/openmetrics-text")
    assert response.text.rstrip().endswith("# EOF")
    response = scrape(server.url, headers={"Accept-Encoding": "gzip"})
    assert response.headers.get("Content-Encoding") == "gzip"  # httpx decodes it
    assert "gatewayscope_up{" in response.text
    plain = scrape(server.url)
    assert plain.headers["Content-Type"].startswith("text/plain; version=0.0.4")


# -- the command ---------------------------------------------------------------------------------------

def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from gatewayscope.cli import run; run()", "export", *args],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})


@pytest.mark.e2e  # starts a process
def test_cli_once(gateways: dict[str, str]) -> None:
    done = run_cli("--trace-store", gateways["good"], "--once")
    assert done.returncode == 0, done.stderr
    assert 'gatewayscope_up{kind="rllm",target="rllm-0"} 1.0' in done.stdout
    done = run_cli("--trace-store", gateways["good"], "--trace-store", gateways["down"], "--once")
    assert done.returncode == 1
    assert 'gatewayscope_up{kind="rllm",target="rllm-1"} 0.0' in done.stdout


@pytest.mark.e2e  # starts a process
def test_cli_config_problems_are_one_line_each(tmp_path: Path, gateways: dict[str, str]) -> None:
    config = tmp_path / "gatewayscope.toml"
    config.write_text(
        f'[[targets]]\nname = "gw"\nkind = "rllm"\nurl = "{gateways["good"]}"\n'
        '[exporter]\nmin_interval_seconds = -1\nbasic_auth_username = "p"\nbasic_auth_password = "plain"\n'
        'tls_cert_file = "/nonexistent/cert.pem"\n')
    done = run_cli("--config", str(config), "--once")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert f"gatewayscope: {config}: exporter.basic_auth_password: unknown key (a password never goes in the file: " \
           "use basic_auth_password_env or basic_auth_password_file)" in lines
    assert any("exporter.min_interval_seconds: expected a number of seconds >= 0, got -1" in line for line in lines)
    assert any("exporter.tls_key_file: TLS needs both tls_cert_file and tls_key_file" in line for line in lines)
    assert any("exporter.tls_cert_file: no such file: /nonexistent/cert.pem" in line for line in lines)
    assert any("exporter.basic_auth_username: needs exactly one of basic_auth_password_env" in line
               for line in lines)
    done = run_cli("--trace-store", gateways["good"], "--listen", "localhost")
    assert done.returncode == 2 and "--listen: expected HOST:PORT" in done.stderr


@pytest.mark.e2e  # starts a process
def test_cli_serves_until_sigterm(gateways: dict[str, str]) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", "from gatewayscope.cli import run; run()", "export", "--trace-store",
         gateways["good"], "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=CLIENT_TIMEOUT)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert 'gatewayscope_up{kind="rllm",target="rllm-0"} 1.0' in response.text
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0
        assert f"serving http://127.0.0.1:{port}/metrics" in err and "stopped" in err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_connections_are_served_without_nagle(monkeypatch: pytest.MonkeyPatch,
                                              serve: Callable[..., ExporterServer]) -> None:
    """The answer's headers and body are two writes; with Nagle on, a scraper that keeps its connection open
    (Prometheus does) waits for its own delayed ACK on every scrape. Every served socket has TCP_NODELAY."""
    import socket

    from gatewayscope.exporter import server as server_module

    seen: list[int] = []
    setup = server_module._Handler.setup

    def recording_setup(handler: Any) -> None:
        setup(handler)
        seen.append(handler.connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    monkeypatch.setattr(server_module._Handler, "setup", recording_setup)
    server = serve(Config(targets=[], policy=Policy()), ExporterSettings(listen="127.0.0.1:0"))
    with httpx.Client(timeout=CLIENT_TIMEOUT) as client:  # one keep-alive connection, three scrapes
        answers = [client.get(server.url + "/exporter-metrics") for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert seen and all(seen)


# -- hostile targets and many clients ------------------------------------------------------------------

def read_threads(name: str) -> int:
    return sum(1 for thread in threading.enumerate() if thread.name == f"gatewayscope-export-{name}")


@pytest.mark.slow  # seconds of real time: make e2e runs it
@pytest.mark.timeout(120)
def test_a_dripping_target_is_down_within_the_deadline_and_its_read_ends(
        serve: Callable[..., ExporterServer]) -> None:
    """A target that sends one byte every half second never trips a per-read timeout; its read still ends
    at the target's timeout, each scrape answers up 0 for it, and no scrape adds a thread for it."""
    with hostile(drip_body()) as drip:
        config = Config(targets=[Target(name="drip", kind="rllm", url=drip.url, timeout_seconds=1.0)],
                        policy=Policy())
        server = serve(config, ExporterSettings(listen="127.0.0.1:0", min_interval_seconds=0))
        threads = []
        for _ in range(3):
            found = parse(scrape(server.url, timeout_header="3").text)
            assert get(found, "gatewayscope_up", target="drip", kind="rllm") == 0
            threads.append(read_threads("drip"))
        assert server.exporter.cache.wait_idle(timeout=CLIENT_TIMEOUT), "the dripping read never ended"
        last = server.exporter.cache.counters()["drip"]["last"]
        assert last.snapshot.error_kind == "timeout" and "in time" in (last.snapshot.error or "")
        assert max(threads) <= 1 and read_threads("drip") == 0


@pytest.mark.timeout(180)
def test_two_hundred_connections_at_once_are_all_served_by_a_bounded_pool(
        serve: Callable[..., ExporterServer]) -> None:
    clients = 200
    server = serve(Config(targets=[], policy=Policy()), ExporterSettings(listen="127.0.0.1:0"))
    assert server.request_queue_size >= 128
    bound = server.max_threads
    assert bound < clients
    baseline = {thread.ident for thread in threading.enumerate()}
    done = threading.Event()
    peak = [0]

    def monitor() -> None:  # the server's threads started since the baseline, sampled until the clients end
        while not done.wait(0.005):
            extra = [t for t in threading.enumerate()
                     if t.ident not in baseline and not t.name.startswith(("hammer-", "monitor"))]
            peak[0] = max(peak[0], len(extra))

    all_connected = threading.Barrier(clients, timeout=60)
    statuses: list[int] = []
    errors: list[BaseException] = []

    def hammer() -> None:
        # every client connects first and asks only once all are connected: they are open at once
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        try:
            conn.connect()
            all_connected.wait()
            conn.request("GET", "/-/healthy")
            response = conn.getresponse()
            response.read()
            statuses.append(response.status)
        except BaseException as err:
            errors.append(err)
        finally:
            conn.close()

    watcher = threading.Thread(target=monitor, name="monitor", daemon=True)
    watcher.start()
    workers = [threading.Thread(target=hammer, name=f"hammer-{i}", daemon=True) for i in range(clients)]
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(150)
    finally:
        done.set()
        watcher.join(10)
    assert not any(worker.is_alive() for worker in workers)
    assert not errors, errors[:3]
    assert statuses == [200] * clients
    assert 0 < peak[0] <= bound, f"{peak[0]} server threads at once; the bound is {bound}"


def test_every_target_error_is_logged_once_each_time_it_changes_and_escaped(caplog: pytest.LogCaptureFixture) -> None:
    target = Target(name="t\x1b[2J", kind="rllm", url="http://127.0.0.1:9")
    errors = iter(["boom\x1b[31m\nFORGED", "boom\x1b[31m\nFORGED", "other", None, None, "other"])

    def reader(target: Target, policy: Policy, *, now: float, transport: Any = None) -> TargetSnapshot:
        error = next(errors)
        return TargetSnapshot(name=target.name, kind=target.kind, address=target.address, up=error is None,
                              started_at=now, duration_seconds=0.0, error=error,
                              error_kind=None if error is None else "source")

    cache = TargetCache([target], Policy(), min_interval_seconds=0, reader=reader)
    with caplog.at_level(logging.WARNING, logger="gatewayscope.exporter.cache"):
        for _ in range(6):
            cache.fetch([target], 10)
    lines = [record.getMessage() for record in caplog.records if record.name == "gatewayscope.exporter.cache"]
    assert lines == [
        "gatewayscope exporter: target t\\x1b[2J cannot be read: boom\\x1b[31m\\nFORGED",
        "gatewayscope exporter: target t\\x1b[2J cannot be read: other",
        "gatewayscope exporter: target t\\x1b[2J is read again (the error above is over)",
        "gatewayscope exporter: target t\\x1b[2J cannot be read: other",
    ]
