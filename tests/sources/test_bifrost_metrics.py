"""Reading a Bifrost gateway's runtime metrics (gatewayscope.sources.bifrost.metrics): from the emulator, with
and without auth; the credentials only to the management API's own origin; and every way the answer can be
unusable or hostile, each a sentence and the band as the fallback, never a failed read of the gateway."""

from __future__ import annotations

import base64
import threading
import time

import httpx
import pytest

from gatewayscope.config import AuthConfig, Policy, Target
from gatewayscope.sandbox.bifrost_emulator import BifrostEmulator, EmulatorOptions, seed_small
from gatewayscope.sources.bifrost import parse_runtime_metrics, read_bifrost, read_runtime_metrics
from tests.hostile import drip_body, endless_chunked, hostile, huge_length, redirect

ADMIN = ("admin", "Adm1n-Passw0rd!")
FALLBACK = "the boot estimate uses the 2-8 KiB band."
GOOD = ("# HELP go_goroutines x\n# TYPE go_goroutines gauge\ngo_goroutines 1064\n"
        "go_memstats_stack_inuse_bytes 8716288\nprocess_resident_memory_bytes 7.5e+07\n")


def test_the_emulators_metrics_are_read_into_the_snapshot() -> None:
    with BifrostEmulator(options=EmulatorOptions(stack_bytes_per_goroutine=5000, baseline_goroutines=10)) as emu:
        seed_small(emu)
        data = read_bifrost(Target(name="b", kind="bifrost", url=emu.url), Policy())
        runtime = emu.runtime()
    assert data.runtime_error is None and data.runtime is not None
    assert data.runtime.goroutines == runtime["goroutines"] == 9586
    assert data.runtime.stack_inuse_bytes == 9586 * 5000
    assert data.runtime.resident_memory_bytes == runtime["resident_memory_bytes"]
    assert data.runtime.heap_inuse_bytes is not None and data.runtime.url.endswith("/metrics")


def test_the_metrics_are_read_while_the_management_api_is() -> None:
    """The metrics request is out before the listing is answered: the listing's handler waits (bounded) for
    it, so a read that asked for the metrics only after the management API would find it never came."""
    metrics_asked = threading.Event()
    listing_saw_metrics: list[bool] = []
    with BifrostEmulator() as emu, httpx.Client() as upstream:
        seed_small(emu)

        def forward(request: httpx.Request) -> httpx.Response:
            if request.url.path == "/metrics":
                metrics_asked.set()
            elif request.url.path == "/api/providers":
                listing_saw_metrics.append(metrics_asked.wait(5.0))
            answer = upstream.request(request.method, str(request.url), content=request.content)
            return httpx.Response(answer.status_code, content=answer.content,
                                  headers={"content-type": answer.headers.get("content-type", "text/plain")})

        data = read_bifrost(Target(name="b", kind="bifrost", url=emu.url), Policy(),
                            transport=httpx.MockTransport(forward))
    assert data.runtime_error is None and data.runtime is not None and data.records.height == 12
    assert listing_saw_metrics == [True]


def test_with_auth_on_the_management_credentials_are_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BF_PW", ADMIN[1])
    with BifrostEmulator(auth=ADMIN) as emu:
        seed_small(emu)
        target = Target(name="b", kind="bifrost", url=emu.url,
                        auth=AuthConfig(username=ADMIN[0], password_env="BF_PW"))
        data = read_bifrost(target, Policy())
        assert data.runtime is not None and data.runtime_error is None
        runtime, reason = read_runtime_metrics(target, auth=("admin", "wrong-password-1A!"))
    assert runtime is None
    assert reason == f"{emu.url}/metrics refused the management API's credentials (HTTP 401); {FALLBACK}"


