"""BifrostClient and read_bifrost against httpx.MockTransport: error mapping, auth, escaping, secrets."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gatewayscope.config import AuthConfig, Policy, Target
from gatewayscope.errors import (
    AuthError,
    BadResponseError,
    GatewayTimeoutError,
    HTTPStatusError,
    NotFoundError,
    UnreachableError,
)
from gatewayscope.sources.bifrost import (
    POOL_FIELDS,
    BifrostClient,
    HostResolver,
    RequestDroppedError,
    read_bifrost,
    record_fingerprint,
    record_row,
    sanitize_record,
    secret_hash,
)

BASE = "http://bifrost.test:8080"
PASSWORD = "hunter2-Very-Secret!"

Handler = Callable[[httpx.Request], httpx.Response]


def envelope(status: int, message: str, *, is_bifrost_error: bool = False, error_type: str | None = None,
             code: int | None = None) -> httpx.Response:
    error: dict[str, Any] = {"message": message}
    if error_type:
        error["type"] = error_type
    body = {"is_bifrost_error": is_bifrost_error, "status_code": code if code is not None else status,
            "error": error, "extra_fields": {}}
    return httpx.Response(status, json=body)


class Recorder:
    """A MockTransport handler that records every request and answers from a function."""

    def __init__(self, answer: Handler) -> None:
        self.answer = answer
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        return self.answer(request)

    def client(self, **kwargs: Any) -> BifrostClient:
        return BifrostClient(BASE, transport=httpx.MockTransport(self), **kwargs)


def ok(body: Any) -> Handler:
    return lambda request: httpx.Response(200, json=body)


# -- records with every kind of secret the API can show ---------------------------------------------

SECRETS = ["sk-l************************9xyz", "http************************:3128", "prox************************user",
           "<REDACTED>", "-----BEGIN CERTIFICATE-----MIIBfake", "Bearer upstream-token-123", "tenant-key-777",
           "env.LEGACY_PROXY_URL"]


def secret_record() -> dict[str, Any]:
    return {
        "name": "acme__vllm__llama",
        "network_config": {
            "base_url": "https://gpu.example.com/v1",
            "extra_headers": {"Authorization": "Bearer upstream-token-123", "X-Tenant-Key": "tenant-key-777"},
            "ca_cert_pem": "-----BEGIN CERTIFICATE-----MIIBfake",
            "default_request_timeout_in_seconds": 300,
        },
        "concurrency_and_buffer_size": {"concurrency": 1000, "buffer_size": 5000},
        "proxy_config": {
            "type": "http",
            "url": {"value": "http************************:3128", "type": "plain_text"},  # newest SecretVar
            "username": "prox************************user",  # bare string
            "password": {"value": "<REDACTED>", "env_var": "env.LEGACY_PROXY_URL", "from_env": True},  # legacy
            "ca_cert_pem": {"value": "<REDACTED>", "type": "plain_text"},
        },
        "send_back_raw_request": False,
        "send_back_raw_response": False,
        "store_raw_request_response": False,
        "custom_provider_config": {"is_key_less": False, "base_provider_type": "openai"},
        "provider_status": "active",
        # pre-1.5 builds embedded (redacted) keys
        "keys": [{"id": "k1", "name": "main", "models": ["*"], "weight": 1.0,
                  "value": {"value": "sk-l************************9xyz", "type": "plain_text"}}],
    }


# -- reads and auth ---------------------------------------------------------------------------------

def test_list_providers_without_auth_sends_no_authorization_header() -> None:
    rec = Recorder(ok({"providers": [{"name": "openai"}], "total": 1}))
    with rec.client() as client:
        assert client.list_providers() == [{"name": "openai"}]
    assert "authorization" not in rec.requests[0].headers
    assert rec.requests[0].url.path == "/api/providers"


def test_every_call_carries_basic_auth_when_configured() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/api/providers":
            return httpx.Response(200, json={"providers": [], "total": 0})
        if path == "/api/config":
            return httpx.Response(200, json={"client_config": {}})
        if path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        if path == "/api/version":
            return httpx.Response(200, json="v2.2.4")
        if request.method == "DELETE":
            return httpx.Response(200, json={"name": "x"})
        return httpx.Response(200, json={"name": "x"})

    rec = Recorder(answer)
    with rec.client(auth=("admin", PASSWORD)) as client:
        assert client.list_providers() == []
        client.get_provider("x")
        client.get_config()
        assert client.health() == "ok"
        assert client.version() == "v2.2.4"
        client.put_provider("x", {"concurrency_and_buffer_size": {"concurrency": 64, "buffer_size": 1024}})
        client.delete_provider("x")
        client.put_config({"client_config": {}})
    expected = "Basic " + base64.b64encode(f"admin:{PASSWORD}".encode()).decode()
    assert len(rec.requests) == 8
    assert all(r.headers.get("authorization") == expected for r in rec.requests)


def test_provider_names_are_escaped_whole() -> None:
    rec = Recorder(ok({"name": "acme/llama 3"}))
    with rec.client() as client:
        client.get_provider("acme/llama 3")
        client.put_provider("a b/c%d", {"concurrency_and_buffer_size": {"concurrency": 1, "buffer_size": 1}})
        client.delete_provider("org/x?y#z")
    assert [r.url.raw_path for r in rec.requests] == [
        b"/api/providers/acme%2Fllama%203",
        b"/api/providers/a%20b%2Fc%25d",
        b"/api/providers/org%2Fx%3Fy%23z",
    ]


def test_get_provider_404_is_not_found_with_status_and_message() -> None:
    rec = Recorder(lambda r: envelope(404, "Provider not found: not found"))
    with rec.client() as client, pytest.raises(NotFoundError) as info:
        client.get_provider("ghost")
    assert info.value.status == 404
    assert info.value.message == "Provider not found: not found"
    assert "/api/providers/ghost" in str(info.value)


@pytest.mark.parametrize("status", [401, 403])
def test_auth_error_without_credentials_says_none_are_configured(status: int) -> None:
    rec = Recorder(lambda r: envelope(status, "Unauthorized"))
    with rec.client() as client, pytest.raises(AuthError) as info:
        client.list_providers()
    err = info.value
    assert err.status == status and err.message == "Unauthorized"
    text = str(err)
    assert "none are configured" in text and "[targets.auth]" in text
    assert text.endswith(".")


def test_auth_error_with_wrong_credentials_names_where_they_come_from_not_the_value() -> None:
    rec = Recorder(lambda r: envelope(401, "Unauthorized"))
    source = "the username from the environment variable BF_USER and the password from the environment variable BF_PW"
    with rec.client(auth=("admin", PASSWORD), auth_source=source) as client, pytest.raises(AuthError) as info:
        client.get_config()
    text = str(info.value)
    assert "username or password is wrong" in text
    assert "BF_USER" in text and "BF_PW" in text
    assert PASSWORD not in text and PASSWORD not in repr(info.value)
    assert base64.b64encode(f"admin:{PASSWORD}".encode()).decode() not in text


@pytest.mark.parametrize("status", [400, 409, 500, 502])
def test_other_statuses_are_http_status_errors(status: int) -> None:
    rec = Recorder(lambda r: envelope(status, f"Failed to get providers: boom {status}"))
    with rec.client() as client, pytest.raises(HTTPStatusError) as info:
        client.list_providers()
    err = info.value
    assert type(err) is HTTPStatusError
    assert err.status == status and err.message == f"Failed to get providers: boom {status}"
    assert getattr(err, "dropped", False) is False


def test_error_status_with_non_json_body_keeps_status_without_echoing_the_body() -> None:
    html = "<html><body>Bad Gateway from nginx with internal-detail-xyz</body></html>"
    rec = Recorder(lambda r: httpx.Response(502, text=html, headers={"content-type": "text/html"}))
    with rec.client() as client, pytest.raises(HTTPStatusError) as info:
        client.list_providers()
    assert info.value.status == 502
    assert "internal-detail-xyz" not in str(info.value)
    assert "Bad Gateway" in info.value.message


def test_dropped_request_newest_shape_503() -> None:
    rec = Recorder(lambda r: envelope(503, "request dropped: queue is full", is_bifrost_error=True,
                                      error_type="request_dropped"))
    with rec.client() as client, pytest.raises(RequestDroppedError) as info:
        client.list_providers()
    assert info.value.status == 503 and info.value.dropped is True
    assert isinstance(info.value, HTTPStatusError)


def test_dropped_request_older_shape_400() -> None:
    # older core: the error has no status, so the envelope rule gives 400 (is_bifrost_error true, no type)
    def answer(request: httpx.Request) -> httpx.Response:
        body = {"is_bifrost_error": True, "error": {"message": "request dropped: queue is full"}, "extra_fields": {}}
        return httpx.Response(400, json=body)

    rec = Recorder(answer)
    with rec.client() as client, pytest.raises(RequestDroppedError) as info:
        client.get_provider("openai")
    assert info.value.status == 400 and getattr(info.value, "dropped", False) is True


def test_plain_400_is_not_a_dropped_request() -> None:
    rec = Recorder(lambda r: envelope(400, "Invalid base URL: failed to resolve hostname: lookup x: no such host"))
    with rec.client() as client, pytest.raises(HTTPStatusError) as info:
        client.put_provider("x", {"concurrency_and_buffer_size": {"concurrency": 1, "buffer_size": 1}})
    assert not isinstance(info.value, RequestDroppedError)
    assert info.value.status == 400 and info.value.message.startswith("Invalid base URL")


# -- bad answers ------------------------------------------------------------------------------------

@pytest.mark.parametrize("body", [b"not json at all", b"{\"providers\": [", b"\xff\xfe\x00garbage"])
def test_garbage_json_is_bad_response(body: bytes) -> None:
    rec = Recorder(lambda r: httpx.Response(200, content=body, headers={"content-type": "application/json"}))
    with rec.client() as client, pytest.raises(BadResponseError) as info:
        client.list_providers()
    assert "not JSON" in str(info.value)
    assert "garbage" not in str(info.value)


@pytest.mark.parametrize("body", [
    [],
    {"total": 1},
    {"providers": {"openai": {}}},
    {"providers": [{"no_name": True}]},
    {"providers": ["openai"]},
])
def test_wrong_shape_listing_is_bad_response(body: Any) -> None:
    rec = Recorder(ok(body))
    with rec.client() as client, pytest.raises(BadResponseError):
        client.list_providers()


def test_null_provider_list_means_empty() -> None:
    rec = Recorder(ok({"providers": None, "total": 0}))
    with rec.client() as client:
        assert client.list_providers() == []


@pytest.mark.parametrize(("method", "body"), [
    ("get_config", {"framework_config": {}}),
    ("get_config", ["client_config"]),
    ("health", {"ok": True}),
    ("version", {"v": 1}),
    ("version", 224),
])
def test_wrong_shapes_of_other_reads_are_bad_responses(method: str, body: Any) -> None:
    rec = Recorder(ok(body))
    with rec.client() as client, pytest.raises(BadResponseError):
        getattr(client, method)()


def test_version_accepts_a_json_string_or_an_object() -> None:
    with Recorder(ok("2.2.4")).client() as client:
        assert client.version() == "2.2.4"
    with Recorder(ok({"version": "v2.2.4"})).client() as client:
        assert client.version() == "v2.2.4"


# -- transport failures -----------------------------------------------------------------------------

def raising(exc_type: type[httpx.TransportError]) -> Handler:
    def answer(request: httpx.Request) -> httpx.Response:
        raise exc_type(f"simulated {exc_type.__name__}", request=request)

    return answer


@pytest.mark.parametrize("exc_type", [httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError])
def test_no_connection_is_unreachable(exc_type: type[httpx.TransportError]) -> None:
    rec = Recorder(raising(exc_type))
    with rec.client(auth=("admin", PASSWORD)) as client, pytest.raises(UnreachableError) as info:
        client.list_providers()
    assert BASE in str(info.value)
    assert info.value.__context__ is None and info.value.__cause__ is None


@pytest.mark.parametrize("exc_type", [httpx.ConnectTimeout, httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout])
def test_no_answer_in_time_is_gateway_timeout(exc_type: type[httpx.TransportError]) -> None:
    rec = Recorder(raising(exc_type))
    with rec.client(timeout=2.5) as client, pytest.raises(GatewayTimeoutError) as info:
        client.get_provider("openai")
    assert "2.5 s" in str(info.value)


def test_put_provider_timeout_in_the_error_is_the_write_budget() -> None:
    rec = Recorder(raising(httpx.ReadTimeout))
    with rec.client() as client, pytest.raises(GatewayTimeoutError) as info:
        client.put_provider("x", {"concurrency_and_buffer_size": {"concurrency": 1, "buffer_size": 1}})
    assert "30 s" in str(info.value)
    assert len(rec.requests) == 1  # no retry


# -- writes -----------------------------------------------------------------------------------------

def test_put_provider_sends_the_body_with_a_30_second_timeout() -> None:
    rec = Recorder(lambda r: httpx.Response(200, json={**json.loads(r.content or b"{}"), "name": "acme__m"}))
    body = {"network_config": {"base_url": "http://h.example/v1"},
            "concurrency_and_buffer_size": {"concurrency": 64, "buffer_size": 1024},
            "custom_provider_config": {"base_provider_type": "openai"}}
    with rec.client(timeout=10.0) as client:
        client.get_provider("acme__m")
        answer = client.put_provider("acme__m", body)
    get, put = rec.requests
    assert get.extensions["timeout"]["read"] == 10.0
    assert put.method == "PUT"
    assert put.extensions["timeout"] == {"connect": 30.0, "read": 30.0, "write": 30.0, "pool": 30.0}
    assert json.loads(put.content) == body
    assert answer["concurrency_and_buffer_size"] == {"concurrency": 64, "buffer_size": 1024}


def test_put_provider_refuses_to_send_keys() -> None:
    rec = Recorder(ok({"name": "x"}))
    with rec.client() as client, pytest.raises(ValueError):
        client.put_provider("x", {"keys": [], "concurrency_and_buffer_size": {"concurrency": 1, "buffer_size": 1}})
    assert rec.requests == []


def test_put_provider_500_is_one_attempt() -> None:
    rec = Recorder(lambda r: envelope(500, "Failed to update provider: store busy"))
    with rec.client() as client, pytest.raises(HTTPStatusError) as info:
        client.put_provider("x", {"concurrency_and_buffer_size": {"concurrency": 1, "buffer_size": 1}})
    assert info.value.status == 500
    assert len(rec.requests) == 1


def test_delete_newest_200_name_only_answer() -> None:
    zero = {"name": "ghost", "network_config": {"default_request_timeout_in_seconds": 0},
            "concurrency_and_buffer_size": {"concurrency": 0, "buffer_size": 0}, "proxy_config": None,
            "provider_status": ""}
    rec = Recorder(ok(zero))
    with rec.client() as client:
        assert client.delete_provider("ghost") == "removed"
    assert rec.requests[0].method == "DELETE"


def test_delete_legacy_404() -> None:
    rec = Recorder(lambda r: envelope(404, "Provider not found: not found"))
    with rec.client() as client:
        assert client.delete_provider("ghost") == "not-found"
    assert len(rec.requests) == 1


def test_delete_lookup_failure_is_an_error() -> None:
    rec = Recorder(lambda r: envelope(400, "Failed to get provider: db locked"))
    with rec.client() as client, pytest.raises(HTTPStatusError) as info:
        client.delete_provider("x")
    assert info.value.status == 400


def test_put_config_sends_the_body_and_returns_the_answer() -> None:
    rec = Recorder(ok({"status": "success", "message": "Configuration updated successfully"}))
    body = {"client_config": {"drop_excess_requests": False, "log_retention_days": 365}}
    with rec.client() as client:
        assert client.put_config(body)["status"] == "success"
    assert rec.requests[0].method == "PUT" and rec.requests[0].url.path == "/api/config"
    assert json.loads(rec.requests[0].content) == body


def test_put_config_accepts_an_empty_answer() -> None:
    rec = Recorder(lambda r: httpx.Response(200))
    with rec.client() as client:
        assert client.put_config({"client_config": {"log_retention_days": 365}}) == {}


# -- secrets ----------------------------------------------------------------------------------------

def test_no_secret_in_any_exception_text() -> None:
    secret_body = {"network_config": {"extra_headers": {"Authorization": "Bearer upstream-token-123"}},
                   "concurrency_and_buffer_size": {"concurrency": 1, "buffer_size": 1}}
    answers: list[Handler] = [
        lambda r: envelope(500, "Failed to update provider: boom"),
        lambda r: envelope(401, "Unauthorized"),
        lambda r: httpx.Response(200, text="garbage"),
        lambda r: httpx.Response(200, json=["wrong shape"]),
        raising(httpx.ConnectError),
        raising(httpx.ReadTimeout),
    ]
    token = base64.b64encode(f"admin:{PASSWORD}".encode()).decode()
    for answer in answers:
        rec = Recorder(answer)
        with rec.client(auth=("admin", PASSWORD)) as client, pytest.raises(Exception) as info:
            client.put_provider("acme__m", secret_body)
        text = str(info.value) + repr(info.value) + repr(info.value.args)
        for secret in (PASSWORD, token, "upstream-token-123"):
            assert secret not in text
        assert info.value.__context__ is None


def test_listing_drops_pre_15_embedded_keys() -> None:
    rec = Recorder(ok({"providers": [secret_record()], "total": 1}))
    with rec.client() as client:
        (record,) = client.list_providers()
    assert "keys" not in record
    assert record["proxy_config"]["type"] == "http"


def test_sanitized_record_holds_no_secret_in_any_secretvar_shape() -> None:
    record = secret_record()
    clean = sanitize_record(record)
    dumped = json.dumps(clean)
    for secret in SECRETS:
        assert secret not in dumped, secret
    assert "keys" not in clean
    assert set(clean["network_config"]["extra_headers"]) == {"Authorization", "X-Tenant-Key"}
    assert clean["proxy_config"]["type"] == "http"
    assert clean["network_config"]["base_url"] == "https://gpu.example.com/v1"
    assert clean["custom_provider_config"] == {"is_key_less": False, "base_provider_type": "openai"}
    assert record["keys"], "the input is not changed"


def test_fingerprint_notices_a_changed_secret_but_not_a_secretvar_shape() -> None:
    a = secret_record()
    b = secret_record()
    b["proxy_config"]["url"] = "http************************:3128"  # same masked value, bare string shape
    assert record_fingerprint(a) == record_fingerprint(b)
    c = secret_record()
    c["network_config"]["extra_headers"]["Authorization"] = "Bearer other-token"
    assert record_fingerprint(a) != record_fingerprint(c)
    d = secret_record()
    d["keys"] = []  # keys never count
    assert record_fingerprint(a) == record_fingerprint(d)
    assert secret_hash({"value": "x", "env_var": "env.A", "from_env": True}) == secret_hash(
        {"value": "x", "ref": "env.A", "type": "env"})


def test_record_row_strips_credentials_from_the_base_url() -> None:
    record = {"name": "r", "network_config": {"base_url": "https://user:pw-secret@h.example/v1?key=qs-secret"}}
    row = record_row(record)
    assert row["base_url"] == "https://<redacted>@h.example/v1?<redacted>"
    assert (row["concurrency"], row["buffer_size"]) == (1000, 5000)  # the gateway's defaults when unset
    assert row["is_custom"] is False and row["base_provider_type"] is None


def test_record_row_refuses_a_non_numeric_pool() -> None:
    with pytest.raises(BadResponseError):
        record_row({"name": "r", "concurrency_and_buffer_size": {"concurrency": "lots", "buffer_size": 5}})


# -- DNS checks -------------------------------------------------------------------------------------

def test_lookups_run_concurrently() -> None:
    barrier = threading.Barrier(3, timeout=10)

    def lookup(host: str) -> None:
        barrier.wait()  # breaks (and the host fails) unless all three lookups are in flight at once

    frame = HostResolver(lookup, timeout=15).check(["a.test", "b.test", "c.test"], concurrency=3)
    assert frame["resolves"].to_list() == [True, True, True]


def test_lookups_are_bounded_by_concurrency() -> None:
    lock = threading.Lock()
    running = 0
    peak = 0
    release = threading.Event()

    def lookup(host: str) -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
            if running == 2:
                release.set()
        release.wait(5)
        with lock:
            running -= 1

    hosts = [f"h{i}.test" for i in range(6)]
    frame = HostResolver(lookup, timeout=15).check(hosts, concurrency=2)
    assert frame.height == 6 and all(frame["resolves"])
    assert peak == 2


def test_a_lookup_that_hangs_is_abandoned_at_the_timeout() -> None:
    gate = threading.Event()

    def lookup(host: str) -> None:
        if host == "slow.test":
            gate.wait(30)

    try:
        frame = HostResolver(lookup, timeout=0.05).check(["slow.test", "fast.test"])
    finally:
        gate.set()
    rows = {r["host"]: r for r in frame.iter_rows(named=True)}
    assert rows["fast.test"]["resolves"] is True
    assert rows["slow.test"]["resolves"] is False
    assert "timed out" in rows["slow.test"]["error"]


def test_answers_are_cached_for_the_ttl() -> None:
    calls: list[str] = []

    def lookup(host: str) -> None:
        calls.append(host)
        raise OSError("no such host")

    resolver = HostResolver(lookup, ttl=60)
    first = resolver.check(["gone.invalid"], now=1000.0)
    resolver.check(["gone.invalid"], now=1059.0)
    assert calls == ["gone.invalid"]
    resolver.check(["gone.invalid"], now=1061.0)
    assert calls == ["gone.invalid", "gone.invalid"]
    assert first.row(0) == ("gone.invalid", False, "no such host")


# -- read_bifrost -----------------------------------------------------------------------------------

def gateway(records: list[dict[str, Any]], *, client_config: dict[str, Any] | None = None,
            health: httpx.Response | None = None, version: httpx.Response | None = None) -> Handler:
    def answer(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/api/providers":
            return httpx.Response(200, json={"providers": records, "total": len(records)})
        if path == "/api/config":
            return httpx.Response(200, json={
                "client_config": client_config or {},
                "auth_config": {"admin_username": "admin", "admin_password": "<redacted>", "is_enabled": True},
                "proxy_config": {"password": "<redacted>"},
            })
        if path == "/health":
            return health or httpx.Response(200, json={"status": "ok"})
        if path == "/api/version":
            return version or httpx.Response(200, json="v2.2.4")
        return envelope(404, "not found")

    return answer


def test_read_bifrost_builds_sanitized_records_and_safe_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BF_USER", "admin")
    monkeypatch.setenv("BF_PW", PASSWORD)
    records = [
        {"name": "openai", "concurrency_and_buffer_size": {"concurrency": 512, "buffer_size": 8192},
         "network_config": {}, "provider_status": "active"},
        secret_record(),
        {"name": "acme__openrouter__claude__anthropic",
         "custom_provider_config": {"base_provider_type": "anthropic"},
         "network_config": {"base_url": "https://GONE.invalid/api"},
         "concurrency_and_buffer_size": {"concurrency": 64, "buffer_size": 1024}, "provider_status": "error"},
    ]
    client_config = {"drop_excess_requests": True, "enforce_auth_on_inference": True,
                     "webhook_config": {"url": "https://hooks.example/x?token=webhook-secret"},
                     "oauth2_server_config": {"client_secret": "oauth-secret"}}
    rec = Recorder(gateway(records, client_config=client_config))
    looked_up: list[str] = []

    def lookup(host: str) -> None:
        looked_up.append(host)
        if host.endswith(".invalid"):
            raise OSError("no such host")

    target = Target(name="bf", kind="bifrost", url=BASE, concurrency=4,
                    auth=AuthConfig(username_env="BF_USER", password_env="BF_PW"))
    data = read_bifrost(target, Policy(), transport=httpx.MockTransport(rec), resolver=lookup)

    assert all(r.headers.get("authorization", "").startswith("Basic ") for r in rec.requests)
    assert data.records["name"].to_list() == [r["name"] for r in records]
    assert data.records["is_custom"].to_list() == [False, True, True]
    assert data.records["concurrency"].to_list() == [512, 1000, 64]
    assert data.records["buffer_size"].to_list() == [8192, 5000, 1024]
    assert data.records["base_url"].to_list() == [None, "https://gpu.example.com/v1", "https://GONE.invalid/api"]
    assert data.records["base_provider_type"].to_list() == [None, "openai", "anthropic"]
    assert data.records["provider_status"].to_list() == ["active", "active", "error"]
    assert data.records["fingerprint"].to_list() == [record_fingerprint(r, exclude=POOL_FIELDS) for r in records]
    assert sorted(looked_up) == ["gone.invalid", "gpu.example.com"]
    assert data.reachability.rows() == [("gone.invalid", False, "no such host"), ("gpu.example.com", True, None)]
    assert data.client_config == {"drop_excess_requests": True, "enforce_auth_on_inference": True}
    assert (data.health, data.version, data.auth_enabled) == ("ok", "v2.2.4", True)
    stored = data.records.write_json() + json.dumps(data.client_config)
    for secret in [*SECRETS, "webhook-secret", "oauth-secret", PASSWORD]:
        assert secret not in stored


def test_a_report_only_read_skips_the_plan_fingerprints_and_nothing_else() -> None:
    records = [secret_record(),
               {"name": "openai", "concurrency_and_buffer_size": {"concurrency": 512, "buffer_size": 8192}}]
    target = Target(name="bf", kind="bifrost", url=BASE)

    def read(fingerprints: bool) -> Any:
        rec = Recorder(gateway(records))
        return read_bifrost(target, Policy(), transport=httpx.MockTransport(rec), resolver=lambda h: None,
                            fingerprints=fingerprints)

    full, report_only = read(True), read(False)
    assert report_only.records["fingerprint"].to_list() == [None, None]
    assert full.records["fingerprint"].null_count() == 0
    assert report_only.records.drop("fingerprint").equals(full.records.drop("fingerprint"))
    assert report_only.reachability.equals(full.reachability)


def test_read_bifrost_auth_error_names_the_env_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BF_USER", "admin")
    monkeypatch.setenv("BF_PW", "wrong-" + PASSWORD)
    rec = Recorder(lambda r: envelope(401, "Unauthorized"))
    target = Target(name="bf", kind="bifrost", url=BASE,
                    auth=AuthConfig(username_env="BF_USER", password_env="BF_PW"))
    with pytest.raises(AuthError) as info:
        read_bifrost(target, Policy(), transport=httpx.MockTransport(rec), resolver=lambda h: None)
    assert "environment variable BF_USER" in str(info.value)
    assert "environment variable BF_PW" in str(info.value)
    assert PASSWORD not in str(info.value)


def test_read_bifrost_records_a_failing_health_and_a_missing_version() -> None:
    rec = Recorder(gateway([], health=envelope(503, "config store: ping failed"),
                           version=envelope(404, "Not Found")))
    target = Target(name="bf", kind="bifrost", url=BASE)
    data = read_bifrost(target, Policy(), transport=httpx.MockTransport(rec), resolver=lambda h: None)
    assert data.records.height == 0 and data.reachability.height == 0
    assert data.health is not None and data.health.startswith("unhealthy:")
    assert "ping failed" in data.health
    assert data.version is None
