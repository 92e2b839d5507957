"""Conformance tests of the Bifrost management-API emulator against docs/sandbox.md, "The emulated management API".

Every test talks HTTP (httpx) to a real emulator on a free loopback port and asserts what that section
describes: status codes, exact messages, shapes, bytes on the wire. Section numbers (§) refer to its
subsections.
"""

from __future__ import annotations

import base64
import copy
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from gatewayscope.sandbox.bifrost_emulator import (
    LIST,
    BifrostEmulator,
    Concurrency,
    CustomProviderConfig,
    EmulatorOptions,
    NetworkConfig,
    ProviderRecord,
    ProxyConfig,
    Secret,
    apply_seed,
    realistic_records,
    redact,
    seed_realistic,
    seed_small,
)
from gatewayscope.sandbox.bifrost_emulator.model import looks_masked
from gatewayscope.sandbox.processes import free_port

LIVE = "http://localhost:9/v1"
DEAD_HOST = "gone.orgx.invalid"
UNAUTHORIZED_BYTES = (b'{"is_bifrost_error":false,"status_code":401,'
                      b'"error":{"message":"Unauthorized"},"extra_fields":{}}')
ADMIN = ("admin", "Adm1n-Passw0rd!")
PEM = "-----BEGIN CERTIFICATE-----\nMIIBfakefakefake\n-----END CERTIFICATE-----\n"


# --------------------------------------------------------------------------------------------------
# fixtures and helpers

@contextmanager
def running(*, auth: tuple[str, str] | None = None, **options: Any) -> Iterator[BifrostEmulator]:
    emulator = BifrostEmulator(auth=auth, options=EmulatorOptions(**options))
    emulator.start()
    try:
        yield emulator
    finally:
        emulator.stop()


@pytest.fixture
def emu() -> Iterator[BifrostEmulator]:
    with running() as emulator:
        yield emulator


@pytest.fixture
def client(emu: BifrostEmulator) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=emu.url, timeout=10.0) as http:
        yield http


@pytest.fixture
def small(emu: BifrostEmulator) -> BifrostEmulator:
    seed_small(emu)
    return emu


def message(response: httpx.Response) -> str:
    body = response.json()
    assert set(body) == {"is_bifrost_error", "status_code", "error", "extra_fields"}
    assert body["is_bifrost_error"] is False
    assert body["status_code"] == response.status_code
    assert body["extra_fields"] == {}
    return str(body["error"]["message"])


def custom_body(*, base_url: str = LIVE, conc: tuple[int, int] | None = (1000, 5000), base: str = "openai",
                **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"network_config": {"base_url": base_url},
                            "custom_provider_config": {"base_provider_type": base}}
    if conc is not None:
        body["concurrency_and_buffer_size"] = {"concurrency": conc[0], "buffer_size": conc[1]}
    body.update(extra)
    return body


def full_custom_record(name: str = "orgx__conn__model") -> ProviderRecord:
    """A custom record with every block set, for the §2.5 table tests."""
    return ProviderRecord(
        name,
        network_config=NetworkConfig(base_url="http://127.0.0.1:7/v1", extra_headers={"X-Org": "orgx"},
                                     default_request_timeout_in_seconds=600, max_retries=2,
                                     retry_backoff_initial_ns=500_000_000, retry_backoff_max_ns=5_000_000_000,
                                     ca_cert_pem=PEM),
        concurrency_and_buffer_size=Concurrency(1000, 5000),
        proxy_config=ProxyConfig(type="http", url=Secret("http://127.0.0.1:3128/orgx"),
                                 username=Secret("proxy-user-orgx"), password=Secret("hunter2-hunter2"),
                                 ca_cert_pem=Secret(PEM)),
        send_back_raw_request=True,
        send_back_raw_response=True,
        store_raw_request_response=True,
        custom_provider_config=CustomProviderConfig(base_provider_type="openai"),
        openai_config={"disable_store": True},
        prompt_cache={"enabled": True},
    )


def minimal_put(conc: tuple[int, int] = (64, 1024), base: str = "openai") -> dict[str, Any]:
    return {"concurrency_and_buffer_size": {"concurrency": conc[0], "buffer_size": conc[1]},
            "custom_provider_config": {"base_provider_type": base}}


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


# --------------------------------------------------------------------------------------------------
# §2.2 / §2.3 listing and single record

def test_listing_of_empty_store(client: httpx.Client) -> None:
    response = client.get("/api/providers")
    assert response.status_code == 200
    assert response.json() == {"providers": [], "total": 0}


def test_listing_shape_sort_and_total(small: BifrostEmulator, client: httpx.Client) -> None:
    body = client.get("/api/providers").json()
    names = [p["name"] for p in body["providers"]]
    assert body["total"] == len(names) == 12
    assert names == sorted(names)
    for provider in body["providers"]:
        assert "keys" not in provider  # no keys array since v1.5
        for field in ("network_config", "concurrency_and_buffer_size", "proxy_config", "send_back_raw_request",
                      "send_back_raw_response", "store_raw_request_response", "provider_status"):
            assert field in provider
    statuses = {p["name"]: p["provider_status"] for p in body["providers"]}
    assert statuses["legacy-lan-gateway"] == "error"
    assert {s for n, s in statuses.items() if n != "legacy-lan-gateway"} == {"active"}


def test_single_record_matches_listing(small: BifrostEmulator, client: httpx.Client) -> None:
    listing = {p["name"]: p for p in client.get("/api/providers").json()["providers"]}
    one = client.get("/api/providers/orgalpha__openrouter__gpt-4.1-mini")
    assert one.status_code == 200
    assert one.json() == listing["orgalpha__openrouter__gpt-4.1-mini"]


def test_unknown_record_is_404_with_exact_message(client: httpx.Client) -> None:
    response = client.get("/api/providers/nope")
    assert response.status_code == 404
    assert message(response) == "Provider not found: not found"


def test_defaults_rendered_when_unset(client: httpx.Client, emu: BifrostEmulator) -> None:
    created = client.post("/api/providers", json={"provider": "openai"})
    assert created.status_code == 200
    for body in (created.json(), client.get("/api/providers/openai").json()):
        assert body["concurrency_and_buffer_size"] == {"concurrency": 1000, "buffer_size": 5000}
        assert body["network_config"] == {
            "default_request_timeout_in_seconds": 300, "max_retries": 0, "retry_backoff_initial": 500,
            "retry_backoff_max": 5000, "stream_idle_timeout_in_seconds": 120, "keep_alive_timeout_in_seconds": 30,
            "max_conns_per_host": 5000,
        }
        assert body["proxy_config"] is None
        assert "custom_provider_config" not in body and "openai_config" not in body
    record = emu.get_record("openai")
    assert record is not None
    assert record.network_config is None and record.concurrency_and_buffer_size is None  # stored as null


def test_path_name_is_unescaped(client: httpx.Client) -> None:
    response = client.put("/api/providers/orgz__ollama-box__llama3.1%3A8b", json=minimal_put())
    assert response.status_code == 200
    assert response.json()["name"] == "orgz__ollama-box__llama3.1:8b"
    assert client.put("/api/providers/a%2Fb", json=minimal_put()).json()["name"] == "a/b"
    assert client.get("/api/providers/a%2Fb").json()["name"] == "a/b"


def test_bad_path_encoding_is_400(emu: BifrostEmulator) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", emu.port, timeout=10)
    try:
        conn.request("GET", "/api/providers/bad%zzname")
        response = conn.getresponse()
        body = json.loads(response.read())
    finally:
        conn.close()
    assert response.status == 400
    assert body["error"]["message"] == 'Invalid provider: invalid provider parameter encoding: invalid URL escape "%zz"'


# --------------------------------------------------------------------------------------------------
# §1 masking and SecretVar shapes

@pytest.mark.parametrize(("value", "masked"), [
    ("", ""),
    ("a", "*"),
    ("12345678", "********"),
    ("123456789", "1234" + "*" * 24 + "6789"),
    ("sk-proj-" + "x" * 40 + "TAIL", "sk-p" + "*" * 24 + "TAIL"),
])
def test_redacted_rule(value: str, masked: str) -> None:
    assert redact(value) == masked
    if value:
        assert looks_masked(masked)


