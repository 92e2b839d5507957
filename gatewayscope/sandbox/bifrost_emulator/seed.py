"""Stores the emulator can boot with: ``empty``, ``small`` (a dozen records) and ``realistic``.

A seed models *the store as it was at boot*: it is written into the state directly (never through PUT),
so every buildable record parks its workers and no restart is counted. The realistic store is what a
platform that provisions a custom record per organization and model leaves behind (docs/concepts.md,
"Bifrost: parked workers, boot memory, posture"): shared standard records plus one custom record per
(organization, connector, model) and an ``__anthropic`` lane sibling for connectors that have one, all at
the gateway's 1,000-worker / 5,000-slot default, some upstreams gone (base URLs under ``.invalid``), and
client_config drifted (``drop_excess_requests`` on, ``enforce_auth_on_inference`` and
``disable_content_logging`` off).

Live base URLs use loopback names (``localhost``, ``127.0.0.1``): this machine resolves no external
name, and the gateway's DNS check allows loopback. Dead ones use the reserved ``.invalid`` TLD, which
never resolves anywhere. Everything is deterministic for a given ``rng_seed``.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from gatewayscope.sandbox.bifrost_emulator._go import MILLISECOND
from gatewayscope.sandbox.bifrost_emulator.globalconfig import GlobalConfig
from gatewayscope.sandbox.bifrost_emulator.model import (
    Concurrency,
    CustomProviderConfig,
    Key,
    NetworkConfig,
    ProviderRecord,
    ProxyConfig,
    Secret,
)
from gatewayscope.sandbox.bifrost_emulator.state import STACK_BYTES_HIGH, STACK_BYTES_LOW

if TYPE_CHECKING:
    from gatewayscope.sandbox.bifrost_emulator.server import BifrostEmulator

SEED_NAMES = ("empty", "small", "realistic")
DEFAULT_RNG_SEED = 4574
#: port named in live base URLs (nothing needs to listen there: the gateway's check is DNS only)
DEFAULT_LIVE_PORT = 18080
LANE_SUFFIX = "__anthropic"

_FAKE_PEM = ("-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUEmulatorOnlyNotARealCertificate0wCgYIKoZIzj0E\n"
             "AwIwFDESMBAGA1UEAwwJcHJveHktY2EwHhcNMjYwMTAxMDAwMDAwWhcNMzYwMTAx\n-----END CERTIFICATE-----\n")


@dataclass(frozen=True)
class Connector:
    """A kind of custom upstream the platform provisions per organization and model."""

    name: str
    base_provider_type: str
    path: str
    models: tuple[str, ...]
    anthropic_lane: bool = False
    lane_path: str = "/anthropic"
    key_less: bool = False
    key_prefix: str = "sk-"


#: connectors in the order ``connectors=N`` takes them
CONNECTORS: tuple[Connector, ...] = (
    Connector("openrouter", "openai", "/api/v1", ("gpt-4.1-mini", "claude-sonnet-4", "deepseek-r1",
              "llama-3.3-70b-instruct", "qwen3-coder", "gemini-2.5-pro", "kimi-k2"),
              anthropic_lane=True, lane_path="/api", key_prefix="sk-or-v1-"),
    Connector("deepseek", "openai", "/v1", ("deepseek-chat", "deepseek-reasoner", "deepseek-v3.1",
              "deepseek-coder", "deepseek-r1-0528", "deepseek-v3-0324"), anthropic_lane=True),
    Connector("vllm-lan", "openai", "/v1", ("llama3.1-8b-instruct", "qwen2.5-coder-32b", "mistral-small-24b",
              "gemma-3-27b", "phi-4", "llama3.3-70b"), key_less=True),
    Connector("together", "openai", "/v1", ("meta-llama-3.3-70b", "qwen2.5-72b", "mixtral-8x22b",
              "deepseek-v3", "glm-4.5", "kimi-k2-instruct"), key_prefix="tgp_v1_"),
    Connector("ollama-box", "openai", "/v1", ("llama3.1:8b", "qwen3:14b", "gemma3:12b", "mistral:7b",
              "phi4:14b", "codellama:13b"), key_less=True),
    Connector("azure-gw", "openai", "/openai/v1", ("gpt-4o", "gpt-4.1", "o4-mini", "gpt-4o-mini", "o3",
              "gpt-5-mini"), key_prefix="az-"),
)

DRIFTED_CLIENT = {"drop_excess_requests": True, "enforce_auth_on_inference": False,
                  "disable_content_logging": False, "log_retention_days": 30}


@dataclass
class SeedSummary:
    """What a seed put into the store."""

    name: str
    rng_seed: int | None
    records: int
    standard: int
    custom: int
    anthropic_lanes: int
    unknown: int
    dead_base_urls: int
    live_base_urls: int
    parked_workers: int
    queue_slots: int
    boot_memory_low_bytes: int
    boot_memory_high_bytes: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summarize(name: str, records: list[ProviderRecord], rng_seed: int | None = None) -> SeedSummary:
    """Counts of a record list, pools as the core would start them at boot."""
    workers = sum(max(0, r.concurrency) for r in records if r.buildable)
    slots = sum(max(0, r.buffer_size) for r in records if r.buildable)
    dead = sum(1 for r in records if _host(r.base_url).endswith(".invalid"))
    return SeedSummary(
        name=name, rng_seed=rng_seed, records=len(records),
        standard=sum(1 for r in records if r.kind == "standard"),
        custom=sum(1 for r in records if r.kind == "custom"),
        anthropic_lanes=sum(1 for r in records if r.kind == "custom" and r.name.endswith(LANE_SUFFIX)),
        unknown=sum(1 for r in records if r.kind == "unknown"),
        dead_base_urls=dead,
        live_base_urls=sum(1 for r in records if r.base_url) - dead,
        parked_workers=workers, queue_slots=slots,
        boot_memory_low_bytes=workers * STACK_BYTES_LOW, boot_memory_high_bytes=workers * STACK_BYTES_HIGH,
    )


def _host(url: str) -> str:
    rest = url.split("://", 1)[-1]
    return rest.split("/", 1)[0].rsplit(":", 1)[0]


def drifted_config() -> GlobalConfig:
    """client_config with the platform's three posture settings drifted (and a 30-day log retention)."""
    config = GlobalConfig()
    config.client_config.update(DRIFTED_CLIENT)
    return config