def recorder(answers: dict[str, httpx.Response]) -> tuple[httpx.MockTransport, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answers.get(str(request.url), httpx.Response(404, text="Not Found"))
    return httpx.MockTransport(handle), seen


@pytest.mark.parametrize("metrics_url,sends_auth", [
    (None, True),                                    # the management API's /metrics
    ("http://bifrost.test:8080/telemetry", True),    # another path of the same origin
    ("http://metrics.test:9090/metrics", False),     # another host: no password goes there
    ("https://bifrost.test:8080/metrics", False),    # another scheme
])
def test_credentials_go_only_to_the_management_apis_origin(metrics_url: str | None, sends_auth: bool) -> None:
    url = metrics_url or "http://bifrost.test:8080/metrics"
    transport, seen = recorder({url: httpx.Response(200, text=GOOD)})
    target = Target(name="b", kind="bifrost", url="http://bifrost.test:8080", metrics_url=metrics_url)
    runtime, reason = read_runtime_metrics(target, transport=transport, auth=ADMIN)
    assert reason is None and runtime is not None and runtime.goroutines == 1064
    assert [str(r.url) for r in seen] == [url]
    header = seen[0].headers.get("authorization")
    expected = "Basic " + base64.b64encode(f"{ADMIN[0]}:{ADMIN[1]}".encode()).decode()
    assert header == (expected if sends_auth else None)


def test_read_metrics_false_reads_nothing() -> None:
    transport, seen = recorder({})
    target = Target(name="b", kind="bifrost", url="http://bifrost.test:8080", read_metrics=False)
    assert read_runtime_metrics(target, transport=transport) == (
        None, f"b: its metrics are not read (read_metrics = false); {FALLBACK}")
    assert seen == []


def test_metrics_switched_off_is_the_band_with_the_reason() -> None:
    with BifrostEmulator(options=EmulatorOptions(metrics_enabled=False)) as emu:
        seed_small(emu)
        data = read_bifrost(Target(name="b", kind="bifrost", url=emu.url), Policy())
    assert data.runtime is None and data.records.height == 12  # the read itself succeeded
    assert data.runtime_error == (f"{emu.url}/metrics answered 404: the gateway's telemetry plugin is off (or its "
                                  f"metrics are switched off), or metrics_url names the wrong place; {FALLBACK}")


@pytest.mark.parametrize("status,body,reason", [
    (500, "boom", "answered HTTP 500"),
    (200, b"\xff\xfe not utf-8", "answered something that is not UTF-8 text"),
    (200, "<html><body>login</body></html>", "have no go_goroutines sample"),
    (200, '{"providers": []}', "have no go_goroutines sample"),
])
def test_unusable_answers_are_sentences(status: int, body: str | bytes, reason: str) -> None:
    url = "http://bifrost.test:8080/metrics"
    transport, _ = recorder({url: httpx.Response(status, content=body.encode() if isinstance(body, str) else body)})
    runtime, why = read_runtime_metrics(Target(name="b", kind="bifrost", url="http://bifrost.test:8080"),
                                        transport=transport)
    assert runtime is None and why is not None and reason in why and why.endswith(FALLBACK)


@pytest.mark.parametrize("text,reason", [
    ("go_goroutines 10\ngo_memstats_stack_inuse_bytes 1\n", "have no process_resident_memory_bytes sample"),
    (GOOD + "go_goroutines 12\n", "give 2 samples of go_goroutines, where one process has one"),
    (GOOD.replace("1064", "NaN"), "give go_goroutines as nan"),
    (GOOD.replace("1064", "+Inf"), "give go_goroutines as inf"),
    (GOOD.replace("8716288", "-5"), "give go_memstats_stack_inuse_bytes as -5.0"),
    (GOOD.replace("1064", "0"), "give go_goroutines as 0"),
    ('go_goroutines{a="unterminated 5\n' + GOOD, "are not Prometheus text"),
])
def test_figures_that_cannot_be_used(text: str, reason: str) -> None:
    parsed = parse_runtime_metrics(text, "http://b/metrics")
    assert isinstance(parsed, str) and reason in parsed, parsed


def test_only_the_wanted_series_are_parsed() -> None:
    """The plugin's own series can be huge and odd; a broken line of one of them does not spoil the read."""
    noise = "".join(f'bifrost_upstream_requests_total{{provider="p{i}",model="m"}} {i}\n' for i in range(20_000))
    text = noise + 'bifrost_broken{label="never closed 1\n' + GOOD + "http_requests_total 5\n"
    parsed = parse_runtime_metrics(text, "http://b/metrics")
    assert not isinstance(parsed, str)
    assert (parsed.goroutines, parsed.stack_inuse_bytes, parsed.resident_memory_bytes) == (1064, 8716288, 7.5e7)
    assert parsed.heap_inuse_bytes is None and parsed.sys_bytes is None


@pytest.mark.parametrize("behaviour,reason", [
    (drip_body(0.2), "did not answer within 1 s"),
    (huge_length(), "with more than"),
    (endless_chunked(), "with more than"),
    (redirect("http://elsewhere.test/metrics"), "a redirect to http://elsewhere.test/metrics"),
])
def test_hostile_servers_are_bounded(behaviour: object, reason: str) -> None:
    with hostile(behaviour) as server:  # type: ignore[arg-type]
        target = Target(name="b", kind="bifrost", url="http://bifrost.test:8080", metrics_url=server.url + "/metrics",
                        timeout_seconds=1.0, max_body_bytes=1 << 20)
        started = time.monotonic()
        runtime, why = read_runtime_metrics(target)
        elapsed = time.monotonic() - started
    assert runtime is None and why is not None and reason in why and why.endswith(FALLBACK), why
    assert elapsed < 10  # bounded by the timeout, not by the server