def test_masking_on_the_wire(client: httpx.Client) -> None:
    body = custom_body(proxy_config={"type": "http", "url": "abc", "username": "user1234",
                                     "password": "p", "ca_cert_pem": PEM})
    body["network_config"]["ca_cert_pem"] = PEM
    assert client.post("/api/providers", json={"provider": "orgx__c__m", **body}).status_code == 200
    shown = client.get("/api/providers/orgx__c__m").json()
    proxy = shown["proxy_config"]
    assert proxy["url"] == {"value": "***", "type": "plain_text"}
    assert proxy["username"] == {"value": "********", "type": "plain_text"}
    assert proxy["password"] == {"value": "<REDACTED>", "type": "plain_text"}
    assert proxy["ca_cert_pem"] == {"value": "<REDACTED>", "type": "plain_text"}
    assert shown["network_config"]["ca_cert_pem"] == "<REDACTED>"
    long_url = "http://127.0.0.1:3128/a-long-proxy-path"
    body["proxy_config"]["url"] = long_url
    client.put("/api/providers/orgx__c__m", json=body)
    assert client.get("/api/providers/orgx__c__m").json()["proxy_config"]["url"]["value"] == (
        long_url[:4] + "*" * 24 + long_url[-4:])


@pytest.mark.parametrize("mask_style", ["listing", "lowercase", "brackets"])
def test_masked_values_sent_back_keep_stored_secrets(emu: BifrostEmulator, client: httpx.Client,
                                                     mask_style: str) -> None:
    emu.put_record(full_custom_record())
    listed = client.get("/api/providers/orgx__conn__model").json()
    proxy = copy.deepcopy(listed["proxy_config"])
    network = copy.deepcopy(listed["network_config"])
    if mask_style == "lowercase":
        proxy["password"]["value"] = "<redacted>"
        network["ca_cert_pem"] = "<redacted>"
    elif mask_style == "brackets":
        proxy["password"]["value"] = "[REDACTED]"
    body = {"network_config": network, "proxy_config": proxy,
            "concurrency_and_buffer_size": {"concurrency": 64, "buffer_size": 1024},
            "custom_provider_config": listed["custom_provider_config"]}
    assert client.put("/api/providers/orgx__conn__model", json=body).status_code == 200
    stored = emu.get_record("orgx__conn__model")
    assert stored is not None and stored.proxy_config is not None and stored.network_config is not None
    assert stored.proxy_config.url == Secret("http://127.0.0.1:3128/orgx")
    assert stored.proxy_config.username == Secret("proxy-user-orgx")
    assert stored.proxy_config.password == Secret("hunter2-hunter2")
    assert stored.proxy_config.ca_cert_pem == Secret(PEM)
    assert stored.network_config.ca_cert_pem == PEM


def test_unmasked_value_replaces_stored_secret(emu: BifrostEmulator, client: httpx.Client) -> None:
    emu.put_record(full_custom_record())
    body = minimal_put()
    body["proxy_config"] = {"type": "http", "url": "http://127.0.0.1:3129/new", "password": "new-password-123"}
    assert client.put("/api/providers/orgx__conn__model", json=body).status_code == 200
    stored = emu.get_record("orgx__conn__model")
    assert stored is not None and stored.proxy_config is not None
    assert stored.proxy_config.url == Secret("http://127.0.0.1:3129/new")
    assert stored.proxy_config.password == Secret("new-password-123")
    assert stored.proxy_config.username is None  # replaced wholesale


def test_secretvar_input_shapes(emu: BifrostEmulator, client: httpx.Client) -> None:
    proxy = {
        "type": "http",
        "url": "http://127.0.0.1:3128/bare-string",                                   # bare string
        "username": {"value": "newest-shape-user", "type": "plain_text"},              # newest object
        "password": {"value": "legacy-password", "env_var": "", "from_env": False},    # legacy object
        "ca_cert_pem": "env.PROXY_CA_PEM",                                              # env reference
    }
    response = client.post("/api/providers", json={"provider": "orgx__c__m", **custom_body(proxy_config=proxy)})
    assert response.status_code == 200
    shown = response.json()["proxy_config"]
    assert shown["username"] == {"value": "newe" + "*" * 24 + "user", "type": "plain_text"}
    assert shown["ca_cert_pem"] == {"value": "", "ref": "env.PROXY_CA_PEM", "type": "env"}
    stored = emu.get_record("orgx__c__m")
    assert stored is not None and stored.proxy_config is not None
    assert stored.proxy_config.url == Secret("http://127.0.0.1:3128/bare-string")
    assert stored.proxy_config.password == Secret("legacy-password")
    legacy_env = {"value": "", "env_var": "env.PROXY_USER", "from_env": True}
    client.put("/api/providers/orgx__c__m", json={**custom_body(), "proxy_config": {"type": "http",
                                                                                      "url": "x",
                                                                                      "username": legacy_env}})
    stored = emu.get_record("orgx__c__m")
    assert stored is not None and stored.proxy_config is not None
    assert stored.proxy_config.username == Secret("", "env.PROXY_USER", "env")


def test_legacy_secret_shape_option() -> None:
    with running(legacy_secret_shape=True) as emulator, httpx.Client(base_url=emulator.url) as http:
        proxy = {"type": "http", "url": "http://127.0.0.1:3128/x", "username": "env.PROXY_USER"}
        http.post("/api/providers", json={"provider": "orgx__c__m", **custom_body(proxy_config=proxy)})
        shown = http.get("/api/providers/orgx__c__m").json()["proxy_config"]
    assert shown["url"] == {"value": "http" + "*" * 24 + "28/x", "env_var": "", "from_env": False}
    assert shown["username"] == {"value": "", "env_var": "env.PROXY_USER", "from_env": True}


# --------------------------------------------------------------------------------------------------
# §2.4 POST

def test_post_check_order_and_messages(small: BifrostEmulator, client: httpx.Client) -> None:
    def post(body: Any) -> str:
        response = client.post("/api/providers", content=body if isinstance(body, bytes) else json.dumps(body))
        assert response.status_code in (400, 409), response.text
        return message(response)

    assert post(b"{not json") == "Invalid request payload"
    assert post({"provider": 7}) == "Invalid request payload"
    assert post({"provider": "", "concurrency_and_buffer_size": {"concurrency": 0, "buffer_size": 0}}) == \
        "Missing provider"
    assert post({"provider": "openai", **custom_body(conc=(0, 0))}) == \
        "Custom provider cannot be same as a standard provider"
    assert post({"provider": "orgx__c__m", **custom_body(base="")}) == \
        "BaseProviderType is required when CustomProviderConfig is provided"
    assert post({"provider": "orgx__c__m", **custom_body(base="mistral")}) == \
        "BaseProviderType must be a standard provider"
    assert post({"provider": "orgx__c__m", **custom_body(conc=(0, 10), base_url=f"http://{DEAD_HOST}")}) == \
        "Concurrency must be greater than 0"
    assert post({"provider": "orgx__c__m", **custom_body(base_url=f"http://{DEAD_HOST}")}) == \
        f"Invalid base URL: failed to resolve hostname: lookup {DEAD_HOST}: no such host"
    conflict = client.post("/api/providers", json={"provider": "openai"})
    assert conflict.status_code == 409
    assert message(conflict) == "Provider openai already exists"


def test_post_legacy_invalid_json_message() -> None:
    with running(legacy_invalid_json_message=True) as emulator, httpx.Client(base_url=emulator.url) as http:
        response = http.post("/api/providers", content=b"{oops")
    assert response.status_code == 400
    assert message(response).startswith("Invalid JSON: ")


def test_post_ignores_keys_and_forces_active(emu: BifrostEmulator, client: httpx.Client) -> None:
    response = client.post("/api/providers", json={"provider": "orgx__c__m", "keys": [{"value": "sk-1"}],
                                                   **custom_body(conc=(64, 1024))})
    assert response.status_code == 200
    body = response.json()
    assert body["provider_status"] == "active" and "keys" not in body
    assert body["custom_provider_config"] == {"is_key_less": False, "base_provider_type": "openai"}
    record = emu.get_record("orgx__c__m")
    assert record is not None and record.keys == []
    assert emu.parked_workers("orgx__c__m") == 64


def test_post_non_standard_name_without_custom_config(emu: BifrostEmulator, client: httpx.Client) -> None:
    response = client.post("/api/providers", json={"provider": "mystery"})
    assert response.status_code == 200
    assert response.json()["provider_status"] == "active"
    assert client.get("/api/providers/mystery").json()["provider_status"] == "error"
    assert emu.parked_workers("mystery") == 0