def _network(base_url: str, *, timeout: int = 300, retries: int = 0,
             headers: dict[str, str] | None = None) -> NetworkConfig:
    return NetworkConfig(base_url=base_url, extra_headers=dict(headers or {}),
                         default_request_timeout_in_seconds=timeout, max_retries=retries,
                         retry_backoff_initial_ns=500 * MILLISECOND, retry_backoff_max_ns=5000 * MILLISECOND,
                         stream_idle_timeout_in_seconds=120, keep_alive_timeout_in_seconds=30,
                         max_conns_per_host=5000)


def _key(rng: random.Random, name: str, prefix: str, models: list[str] | None = None) -> Key:
    return Key(id=str(uuid.UUID(int=rng.getrandbits(128), version=4)), name=f"{name}-key",
               value=Secret(prefix + f"{rng.getrandbits(160):040x}"), models=models or ["*"])


def standard_records(rng: random.Random) -> list[ProviderRecord]:
    """The shared built-in records: no base URL, every organization's key, the 1,000/5,000 default."""
    return [
        ProviderRecord("openai", concurrency_and_buffer_size=Concurrency(1000, 5000),
                       openai_config={"disable_store": True},
                       keys=[_key(rng, "openai", "sk-proj-"), _key(rng, "openai-batch", "sk-proj-")]),
        ProviderRecord("anthropic", keys=[_key(rng, "anthropic", "sk-ant-api03-")]),
        ProviderRecord("openrouter", concurrency_and_buffer_size=Concurrency(1000, 5000),
                       keys=[_key(rng, "openrouter", "sk-or-v1-")]),
        ProviderRecord("gemini", keys=[_key(rng, "gemini", "AIza")]),
    ]