# --------------------------------------------------------------------------------------------------
# §2.5 PUT

def test_put_upsert_creates_a_record(emu: BifrostEmulator, client: httpx.Client) -> None:
    response = client.put("/api/providers/orgx__c__m", json=custom_body(conc=(64, 1024)))
    assert response.status_code == 200
    body = response.json()
    assert body["provider_status"] == "active"
    assert body["network_config"]["base_url"] == LIVE
    assert body["concurrency_and_buffer_size"] == {"concurrency": 64, "buffer_size": 1024}
    assert client.get("/api/providers/orgx__c__m").json() == body
    assert emu.parked_workers("orgx__c__m") == 64 and emu.restarts("orgx__c__m") == 1


def test_put_new_non_standard_name_without_custom_config(emu: BifrostEmulator, client: httpx.Client) -> None:
    response = client.put("/api/providers/ghost",
                          json={"concurrency_and_buffer_size": {"concurrency": 10, "buffer_size": 10}})
    assert response.status_code == 500
    assert message(response) == ("Failed to update provider: failed to update provider: failed to create provider "
                                 "for the given key: unsupported provider: ghost")
    left = client.get("/api/providers/ghost")
    assert left.status_code == 200 and left.json()["provider_status"] == "error"
    assert "ghost" in [p["name"] for p in client.get("/api/providers").json()["providers"]]
    assert emu.parked_workers("ghost") == 0


@pytest.mark.parametrize(("block", "expected"), [
    ({"concurrency": 0, "buffer_size": 10}, "Concurrency must be greater than 0"),
    ({"concurrency": 10, "buffer_size": 0}, "Buffer size must be greater than 0"),
    ({"concurrency": 20, "buffer_size": 10}, "Concurrency must be less than or equal to buffer size"),
    ({"concurrency": 10}, "Buffer size must be greater than 0"),
    (None, "Concurrency must be greater than 0"),
    ("omitted", "Concurrency must be greater than 0"),
])
def test_put_concurrency_checks(emu: BifrostEmulator, client: httpx.Client, block: Any, expected: str) -> None:
    emu.put_record(full_custom_record())
    body: dict[str, Any] = {"custom_provider_config": {"base_provider_type": "openai"}}
    if block != "omitted":
        body["concurrency_and_buffer_size"] = block
    response = client.put("/api/providers/orgx__conn__model", json=body)
    assert response.status_code == 400
    assert message(response) == expected
    assert emu.parked_workers("orgx__conn__model") == 1000 and emu.restarts("orgx__conn__model") == 0


def test_only_zero_concurrency_is_checked_not_negatives(emu: BifrostEmulator, client: httpx.Client) -> None:
    response = client.put("/api/providers/openai",
                          json={"concurrency_and_buffer_size": {"concurrency": -1, "buffer_size": 10}})
    assert response.status_code == 200
    assert response.json()["concurrency_and_buffer_size"] == {"concurrency": -1, "buffer_size": 10}


def test_post_concurrency_checks(client: httpx.Client) -> None:
    response = client.post("/api/providers", json={"provider": "openai",
                                                   "concurrency_and_buffer_size": {"concurrency": 600,
                                                                                   "buffer_size": 500}})
    assert response.status_code == 400
    assert message(response) == "Concurrency must be less than or equal to buffer size"


def test_put_omitted_blocks_table(emu: BifrostEmulator, client: httpx.Client) -> None:
    """Every 'absent from body' cell of the §2.5 table in one minimal PUT."""
    emu.put_record(full_custom_record())
    response = client.put("/api/providers/orgx__conn__model", json=minimal_put())
    assert response.status_code == 200
    body = response.json()
    # network_config absent → zero value: base_url cleared, timeouts 0
    assert body["network_config"] == {"default_request_timeout_in_seconds": 0, "max_retries": 0,
                                      "retry_backoff_initial": 0, "retry_backoff_max": 0}
    assert body["concurrency_and_buffer_size"] == {"concurrency": 64, "buffer_size": 1024}
    assert body["proxy_config"]["password"]["value"] == "<REDACTED>"  # kept
    assert body["openai_config"] == {"disable_store": True}  # kept
    assert body["prompt_cache"] == {"enabled": True}  # kept
    assert body["store_raw_request_response"] is True  # kept
    assert body["send_back_raw_request"] is False and body["send_back_raw_response"] is False  # reset
    stored = emu.get_record("orgx__conn__model")
    assert stored is not None and stored.proxy_config is not None
    assert stored.proxy_config.password == Secret("hunter2-hunter2")


def test_put_present_blocks_table(emu: BifrostEmulator, client: httpx.Client) -> None:
    """Every 'present' cell: replaced wholesale, explicit null clears, flags set."""
    emu.put_record(full_custom_record())
    body = minimal_put()
    body.update({
        "network_config": {"base_url": "http://127.0.0.1:8/v2", "retry_backoff_initial": "250ms",
                           "retry_backoff_max": "2s"},
        "proxy_config": None,
        "openai_config": None,
        "prompt_cache": None,
        "store_raw_request_response": False,
        "send_back_raw_request": True,
        "send_back_raw_response": True,
    })
    response = client.put("/api/providers/orgx__conn__model", json=body)
    assert response.status_code == 200
    shown = response.json()
    assert shown["network_config"] == {"base_url": "http://127.0.0.1:8/v2", "default_request_timeout_in_seconds": 0,
                                       "max_retries": 0, "retry_backoff_initial": 250, "retry_backoff_max": 2000}
    assert shown["proxy_config"] is None
    assert "openai_config" not in shown and "prompt_cache" not in shown
    assert shown["store_raw_request_response"] is False
    assert shown["send_back_raw_request"] is True and shown["send_back_raw_response"] is True


def test_legacy_put_clears_omitted_blocks_option() -> None:
    with running(legacy_put_clears_blocks=True) as emulator, httpx.Client(base_url=emulator.url) as http:
        emulator.put_record(full_custom_record())
        assert http.put("/api/providers/orgx__conn__model", json=minimal_put()).status_code == 200
        assert http.get("/api/providers/orgx__conn__model").json()["proxy_config"] is None


@pytest.mark.parametrize(("cpc", "expected"), [
    ("omitted", "Invalid custom provider config: custom_provider_config cannot be removed after creation for "
                "provider orgx__conn__model"),
    (None, "Invalid custom provider config: custom_provider_config cannot be removed after creation for "
           "provider orgx__conn__model"),
    ({"base_provider_type": "anthropic"}, "Invalid custom provider config: provider orgx__conn__model: "
                                          "base_provider_type cannot be changed from openai to anthropic after "
                                          "creation"),
])
def test_custom_provider_config_is_immutable(emu: BifrostEmulator, client: httpx.Client, cpc: Any,
                                             expected: str) -> None:
    emu.put_record(full_custom_record())
    body: dict[str, Any] = {"concurrency_and_buffer_size": {"concurrency": 64, "buffer_size": 1024}}
    if cpc != "omitted":
        body["custom_provider_config"] = cpc
    response = client.put("/api/providers/orgx__conn__model", json=body)
    assert response.status_code == 400
    assert message(response) == expected
    assert emu.parked_workers("orgx__conn__model") == 1000


@pytest.mark.parametrize(("name", "cpc", "expected"), [
    ("openai", {"base_provider_type": "openai"},
     "Invalid custom provider config: custom provider validation failed: cannot be created on standard "
     "providers: openai"),
    ("orgx__new", {"base_provider_type": ""},
     "Invalid custom provider config: custom provider validation failed: base_provider_type is required"),
    ("orgx__new", {"base_provider_type": "mistral"},
     "Invalid custom provider config: custom provider validation failed: unsupported base_provider_type: "
     "mistral"),
])
def test_adding_custom_config_runs_create_validation(client: httpx.Client, name: str, cpc: dict[str, Any],
                                                     expected: str) -> None:
    response = client.put(f"/api/providers/{name}", json={
        "concurrency_and_buffer_size": {"concurrency": 10, "buffer_size": 10}, "custom_provider_config": cpc})
    assert response.status_code == 400
    assert message(response) == expected