def realistic_records(*, orgs: int = 20, connectors: int = 4, models: int = 5, dead_fraction: float = 0.15,
                      rng_seed: int = DEFAULT_RNG_SEED, live_port: int = DEFAULT_LIVE_PORT,
                      include_broken: bool = True) -> list[ProviderRecord]:
    """The realistic store's records (pure: same arguments, same records)."""
    if not 1 <= connectors <= len(CONNECTORS):
        raise ValueError(f"connectors must be between 1 and {len(CONNECTORS)}")
    if models < 1 or orgs < 0 or not 0.0 <= dead_fraction <= 1.0:
        raise ValueError("models must be ≥ 1, orgs ≥ 0 and dead_fraction within [0, 1]")
    rng = random.Random(rng_seed)
    records = standard_records(rng)
    catalog = CONNECTORS[:connectors]
    seen_orgs: set[str] = set()
    for _ in range(orgs):
        org = f"org{rng.getrandbits(24):06x}"
        while org in seen_orgs:
            org = f"org{rng.getrandbits(24):06x}"
        seen_orgs.add(org)
        chosen = [c for c in catalog if rng.random() < 0.75] or [rng.choice(catalog)]
        for connector in chosen:
            records.extend(_org_connector_records(rng, org, connector, models=models,
                                                  dead=rng.random() < dead_fraction, live_port=live_port))
    if include_broken:
        # An operator-made record with a non-standard name and no custom config: the core cannot build
        # it, so it parks no workers and lists as provider_status "error".
        records.append(ProviderRecord("legacy-lan-gateway",
                                      network_config=_network(f"http://localhost:{live_port}/v1")))
    return records


def _org_connector_records(rng: random.Random, org: str, connector: Connector, *, models: int, dead: bool,
                           live_port: int) -> list[ProviderRecord]:
    if dead:
        root = f"https://{connector.name}.{org}.invalid"
    else:
        root = f"http://{rng.choice(('localhost', '127.0.0.1'))}:{live_port}/{connector.name}"
    headers = {"X-Org-Id": org} if rng.random() < 0.25 else {}
    proxy = None
    if rng.random() < 0.1:
        proxy = ProxyConfig(type="http", url=Secret(f"http://127.0.0.1:3128/{org}"),
                            username=Secret(f"proxy-{org}"), password=Secret(f"{rng.getrandbits(96):024x}"),
                            ca_cert_pem=Secret(_FAKE_PEM) if rng.random() < 0.5 else None)
    raw = rng.random() < 0.2
    store_raw = rng.random() < 0.1
    timeout = rng.choice((300, 300, 600))
    retries = rng.choice((0, 0, 1, 2))
    out: list[ProviderRecord] = []
    picked = rng.sample(connector.models, rng.randint(1, min(models, len(connector.models))))
    for model in picked:
        lanes = [("", connector.base_provider_type, root + connector.path)]
        if connector.anthropic_lane:
            lanes.append((LANE_SUFFIX, "anthropic", root + connector.lane_path))
        for suffix, base_type, base_url in lanes:
            name = f"{org}__{connector.name}__{model}{suffix}"
            keys = [] if connector.key_less else [_key(rng, name, connector.key_prefix, [model])]
            record = ProviderRecord(
                name,
                network_config=_network(base_url, timeout=timeout, retries=retries, headers=headers),
                concurrency_and_buffer_size=None if rng.random() < 0.2 else Concurrency(1000, 5000),
                proxy_config=proxy,
                send_back_raw_request=raw,
                send_back_raw_response=raw,
                store_raw_request_response=store_raw,
                custom_provider_config=CustomProviderConfig(base_provider_type=base_type,
                                                            is_key_less=connector.key_less),
                keys=keys,
            )
            if dead and keys:
                record.status = "list_models_failed"
                record.description = (f'failed to list models: Get "{base_url}/models": dial tcp: '
                                      f"lookup {_host(base_url)}: no such host")
            out.append(record)
    return out