def test_put_keys_are_refused_with_exact_text(small: BifrostEmulator, client: httpx.Client) -> None:
    body = {**minimal_put(), "keys": [{"value": "sk-new"}]}
    response = client.put("/api/providers/orgalpha__deepseek__deepseek-chat", json=body)
    assert response.status_code == 400
    assert message(response) == ("keys are not accepted on this endpoint; use POST/PUT "
                                 "/api/providers/{provider}/keys[/{key_id}] to manage keys")
    assert client.put("/api/providers/orgalpha__deepseek__deepseek-chat",
                      json={**minimal_put(), "keys": []}).status_code == 200


def test_put_keys_ignore_policy_option() -> None:
    with running(put_keys_policy="ignore") as emulator, httpx.Client(base_url=emulator.url) as http:
        response = http.put("/api/providers/openai", json={"keys": [{"value": "sk"}],
                                                           "concurrency_and_buffer_size": {"concurrency": 1,
                                                                                           "buffer_size": 1}})
    assert response.status_code == 200


@pytest.mark.parametrize(("network", "expected"), [
    ({"retry_backoff_initial": 50}, "retry backoff initial must be at least 100ms"),
    ({"retry_backoff_initial": "20m"}, "retry backoff initial must be at most 16m40s"),
    ({"retry_backoff_max": "50ms"}, "retry backoff max must be at least 100ms"),
    ({"retry_backoff_max": 1_000_001}, "retry backoff max must be at most 16m40s"),
    ({"retry_backoff_initial": 2000, "retry_backoff_max": "1s"},
     "retry backoff initial must be less than or equal to retry backoff max"),
])
def test_retry_backoff_bounds(client: httpx.Client, network: dict[str, Any], expected: str) -> None:
    body = {"concurrency_and_buffer_size": {"concurrency": 1, "buffer_size": 1}, "network_config": network}
    response = client.put("/api/providers/openai", json=body)
    assert response.status_code == 400
    assert message(response) == f"Invalid retry backoff: {expected}"


def test_backoff_input_forms(client: httpx.Client) -> None:
    body = {"concurrency_and_buffer_size": {"concurrency": 1, "buffer_size": 1},
            "network_config": {"retry_backoff_initial": "1.5s", "retry_backoff_max": 16 * 60 * 1000}}
    shown = client.put("/api/providers/openai", json=body).json()["network_config"]
    assert shown["retry_backoff_initial"] == 1500 and shown["retry_backoff_max"] == 960000
    body["network_config"] = {"retry_backoff_initial": "five parsecs"}
    response = client.put("/api/providers/openai", json=body)
    assert response.status_code == 400 and message(response) == "Invalid request payload"


def test_model_discovery_delay_applies_after_the_write_to_records_with_keys() -> None:
    """§2.9: the upstream listing runs after the store write and only for a record with keys (or key-less)."""
    with running(model_discovery_delay=60) as emulator:  # capped at the gateway's 15 s
        seed_small(emulator)
        body = {"concurrency_and_buffer_size": {"concurrency": 8, "buffer_size": 64}}
        with httpx.Client(base_url=emulator.url, timeout=0.5) as http, pytest.raises(httpx.ReadTimeout):
            http.put("/api/providers/openai", json=body)  # has a key: the write lands, the answer waits
        assert emulator.parked_workers("openai") == 8
        with httpx.Client(base_url=emulator.url, timeout=10) as http:
            response = http.put("/api/providers/orgx__c__m", json=custom_body())  # no keys: no listing
        assert response.status_code == 200


# --------------------------------------------------------------------------------------------------
# §2.8 base URL validation

@pytest.mark.parametrize(("url", "allow_private", "expected"), [
    (f"https://{DEAD_HOST}/v1", False, f"failed to resolve hostname: lookup {DEAD_HOST}: no such host"),
    ("ftp://localhost/x", False, "only https and http schemes are allowed, got: ftp"),
    ("http:///no-host", False, "URL must have a hostname"),
    ("http://169.254.169.254/latest", False, "link-local IP addresses are not allowed"),
    ("http://169.254.169.254/latest", True, "link-local IP addresses are not allowed"),
    ("http://[fe80::1]:80/", True, "link-local IP addresses are not allowed"),
    ("http://10.1.2.3/v1", False, "private IP addresses are not allowed"),
    ("http://192.168.1.20:8000/v1", False, "private IP addresses are not allowed"),
    ("http://[fd00::1]/v1", False, "private IP addresses are not allowed"),
    ("http://0.0.0.0:80/", False, "unspecified IP addresses are not allowed"),
])
def test_base_url_refusals(client: httpx.Client, url: str, allow_private: bool, expected: str) -> None:
    body = custom_body(base_url=url)
    body["network_config"]["allow_private_network"] = allow_private
    for response in (client.put("/api/providers/orgx__c__m", json=body),
                     client.post("/api/providers", json={"provider": "orgx__c__n", **body})):
        assert response.status_code == 400
        assert message(response) == f"Invalid base URL: {expected}"
    assert client.get("/api/providers").json()["total"] == 0


@pytest.mark.parametrize(("url", "allow_private"), [
    ("http://localhost:9/v1", False),
    ("http://127.0.0.1:9/v1", False),
    ("http://[::1]:9/v1", False),
    ("https://LOCALHOST/v1", False),
    ("http://10.1.2.3/v1", True),
])
def test_base_url_accepted(client: httpx.Client, url: str, allow_private: bool) -> None:
    body = custom_body(base_url=url)
    body["network_config"]["allow_private_network"] = allow_private
    response = client.put("/api/providers/orgx__c__m", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["network_config"]["base_url"] == url


def test_base_url_dns_lookup_is_bounded() -> None:
    release = threading.Event()

    def stuck_resolver(host: str) -> list[str]:
        release.wait(30)
        return ["127.0.0.1"]

    try:
        with running(dns_timeout=0.2, resolver=stuck_resolver) as emulator, \
                httpx.Client(base_url=emulator.url, timeout=10) as http:
            response = http.put("/api/providers/orgx__c__m", json=custom_body(base_url="http://slow.test/v1"))
    finally:
        release.set()
    assert response.status_code == 400
    assert message(response) == "Invalid base URL: failed to resolve hostname: lookup slow.test: i/o timeout"


# --------------------------------------------------------------------------------------------------
# §2.6 DELETE

ZERO_RESPONSE = {
    "network_config": {"default_request_timeout_in_seconds": 0, "max_retries": 0, "retry_backoff_initial": 0,
                       "retry_backoff_max": 0},
    "concurrency_and_buffer_size": {"concurrency": 0, "buffer_size": 0},
    "proxy_config": None, "send_back_raw_request": False, "send_back_raw_response": False,
    "store_raw_request_response": False, "provider_status": "",
}


def test_delete_newest(small: BifrostEmulator, client: httpx.Client) -> None:
    name = "orgbeta__together__qwen3-coder"
    response = client.delete(f"/api/providers/{name}")
    assert response.status_code == 200
    assert response.json() == {"name": name, **ZERO_RESPONSE}
    assert client.get(f"/api/providers/{name}").status_code == 404
    assert small.parked_workers(name) == 0
    assert name not in [row["name"] for row in small.state_snapshot()["records"]]
    unknown = client.delete("/api/providers/never-was")
    assert unknown.status_code == 200
    assert unknown.json() == {"name": "never-was", **ZERO_RESPONSE}


def test_delete_legacy_404() -> None:
    with running(legacy_delete_404=True) as emulator, httpx.Client(base_url=emulator.url) as http:
        seed_small(emulator)
        unknown = http.delete("/api/providers/never-was")
        assert unknown.status_code == 404
        assert message(unknown) == "Provider not found: not found"
        assert http.delete("/api/providers/openai").status_code == 200


# --------------------------------------------------------------------------------------------------
# §4 /api/config

def test_config_shape(small: BifrostEmulator, client: httpx.Client) -> None:
    body = client.get("/api/config").json()
    assert {"client_config", "framework_config", "auth_config", "is_db_connected", "is_cache_connected",
            "is_logs_connected", "proxy_config", "restart_required"} <= set(body)
    client_config = body["client_config"]
    assert client_config["drop_excess_requests"] is True  # the small seed's drift
    assert client_config["enforce_auth_on_inference"] is False
    assert client_config["disable_content_logging"] is False
    assert client_config["initial_pool_size"] == 300 and client_config["max_request_body_size_mb"] == 100
    assert body["auth_config"]["admin_password"] == ""


def test_config_put_without_client_config_fails(client: httpx.Client) -> None:
    response = client.put("/api/config", json={})
    assert response.status_code == 400
    assert message(response) == "log_retention_days must be at least 1"


def test_config_put_partial_client_config_zeroes_the_rest(client: httpx.Client) -> None:
    response = client.put("/api/config", json={"client_config": {"log_retention_days": 30}})
    assert response.status_code == 400
    assert message(response) == "mcp_agent_depth must be greater than 0"


def test_config_read_modify_write(small: BifrostEmulator, client: httpx.Client) -> None:
    before = client.get("/api/config").json()["client_config"]
    wanted = dict(before, drop_excess_requests=False, enforce_auth_on_inference=True,
                  disable_content_logging=True)
    assert client.put("/api/config", json={"client_config": wanted}).status_code == 200
    after = client.get("/api/config").json()["client_config"]
    assert after == wanted
    # a field left out is copied as its zero value, not kept
    without = {k: v for k, v in after.items() if k not in ("enforce_auth_on_inference", "allowed_origins")}
    assert client.put("/api/config", json={"client_config": without}).status_code == 200
    again = client.get("/api/config").json()["client_config"]
    assert again["enforce_auth_on_inference"] is False and again["allowed_origins"] is None
    assert small.state_snapshot()["posture"] == {"drop_excess_requests": False, "enforce_auth_on_inference": False,
                                                 "disable_content_logging": True}


@pytest.mark.parametrize(("change", "expected"), [
    ({"mcp_code_mode_binding_level": "bogus"}, "mcp_code_mode_binding_level must be 'server' or 'tool'"),
    ({"mcp_tool_execution_timeout": 0}, "mcp_tool_execution_timeout must be greater than 0"),
    ({"log_retention_days": 0}, "log_retention_days must be at least 1"),
])
def test_config_client_refusals(client: httpx.Client, change: dict[str, Any], expected: str) -> None:
    current = client.get("/api/config").json()["client_config"]
    response = client.put("/api/config", json={"client_config": {**current, **change}})
    assert response.status_code == 400
    assert message(response) == expected


def test_config_framework_and_auth_refusals(client: httpx.Client) -> None:
    current = client.get("/api/config").json()["client_config"]
    response = client.put("/api/config", json={"client_config": current,
                                               "framework_config": {"pricing_sync_interval": 0}})
    assert message(response) == "pricing sync interval must be greater than 0"
    response = client.put("/api/config", json={"client_config": current, "auth_config": {"is_enabled": True}})
    assert message(response) == "username and password are required when auth is enabled"
    response = client.put("/api/config", json={"client_config": current, "auth_config": {
        "is_enabled": True, "admin_username": "admin", "admin_password": "weakpass"}})
    assert response.status_code == 400
    assert message(response).startswith("auth password must include ")


def test_config_enabling_auth_locks_the_api(client: httpx.Client, emu: BifrostEmulator) -> None:
    current = client.get("/api/config").json()["client_config"]
    del current["enforce_auth_on_inference"]
    response = client.put("/api/config", json={"client_config": current, "auth_config": {
        "is_enabled": True, "admin_username": ADMIN[0], "admin_password": ADMIN[1]}})
    assert response.status_code == 200
    assert client.get("/api/providers").status_code == 401
    shown = client.get("/api/config", headers=basic(*ADMIN)).json()
    assert shown["auth_config"]["admin_password"] == "<redacted>"
    # first admin with enforce_auth_on_inference omitted turns it on (newest)
    assert shown["client_config"]["enforce_auth_on_inference"] is True


# --------------------------------------------------------------------------------------------------
# §5 auth, §6 health/version

def test_auth_off_everything_open(client: httpx.Client) -> None:
    assert client.get("/api/providers").status_code == 200
    assert client.get("/api/config").status_code == 200
    assert client.get("/api/session/is-auth-enabled").json() == {
        "is_auth_enabled": False, "has_valid_token": False, "auth_type": "none", "inference_auth_enforced": False}


def test_auth_on() -> None:
    with running(auth=ADMIN) as emulator, httpx.Client(base_url=emulator.url, timeout=10) as http:
        for headers in ({}, basic("admin", "wrong"), basic("other", ADMIN[1]), {"Authorization": "Basic !!"}):
            response = http.get("/api/providers", headers=headers)
            assert response.status_code == 401
            assert response.content == UNAUTHORIZED_BYTES
        assert http.put("/api/providers/openai", json={}).status_code == 401
        assert http.get("/metrics").status_code == 401  # not public
        assert http.get("/api/providers", headers=basic(*ADMIN)).status_code == 200
        legacy_bearer = {"Authorization": "Bearer " + base64.b64encode(b"admin:Adm1n-Passw0rd!").decode()}
        assert http.get("/api/providers", headers=legacy_bearer).status_code == 200
        # always public
        assert http.get("/health").json() == {"status": "ok"}
        assert http.get("/api/version").json() == "v2.2.4"
        assert http.get("/api/session/is-auth-enabled").json()["is_auth_enabled"] is True
        assert http.get("/_emulator/state").status_code == 200  # emulator control is never behind auth
        # sessions
        wrong = http.post("/api/session/login", json={"username": "admin", "password": "nope"})
        assert wrong.status_code == 401 and message(wrong) == "Invalid username or password"
        login = http.post("/api/session/login", json={"username": ADMIN[0], "password": ADMIN[1]})
        assert login.status_code == 200 and login.json() == {"message": "Login successful"}
        token = login.cookies["token"]
        http.cookies.clear()
        assert http.get("/api/providers", headers={"Cookie": f"token={token}"}).status_code == 200
        assert http.get("/api/providers", headers={"Authorization": f"Bearer {token}"}).status_code == 200


def test_login_when_auth_disabled(client: httpx.Client) -> None:
    response = client.post("/api/session/login", json={"username": "a", "password": "b"})
    assert response.status_code == 403
    assert message(response) == "Authentication is not enabled"


def test_whitelisted_routes_are_public() -> None:
    with running(auth=ADMIN) as emulator, httpx.Client(base_url=emulator.url) as http:
        emulator.set_client_config(whitelisted_routes=["/api/providers*"])
        assert http.get("/api/providers").status_code == 200
        assert http.get("/api/config").status_code == 401


def test_version_option() -> None:
    with running(version="2.2.4") as emulator, httpx.Client(base_url=emulator.url) as http:
        assert http.get("/api/version").content == b'"2.2.4"'


def test_unknown_route_and_method(client: httpx.Client) -> None:
    assert client.get("/api/nothing-here").status_code == 404
    assert client.patch("/api/providers/openai").status_code == 405


# --------------------------------------------------------------------------------------------------
# §3 worker accounting: parked workers

def test_worker_accounting(small: BifrostEmulator, client: httpx.Client) -> None:
    state = client.get("/_emulator/state").json()
    assert state["totals"]["parked_workers"] == 9576  # 1000+1000+512 standard, 7x1000+64 custom, 0 unbuildable
    assert state["totals"]["restarts"] == 0  # booted, never written
    assert state["boot_memory"]["low_bytes"] == 9576 * 2048
    assert state["boot_memory"]["high_bytes"] == 9576 * 8192
    assert small.boot_memory() == (9576 * 2048, 9576 * 8192)
    rows = {row["name"]: row for row in state["records"]}
    assert rows["legacy-lan-gateway"]["parked_workers"] == 0
    assert rows["legacy-lan-gateway"]["provider_status"] == "error"
    assert rows["openrouter"] == {**rows["openrouter"], "parked_workers": 512, "queue_slots": 8192, "restarts": 0}

    name = "orgalpha__deepseek__deepseek-chat"
    body = {"network_config": client.get(f"/api/providers/{name}").json()["network_config"], **minimal_put()}
    for expected_restarts in (1, 2):
        assert client.put(f"/api/providers/{name}", json=body).status_code == 200
        assert small.restarts(name) == expected_restarts
    assert small.parked_workers(name) == 64
    refused = client.put(f"/api/providers/{name}", json={**body, "keys": [{"value": "x"}]})
    assert refused.status_code == 400 and small.restarts(name) == 2
    assert small.parked_workers() == 9576 - 1000 + 64
    assert client.delete(f"/api/providers/{name}").status_code == 200
    assert small.parked_workers() == 9576 - 1000
    totals = client.get("/_emulator/state").json()["totals"]
    assert totals["parked_workers"] == 9576 - 1000 and totals["records"] == 11


def test_refused_write_keeps_workers_on_dead_record(small: BifrostEmulator, client: httpx.Client) -> None:
    name = "orgbeta__together__qwen3-coder"
    listed = client.get(f"/api/providers/{name}").json()
    body = {"network_config": listed["network_config"], **minimal_put(),
            "send_back_raw_request": listed["send_back_raw_request"]}
    response = client.put(f"/api/providers/{name}", json=body)
    assert response.status_code == 400
    assert message(response) == ("Invalid base URL: failed to resolve hostname: lookup together.orgbeta.invalid: "
                                 "no such host")
    assert small.parked_workers(name) == 1000 and small.restarts(name) == 0


# --------------------------------------------------------------------------------------------------
# §7 the process: /metrics, its memory, its limit

KIB = 1024
MIB = 1024 * 1024
#: the small seed's parked workers (1000+1000+512 standard, 7x1000+64 custom, the unbuildable record none)
SMALL_WORKERS = 9576


def scrape(url: str, **kwargs: Any) -> dict[str, list[tuple[dict[str, str], float]]]:
    """GET /metrics, parsed with prometheus_client's text parser: sample name -> [(labels, value)]."""
    from prometheus_client.parser import text_string_to_metric_families

    response = httpx.get(url + "/metrics", timeout=10, **kwargs)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def one(samples: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float:
    values = samples[name]
    assert len(values) == 1 and values[0][0] == {}, values
    return values[0][1]


def test_metrics_follow_the_parked_workers() -> None:
    """goroutines = baseline + parked workers; stacks = goroutines x stack; resident = baseline + stacks."""
    with running(stack_bytes_per_goroutine=5 * KIB, baseline_memory_bytes=40 * MIB, baseline_goroutines=30) as emu:
        seed_small(emu)
        samples = scrape(emu.url)
        assert one(samples, "go_goroutines") == 30 + SMALL_WORKERS
        assert one(samples, "go_memstats_stack_inuse_bytes") == (30 + SMALL_WORKERS) * 5 * KIB
        assert one(samples, "process_resident_memory_bytes") == 40 * MIB + (30 + SMALL_WORKERS) * 5 * KIB
        # the rest of the Go runtime and process collectors' names, and the plugin's own series
        for name in ("go_memstats_heap_inuse_bytes", "go_memstats_sys_bytes", "go_threads",
                     "process_start_time_seconds", "process_virtual_memory_bytes", "process_cpu_seconds_total",
                     "go_gc_duration_seconds_count"):
            assert name in samples, name
        assert samples["go_info"][0][0]["version"].startswith("go")
        assert {labels["provider"] for labels, _ in samples["bifrost_provider_key_up"]} >= {"openai"}
        # a write moves them: 1,000 workers down to 64
        name = "orgalpha__deepseek__deepseek-chat"
        body = {"network_config": httpx.get(f"{emu.url}/api/providers/{name}").json()["network_config"],
                **minimal_put()}
        assert httpx.put(f"{emu.url}/api/providers/{name}", json=body).status_code == 200
        after = scrape(emu.url)
        assert one(after, "go_goroutines") == 30 + SMALL_WORKERS - 1000 + 64
        assert one(after, "process_resident_memory_bytes") == 40 * MIB + (30 + SMALL_WORKERS - 936) * 5 * KIB
        # what a restart would need: the baseline plus every stored buildable record's workers
        assert emu.boot_memory_bytes() == 40 * MIB + (30 + SMALL_WORKERS - 936) * 5 * KIB
        http = {(labels["path"], labels["method"], labels["status"]): value
                for labels, value in after["http_requests_total"]}
        assert http[("/api/providers/{provider}", "PUT", "200")] == 1
        assert http[("/metrics", "GET", "200")] == 1  # the first scrape (this one is counted after it is answered)


def test_boot_memory_counts_stored_records_not_the_running_overlap() -> None:
    with running(stack_bytes_per_goroutine=4 * KIB, baseline_memory_bytes=10 * MIB, baseline_goroutines=0) as emu:
        emu.load([ProviderRecord("openai", concurrency_and_buffer_size=Concurrency(100, 1000)),
                  ProviderRecord("not-a-provider", concurrency_and_buffer_size=Concurrency(500, 1000))])
        assert emu.boot_memory_bytes() == 10 * MIB + 100 * 4 * KIB  # the unbuildable record starts nothing
        assert emu.runtime()["goroutines"] == 100


def test_metrics_need_credentials_when_auth_is_on() -> None:
    """/metrics is not public (§5): 401 without Basic auth, 200 with it."""
    with running(auth=ADMIN) as emu:
        seed_small(emu)
        assert httpx.get(emu.url + "/metrics").content == UNAUTHORIZED_BYTES
        assert one(scrape(emu.url, headers=basic(*ADMIN)), "go_goroutines") == 64 + SMALL_WORKERS


def test_metrics_off_is_a_404_as_with_the_telemetry_plugin_off() -> None:
    with running(metrics_enabled=False) as emu:
        response = httpx.get(emu.url + "/metrics")
        assert (response.status_code, response.content) == (404, b"Not Found")
        assert response.headers["content-type"].startswith("text/plain")
    with running(metrics_enabled=False, auth=ADMIN) as emu:
        assert httpx.get(emu.url + "/metrics").status_code == 401
        assert httpx.get(emu.url + "/metrics", headers=basic(*ADMIN)).status_code == 404


def test_metrics_that_lie_report_goroutines_far_from_the_workers() -> None:
    with running(metrics_goroutines=250) as emu:
        seed_small(emu)
        samples = scrape(emu.url)
        assert one(samples, "go_goroutines") == 250
        assert emu.goroutines() == 64 + SMALL_WORKERS  # the truth
        assert one(samples, "go_memstats_stack_inuse_bytes") == (64 + SMALL_WORKERS) * 8 * KIB


def test_metrics_escape_label_values_from_the_store() -> None:
    from gatewayscope.sandbox.bifrost_emulator import Key

    hostile = 'k"ey\\name\nwith a newline'
    with running() as emu:
        emu.load([ProviderRecord("openai", concurrency_and_buffer_size=Concurrency(10, 100),
                                 keys=[Key(id="k1", name=hostile, value=Secret("sk-123456789"))])])
        samples = scrape(emu.url)
        assert samples["bifrost_provider_key_up"] == [({"provider": "openai", "key_id": "k1", "key_name": hostile},
                                                       1.0)]


def test_metrics_faults() -> None:
    from gatewayscope.sandbox.bifrost_emulator import METRICS

    with running() as emu:
        emu.inject_garbage("GET", METRICS, body="not metrics {{{", status=200, content_type="text/plain")
        assert httpx.get(emu.url + "/metrics").text == "not metrics {{{"
        assert httpx.get(emu.url + "/metrics").text.startswith("# HELP")


def _sample_goroutines_during(emu: BifrostEmulator, write: Any) -> list[float]:
    """go_goroutines sampled (bounded) while ``write`` runs in a thread."""
    seen: list[float] = []
    thread = threading.Thread(target=write)
    thread.start()
    deadline = time.monotonic() + 10
    while thread.is_alive() and time.monotonic() < deadline:
        seen.append(one(scrape(emu.url), "go_goroutines"))
        time.sleep(0.01)
    thread.join(timeout=10)
    seen.append(one(scrape(emu.url), "go_goroutines"))
    return seen


def test_an_update_retires_the_old_workers_before_the_new_ones_start_by_default() -> None:
    """The core as read (UpdateProvider waits for the old workers, then starts the new ones): no moment runs
    both pools, even while the write's model listing keeps the answer back."""
    from gatewayscope.sandbox.bifrost_emulator import Key

    with running(baseline_goroutines=0, model_discovery_delay=0.5) as emu:  # an enabled key: the listing runs
        emu.load([ProviderRecord("openai", concurrency_and_buffer_size=Concurrency(1000, 5000),
                                 keys=[Key(id="k", name="k", value=Secret("sk-123456789"))])])
        assert one(scrape(emu.url), "go_goroutines") == 1000
        seen = _sample_goroutines_during(emu, lambda: httpx.put(
            emu.url + "/api/providers/openai", json={"concurrency_and_buffer_size": {
                "concurrency": 600, "buffer_size": 5000}}, timeout=10))
        assert len(seen) >= 3 and max(seen) <= 1000 and seen[-1] == 600


def test_an_overlapping_update_runs_old_and_new_workers_together() -> None:
    with running(baseline_goroutines=0, update_overlap=True, update_overlap_seconds=0.5) as emu:
        emu.load([ProviderRecord("openai", concurrency_and_buffer_size=Concurrency(1000, 5000))])
        seen = _sample_goroutines_during(emu, lambda: httpx.put(
            emu.url + "/api/providers/openai", json={"concurrency_and_buffer_size": {
                "concurrency": 600, "buffer_size": 5000}}, timeout=10))
        assert max(seen) == 1600 and seen[-1] == 600
        assert emu.runtime()["retiring_workers"] == 0


def test_a_process_over_its_memory_limit_is_killed_and_a_restart_boots_the_stored_records() -> None:
    """An update's overlap that would take resident memory past the limit kills the process mid-request: the
    record is stored, no answer comes, nothing answers until a restart; the restart boots the stored records."""
    stack = 4 * KIB
    resident = 8 * MIB + 1000 * stack  # baseline 8 MiB, no other goroutines, 1,000 workers
    limit = resident + 500 * stack  # room for 500 more workers, not 600
    with running(stack_bytes_per_goroutine=stack, baseline_memory_bytes=8 * MIB, baseline_goroutines=0,
                 memory_limit_bytes=limit, update_overlap=True, update_overlap_seconds=0.2) as emu:
        emu.load([ProviderRecord("openai", concurrency_and_buffer_size=Concurrency(1000, 5000))])
        body = {"concurrency_and_buffer_size": {"concurrency": 600, "buffer_size": 5000}}
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.put(emu.url + "/api/providers/openai", json=body, timeout=10)
        assert emu.dead
        with pytest.raises(httpx.TransportError):
            httpx.get(emu.url + "/health", timeout=5)
        state = httpx.get(emu.url + "/_emulator/state").json()["runtime"]
        assert state["dead"] is True and state["deaths"] == 1
        assert "PUT /api/providers/openai" in state["death_reason"] and str(limit) in state["death_reason"]
        assert state["peak_resident_memory_bytes"] <= limit
        # the restart boots the stored record with its new pool: 600 workers fit
        restarted = httpx.post(emu.url + "/_emulator/restart").json()
        assert restarted["dead"] is False and restarted["goroutines"] == 600
        assert httpx.get(emu.url + "/api/providers/openai").json()["concurrency_and_buffer_size"]["concurrency"] == 600
        # an overlap that reaches the limit exactly (600 old + 900 new) is within it
        assert httpx.put(emu.url + "/api/providers/openai", json={"concurrency_and_buffer_size": {
            "concurrency": 900, "buffer_size": 5000}}, timeout=10).status_code == 200
        assert emu.runtime()["peak_resident_memory_bytes"] == limit and not emu.dead


def test_a_boot_over_the_limit_is_killed_again_at_every_restart() -> None:
    with running(stack_bytes_per_goroutine=8 * KIB, baseline_memory_bytes=MIB, baseline_goroutines=0,
                 memory_limit_bytes=4 * MIB) as emu:
        assert emu.load([ProviderRecord("openai", concurrency_and_buffer_size=Concurrency(1000, 5000))]) is False
        assert emu.dead and "boot" in str(emu.runtime()["death_reason"])
        assert emu.restart() is False
        assert emu.runtime()["deaths"] == 2


def test_a_post_over_the_limit_is_killed() -> None:
    with running(stack_bytes_per_goroutine=8 * KIB, baseline_memory_bytes=MIB, baseline_goroutines=0,
                 memory_limit_bytes=4 * MIB) as emu:
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.post(emu.url + "/api/providers", json={"provider": "openai"}, timeout=10)  # 1,000 default workers
        assert emu.dead and emu.get_record("openai") is not None


def test_the_process_knobs_are_checked() -> None:
    with pytest.raises(ValueError):
        BifrostEmulator(options=EmulatorOptions(stack_bytes_per_goroutine=0))
    with pytest.raises(ValueError):
        BifrostEmulator(options=EmulatorOptions(memory_limit_bytes=0))


# --------------------------------------------------------------------------------------------------
# faults and the request log

def test_fault_error_without_write(small: BifrostEmulator, client: httpx.Client) -> None:
    name = "orgalpha__deepseek__deepseek-chat"
    small.inject_error("PUT", name, status=500, message="Failed to update provider: database is locked")
    response = client.put(f"/api/providers/{name}", json=minimal_put())
    assert response.status_code == 500
    assert message(response) == "Failed to update provider: database is locked"
    assert small.parked_workers(name) == 1000 and small.restarts(name) == 0
    assert client.put(f"/api/providers/{name}", json=minimal_put()).status_code == 200  # only the next one


def test_fault_error_after_write(small: BifrostEmulator, client: httpx.Client) -> None:
    name = "orgalpha__deepseek__deepseek-chat"
    small.inject_error("PUT", name, status=502, apply_write=True)
    response = client.put(f"/api/providers/{name}", json=minimal_put())
    assert response.status_code == 502
    assert message(response) == "Failed to update provider: emulated fault"
    assert small.parked_workers(name) == 64 and small.restarts(name) == 1


def test_fault_scope_and_count(small: BifrostEmulator, client: httpx.Client) -> None:
    small.inject_error("PUT", "openai", status=503, message="x", times=2)
    other = client.put("/api/providers/anthropic", json={"concurrency_and_buffer_size": {"concurrency": 1,
                                                                                          "buffer_size": 1}})
    assert other.status_code == 200  # another record is not affected
    assert client.get("/api/providers/openai").status_code == 200  # another method is not affected
    body = {"concurrency_and_buffer_size": {"concurrency": 1, "buffer_size": 1}}
    assert [client.put("/api/providers/openai", json=body).status_code for _ in range(3)] == [503, 503, 200]
    assert small.faults()[0].remaining == 0


def test_fault_slow_answer(small: BifrostEmulator) -> None:
    name = "orgalpha__deepseek__deepseek-chat"
    small.inject_slow("PUT", name, delay=0.3, apply_write=True)
    with httpx.Client(base_url=small.url, timeout=10) as http:
        response = http.put(f"/api/providers/{name}", json=minimal_put())
    assert response.status_code == 200 and small.parked_workers(name) == 64


def test_fault_slow_write_lands_before_the_client_gives_up(small: BifrostEmulator) -> None:
    name = "orgalpha__deepseek__deepseek-chat"
    small.inject_slow("PUT", name, delay=30, apply_write=True)
    with httpx.Client(base_url=small.url, timeout=0.5) as http, pytest.raises(httpx.ReadTimeout):
        http.put(f"/api/providers/{name}", json=minimal_put())
    assert small.parked_workers(name) == 64 and small.restarts(name) == 1


def test_fault_slow_write_not_yet_applied(small: BifrostEmulator) -> None:
    name = "orgalpha__deepseek__deepseek-chat"
    small.inject_slow("PUT", name, delay=30, apply_write=False)
    with httpx.Client(base_url=small.url, timeout=0.5) as http, pytest.raises(httpx.ReadTimeout):
        http.put(f"/api/providers/{name}", json=minimal_put())
    assert small.parked_workers(name) == 1000 and small.restarts(name) == 0


def test_fault_no_answer_close(small: BifrostEmulator) -> None:
    name = "orgalpha__deepseek__deepseek-chat"
    small.inject_no_answer("PUT", name, mode="close")
    with httpx.Client(base_url=small.url, timeout=10) as http:
        with pytest.raises(httpx.RemoteProtocolError):
            http.put(f"/api/providers/{name}", json=minimal_put())
        assert http.get(f"/api/providers/{name}").json()["concurrency_and_buffer_size"]["concurrency"] == 64
    logged = small.requests("PUT")
    assert logged[-1].outcome == "dropped" and logged[-1].status is None


def test_fault_no_answer_hang(small: BifrostEmulator) -> None:
    name = "orgalpha__deepseek__deepseek-chat"
    small.inject_no_answer("PUT", name, mode="hang", hang_seconds=30)
    with httpx.Client(base_url=small.url, timeout=0.5) as http, pytest.raises(httpx.ReadTimeout):
        http.put(f"/api/providers/{name}", json=minimal_put())
    assert small.parked_workers(name) == 64


def test_fault_delete_between_read_and_write(small: BifrostEmulator, client: httpx.Client) -> None:
    name = "orgalpha__deepseek__deepseek-chat"
    small.inject_delete_after_read(name)
    read = client.get(f"/api/providers/{name}")
    assert read.status_code == 200 and read.json()["name"] == name
    assert client.get(f"/api/providers/{name}").status_code == 404
    assert small.parked_workers(name) == 0
    # PUT is an upsert: a blind write now recreates the record (what a client must avoid)
    assert client.put(f"/api/providers/{name}", json=minimal_put()).status_code == 200
    assert small.get_record(name) is not None


def test_fault_garbage_listing(small: BifrostEmulator, client: httpx.Client) -> None:
    small.inject_garbage()
    response = client.get("/api/providers")
    assert response.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        json.loads(response.content)
    assert client.get("/api/providers").json()["total"] == 12


def test_faults_over_http(small: BifrostEmulator, client: httpx.Client) -> None:
    armed = client.post("/_emulator/faults", json={"kind": "error", "method": "GET", "target": LIST,
                                                   "status": 500})
    assert armed.status_code == 200 and armed.json()["remaining"] == 1
    listing = client.get("/api/providers")
    assert listing.status_code == 500 and message(listing) == "Failed to get providers: emulated fault"
    client.post("/_emulator/faults", json={"kind": "no_answer", "method": "PUT", "target": "openai", "times": None})
    assert client.get("/_emulator/faults").json()["faults"][1]["remaining"] is None
    assert client.post("/_emulator/reset-faults").json() == {"removed": 2}
    assert client.put("/api/providers/openai", json={"concurrency_and_buffer_size": {
        "concurrency": 1, "buffer_size": 1}}).status_code == 200
    bad = client.post("/_emulator/faults", json={"kind": "explode"})
    assert bad.status_code == 400


def test_request_log_records_bytes_on_the_wire(client: httpx.Client, emu: BifrostEmulator) -> None:
    raw = b'{"concurrency_and_buffer_size":{"concurrency":1,"buffer_size":1}}'
    client.put("/api/providers/openai", content=raw, headers={"Authorization": "Basic c2VjcmV0OnNlY3JldA=="})
    client.get("/_emulator/state")  # control requests are not logged
    entries = emu.requests()
    assert [(e.method, e.path) for e in entries] == [("PUT", "/api/providers/openai")]
    assert entries[0].body == raw and entries[0].status == 200
    assert entries[0].headers["authorization"] == "Basic <redacted>"
    over_http = client.get("/_emulator/requests").json()["requests"]
    assert over_http[0]["body"] == raw.decode() and over_http[0]["outcome"] == "answered"
    client.delete("/_emulator/requests")
    assert emu.requests() == []


# --------------------------------------------------------------------------------------------------
# seeding

def test_small_seed_counts(emu: BifrostEmulator) -> None:
    summary = seed_small(emu)
    assert (summary.records, summary.standard, summary.custom, summary.anthropic_lanes, summary.unknown,
            summary.dead_base_urls) == (12, 3, 8, 3, 1, 2)
    assert summary.parked_workers == emu.parked_workers() == 9576


def test_realistic_seed_default_counts(emu: BifrostEmulator, client: httpx.Client) -> None:
    summary = seed_realistic(emu)
    assert (summary.records, summary.standard, summary.custom, summary.anthropic_lanes, summary.unknown,
            summary.dead_base_urls, summary.live_base_urls) == (257, 4, 252, 91, 1, 45, 208)
    assert summary.parked_workers == 256_000 == emu.parked_workers()
    assert summary.boot_memory_high_bytes == 256_000 * 8192
    listing = client.get("/api/providers").json()
    assert listing["total"] == 257
    by_name = {p["name"]: p for p in listing["providers"]}
    for name, provider in by_name.items():
        assert provider["concurrency_and_buffer_size"] == {"concurrency": 1000, "buffer_size": 5000}
        if name in ("openai", "anthropic", "openrouter", "gemini"):
            assert "base_url" not in provider["network_config"] and "custom_provider_config" not in provider
            continue
        if name == "legacy-lan-gateway":
            assert provider["provider_status"] == "error"
            continue
        org, connector, *model = name.split("__")
        assert org.startswith("org") and connector and model
        cpc = provider["custom_provider_config"]
        host = provider["network_config"]["base_url"].split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[0]
        assert host in ("localhost", "127.0.0.1") or host.endswith(".invalid")
        if name.endswith("__anthropic"):
            assert cpc["base_provider_type"] == "anthropic"
            assert name[: -len("__anthropic")] in by_name  # the lane's sibling
        else:
            assert cpc["base_provider_type"] == "openai"
    assert any(p["send_back_raw_request"] for p in listing["providers"])
    assert any(p["proxy_config"] for p in listing["providers"])
    assert any(p["network_config"].get("extra_headers") for p in listing["providers"])
    client_config = client.get("/api/config").json()["client_config"]
    assert (client_config["drop_excess_requests"], client_config["enforce_auth_on_inference"],
            client_config["disable_content_logging"]) == (True, False, False)
    assert client.get("/_emulator/state").json()["totals"]["restarts"] == 0


def test_realistic_seed_is_deterministic() -> None:
    first = realistic_records(rng_seed=11)
    assert first == realistic_records(rng_seed=11)
    assert [r.name for r in first] != [r.name for r in realistic_records(rng_seed=12)]
    bigger = realistic_records(orgs=40, connectors=6, models=6, dead_fraction=0.5, rng_seed=11)
    assert len(bigger) > len(first)


def test_seed_over_http(client: httpx.Client) -> None:
    summary = client.post("/_emulator/seed", json={"seed": "realistic", "rng_seed": 3}).json()
    assert summary["records"] == client.get("/api/providers").json()["total"]
    assert summary["rng_seed"] == 3


def test_apply_seed_rejects_unknown_name(emu: BifrostEmulator) -> None:
    with pytest.raises(ValueError, match="unknown seed"):
        apply_seed(emu, "huge")


# --------------------------------------------------------------------------------------------------
# command line

def _wait_health(url: str, proc: subprocess.Popen[str]) -> None:
    for _ in range(200):
        if proc.poll() is not None:
            raise AssertionError(f"emulator exited early: {proc.communicate()}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError("emulator did not answer /health")


@contextmanager
def emulator_process(*args: str, env: dict[str, str] | None = None,
                     entry: str = "module") -> Iterator[tuple[subprocess.Popen[str], str]]:
    port = free_port()
    if entry == "module":
        argv = [sys.executable, "-m", "gatewayscope.sandbox.bifrost_emulator", "--port", str(port), *args]
    else:  # the `gatewayscope emulate bifrost` subcommand, registered on a bare parser
        script = ("import argparse, sys\nfrom gatewayscope.cli import emulate\n"
                  "p = argparse.ArgumentParser(prog='gatewayscope'); s = p.add_subparsers()\n"
                  "emulate.register(s); a = p.parse_args(sys.argv[1:]); sys.exit(a.func(a))\n")
        argv = [sys.executable, "-c", script, "emulate", "bifrost", "--port", str(port), *args]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})}, start_new_session=True)
    try:
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