def small_records(*, live_port: int = DEFAULT_LIVE_PORT) -> list[ProviderRecord]:
    """A dozen hand-picked records covering every case the tests need (no randomness)."""
    rng = random.Random(7)
    live = f"http://localhost:{live_port}"
    loop = f"http://127.0.0.1:{live_port}"
    openrouter = CustomProviderConfig(base_provider_type="openai")
    lane = CustomProviderConfig(base_provider_type="anthropic")

    def custom(name: str, base_url: str, cpc: CustomProviderConfig, **kw: Any) -> ProviderRecord:
        pool = kw.pop("pool", Concurrency(1000, 5000))
        record = ProviderRecord(name, network_config=_network(base_url), concurrency_and_buffer_size=pool,
                                custom_provider_config=CustomProviderConfig(**asdict(cpc)), **kw)
        if not record.custom_provider_config or not record.custom_provider_config.is_key_less:
            record.keys = [_key(rng, name, "sk-")]
        return record

    proxy = ProxyConfig(type="http", url=Secret("http://127.0.0.1:3128/orgalpha"), username=Secret("proxyuser"),
                        password=Secret("proxy-password-1234"), ca_cert_pem=Secret(_FAKE_PEM))
    records = [
        ProviderRecord("openai", concurrency_and_buffer_size=Concurrency(1000, 5000),
                       openai_config={"disable_store": True}, keys=[_key(rng, "openai", "sk-proj-")]),
        ProviderRecord("anthropic", keys=[_key(rng, "anthropic", "sk-ant-api03-")]),
        ProviderRecord("openrouter", concurrency_and_buffer_size=Concurrency(512, 8192),
                       keys=[_key(rng, "openrouter", "sk-or-v1-")]),
        custom("orgalpha__openrouter__gpt-4.1-mini", f"{live}/openrouter/api/v1", openrouter, proxy_config=proxy),
        custom("orgalpha__openrouter__gpt-4.1-mini__anthropic", f"{live}/openrouter/api", lane),
        custom("orgalpha__deepseek__deepseek-chat", f"{loop}/deepseek/v1", openrouter,
               send_back_raw_request=True, send_back_raw_response=True),
        custom("orgalpha__deepseek__deepseek-chat__anthropic", f"{loop}/deepseek/anthropic", lane),
        custom("orgbeta__vllm-lan__llama3.1-8b-instruct", "https://vllm-lan.orgbeta.invalid/v1",
               CustomProviderConfig(base_provider_type="openai", is_key_less=True)),
        custom("orgbeta__openrouter__claude-sonnet-4", f"{live}/openrouter/api/v1", openrouter,
               pool=Concurrency(64, 1024)),
        custom("orgbeta__openrouter__claude-sonnet-4__anthropic", f"{live}/openrouter/api", lane),
        custom("orgbeta__together__qwen3-coder", "https://together.orgbeta.invalid/v1", openrouter,
               store_raw_request_response=True),
        ProviderRecord("legacy-lan-gateway", network_config=_network(f"{live}/v1")),
    ]
    records[-2].status = "list_models_failed"
    records[-2].description = ('failed to list models: Get "https://together.orgbeta.invalid/v1/models": '
                               "dial tcp: lookup together.orgbeta.invalid: no such host")
    return records


def build_seed(name: str, *, rng_seed: int | None = None,
               live_port: int | None = None, **realistic: Any) -> tuple[list[ProviderRecord], GlobalConfig]:
    """Records and global config of a named seed (``empty``, ``small``, ``realistic``)."""
    port = DEFAULT_LIVE_PORT if live_port is None else int(live_port)
    if name == "empty":
        return [], GlobalConfig()
    if name == "small":
        return small_records(live_port=port), drifted_config()
    if name == "realistic":
        seed = DEFAULT_RNG_SEED if rng_seed is None else int(rng_seed)
        return realistic_records(rng_seed=seed, live_port=port, **realistic), drifted_config()
    raise ValueError(f"unknown seed {name!r}; one of {', '.join(SEED_NAMES)}")


def apply_seed(emulator: BifrostEmulator, name: str, *, rng_seed: int | None = None,
               live_port: int | None = None, **realistic: Any) -> SeedSummary:
    """Replace the emulator's store with a named seed, as at boot; returns its summary."""
    records, config = build_seed(name, rng_seed=rng_seed, live_port=live_port, **realistic)
    emulator.load(records, config)
    used_seed = (DEFAULT_RNG_SEED if rng_seed is None else int(rng_seed)) if name == "realistic" else None
    return summarize(name, records, used_seed)


def seed_small(emulator: BifrostEmulator, *, live_port: int = DEFAULT_LIVE_PORT) -> SeedSummary:
    """Boot the emulator with the dozen-record store."""
    return apply_seed(emulator, "small", live_port=live_port)


def seed_realistic(emulator: BifrostEmulator, *, orgs: int = 20, connectors: int = 4, models: int = 5,
                   dead_fraction: float = 0.15, rng_seed: int = DEFAULT_RNG_SEED,
                   live_port: int = DEFAULT_LIVE_PORT, include_broken: bool = True) -> SeedSummary:
    """Boot the emulator with the realistic store (see the module docstring)."""
    return apply_seed(emulator, "realistic", rng_seed=rng_seed, live_port=live_port, orgs=orgs,
                      connectors=connectors, models=models, dead_fraction=dead_fraction,
                      include_broken=include_broken)