@pytest.mark.e2e  # starts a process
@pytest.mark.parametrize("entry", ["module", "subcommand"])
def test_cli_serves_seed_and_stops_on_ctrl_c(entry: str) -> None:
    with emulator_process("--seed", "small", entry=entry) as (proc, url):
        _wait_health(url, proc)
        assert httpx.get(url + "/api/providers").json()["total"] == 12
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=15)
        assert proc.returncode == 0
    assert f"listening on {url}" in out and "emulator, not the real gateway" in out
    assert "9,576" in out


@pytest.mark.e2e  # starts a process
def test_cli_auth_password_from_env() -> None:
    env = {"MY_EMULATOR_PW": ADMIN[1]}
    with emulator_process("--auth-user", "admin", "--auth-password-env", "MY_EMULATOR_PW", env=env) as (proc, url):
        _wait_health(url, proc)
        assert httpx.get(url + "/api/providers").content == UNAUTHORIZED_BYTES
        assert httpx.get(url + "/api/providers", headers=basic(*ADMIN)).status_code == 200
        proc.terminate()
        proc.communicate(timeout=15)
        assert proc.returncode == 0


@pytest.mark.e2e  # starts a process
def test_cli_auth_user_without_password_env_is_a_usage_error() -> None:
    env = {"GATEWAYSCOPE_EMULATOR_PASSWORD": ""}
    with emulator_process("--auth-user", "admin", env=env) as (proc, _url):
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert "GATEWAYSCOPE_EMULATOR_PASSWORD" in err
