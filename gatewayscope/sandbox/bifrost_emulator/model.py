"""The emulated gateway's data: provider records, secrets, and their JSON forms.

Everything here follows docs/sandbox.md, "The emulated management API" (section numbers, §, are its
subsections):

* §1 SecretVar input shapes (bare string, newest object, legacy object) and output shapes, the partial
  and full masks (:func:`redact`, :func:`fully_redact`) and the "looks masked" test used on update;
* §2.1 the ``ProviderResponse`` shape, ``network_config`` (backoffs as integer milliseconds on output,
  int-ms or Go duration strings on input), defaults substituted when a block is unset.

Decoding mirrors Go's ``encoding/json`` strictness where it matters: a value of the wrong type is a
decode error (the handler answers ``Invalid request payload``), ``null`` leaves a value at its zero,
unknown fields are ignored.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from gatewayscope.sandbox.bifrost_emulator._go import (
    MILLISECOND,
    DurationError,
    parse_duration,
)

# --------------------------------------------------------------------------------------------------
# constants of the emulated gateway

#: built-in provider names (a record named like one of these, without custom config, is "standard")
STANDARD_PROVIDERS: frozenset[str] = frozenset({
    "openai", "azure", "anthropic", "bedrock", "cohere", "vertex", "mistral", "ollama", "groq", "sgl",
    "parasail", "perplexity", "cerebras", "gemini", "openrouter", "elevenlabs", "huggingface", "nebius",
    "xai", "replicate", "vllm",
})
#: base types a custom provider may build on (§2.1)
SUPPORTED_BASE_PROVIDERS: frozenset[str] = frozenset({
    "anthropic", "bedrock", "cohere", "gemini", "openai", "huggingface", "replicate",
})

DEFAULT_CONCURRENCY = 1000
DEFAULT_BUFFER_SIZE = 5000

#: the literal ``FullyRedacted`` produces
FULLY_REDACTED = "<REDACTED>"

SECRET_PLAIN = "plain_text"
SECRET_ENV = "env"
SECRET_VAULT = "vault"


class PayloadError(ValueError):
    """The body would not decode into the handler's payload type (Go: a JSON unmarshal error)."""


# --------------------------------------------------------------------------------------------------
# masking (§1)

def redact(value: str) -> str:
    """``Redacted``: empty stays empty; ≤ 8 chars → as many ``*``; longer → first 4 + 24 ``*`` + last 4.

    >>> redact("abc")
    '***'
    >>> redact("sk-0123456789abcdef")
    'sk-0************************cdef'
    """
    if not value:
        return ""
    if len(value) <= 8:
        return "*" * len(value)
    return value[:4] + "*" * 24 + value[-4:]


def fully_redact(value: str) -> str:
    """``FullyRedacted``: any non-empty value becomes ``<REDACTED>``; empty stays empty."""
    return FULLY_REDACTED if value else ""


def looks_masked(value: str) -> bool:
    """True for a value a listing could have produced: all ``*`` (≤ 8), the 4+24``*``+4 pattern,
    ``<redacted>`` or ``[REDACTED]`` (case-insensitive)."""
    if not value:
        return False
    lowered = value.lower()
    if lowered in ("<redacted>", "[redacted]"):
        return True
    if len(value) <= 8 and set(value) == {"*"}:
        return True
    return len(value) == 32 and value[4:28] == "*" * 24


# --------------------------------------------------------------------------------------------------
# SecretVar

@dataclass
class Secret:
    """A stored ``SecretVar``: the value (never resolved from the emulator's environment), its
    ``env.NAME`` / ``vault.path`` reference if any, and its type."""

    value: str = ""
    ref: str | None = None
    type: str = SECRET_PLAIN

    @property
    def is_ref(self) -> bool:
        return self.type in (SECRET_ENV, SECRET_VAULT)

    def render(self, *, fully: bool, legacy_shape: bool) -> dict[str, Any]:
        """The response form: newest ``{value, ref?, type}`` or legacy ``{value, env_var, from_env}``."""
        shown = fully_redact(self.value) if fully else redact(self.value)
        if legacy_shape:
            return {"value": shown, "env_var": self.ref or "", "from_env": self.type == SECRET_ENV}
        out: dict[str, Any] = {"value": shown}
        if self.ref:
            out["ref"] = self.ref
        out["type"] = self.type
        return out


def _ref_type(text: str) -> str | None:
    if text.startswith("env."):
        return SECRET_ENV
    if text.startswith("vault."):
        return SECRET_VAULT
    return None


def decode_secret(raw: Any, where: str) -> Secret | None:
    """Decode any accepted SecretVar input shape; ``None`` for JSON null."""
    if raw is None:
        return None
    if isinstance(raw, str):
        kind = _ref_type(raw)
        if kind:
            return Secret(value="", ref=raw, type=kind)
        return Secret(value=raw)
    if not isinstance(raw, dict):
        raise PayloadError(f"{where}: a secret must be a string or an object")
    value = _str(raw.get("value"), f"{where}.value")
    if "type" in raw or "ref" in raw:  # newest shape
        ref = _str(raw.get("ref"), f"{where}.ref") or None
        kind = _str(raw.get("type"), f"{where}.type") or None
        if kind not in (None, SECRET_PLAIN, SECRET_ENV, SECRET_VAULT):
            raise PayloadError(f"{where}.type: unknown secret type {kind!r}")
        if kind is None:
            kind = _ref_type(ref or "") or SECRET_PLAIN
        if kind != SECRET_PLAIN and not ref and _ref_type(value):
            ref, value = value, ""
        return Secret(value=value, ref=ref if kind != SECRET_PLAIN else None, type=kind)
    if "env_var" in raw or "from_env" in raw:  # legacy shape
        env_var = _str(raw.get("env_var"), f"{where}.env_var")
        from_env = _bool(raw.get("from_env"), f"{where}.from_env")
        if from_env and env_var:
            ref = env_var if env_var.startswith("env.") else f"env.{env_var}"
            return Secret(value=value, ref=ref, type=SECRET_ENV)
        return Secret(value=value)
    kind = _ref_type(value)
    if kind:
        return Secret(value="", ref=value, type=kind)
    return Secret(value=value)


def keep_or_replace(incoming: Secret | None, stored: Secret | None) -> Secret | None:
    """On update: a masked-looking plain value keeps the stored secret (§1, §2.5 table)."""
    if incoming is None:
        return None
    if stored is not None and not incoming.is_ref and looks_masked(incoming.value):
        return copy.deepcopy(stored)
    return incoming


# --------------------------------------------------------------------------------------------------
# blocks

@dataclass
class NetworkConfig:
    """``network_config``; backoffs kept in nanoseconds, rendered as integer milliseconds."""

    base_url: str = ""
    extra_headers: dict[str, str] = field(default_factory=dict)
    default_request_timeout_in_seconds: int = 0
    max_retries: int = 0
    retry_backoff_initial_ns: int = 0
    retry_backoff_max_ns: int = 0
    insecure_skip_verify: bool = False
    ca_cert_pem: str = ""
    stream_idle_timeout_in_seconds: int = 0
    keep_alive_timeout_in_seconds: int = 0
    max_conns_per_host: int = 0
    enforce_http2: bool = False
    beta_header_overrides: dict[str, bool] = field(default_factory=dict)
    allow_private_network: bool = False

    def render(self) -> dict[str, Any]:
        """Field order and omitempty rules of the gateway's marshaller."""
        out: dict[str, Any] = {}
        if self.base_url:
            out["base_url"] = self.base_url
        if self.extra_headers:
            out["extra_headers"] = dict(self.extra_headers)
        out["default_request_timeout_in_seconds"] = self.default_request_timeout_in_seconds
        out["max_retries"] = self.max_retries
        out["retry_backoff_initial"] = self.retry_backoff_initial_ns // MILLISECOND
        out["retry_backoff_max"] = self.retry_backoff_max_ns // MILLISECOND
        if self.insecure_skip_verify:
            out["insecure_skip_verify"] = True
        if self.ca_cert_pem:
            out["ca_cert_pem"] = fully_redact(self.ca_cert_pem)
        if self.stream_idle_timeout_in_seconds:
            out["stream_idle_timeout_in_seconds"] = self.stream_idle_timeout_in_seconds
        if self.keep_alive_timeout_in_seconds:
            out["keep_alive_timeout_in_seconds"] = self.keep_alive_timeout_in_seconds
        if self.max_conns_per_host:
            out["max_conns_per_host"] = self.max_conns_per_host
        if self.enforce_http2:
            out["enforce_http2"] = True
        if self.beta_header_overrides:
            out["beta_header_overrides"] = dict(self.beta_header_overrides)
        if self.allow_private_network:
            out["allow_private_network"] = True
        return out


def default_network_config() -> NetworkConfig:
    """``schemas.DefaultNetworkConfig`` (newest): 300 s, 0 retries, 500 ms / 5000 ms, 120 s, 30 s, 5000."""
    return NetworkConfig(
        default_request_timeout_in_seconds=300,
        max_retries=0,
        retry_backoff_initial_ns=500 * MILLISECOND,
        retry_backoff_max_ns=5000 * MILLISECOND,
        stream_idle_timeout_in_seconds=120,
        keep_alive_timeout_in_seconds=30,
        max_conns_per_host=5000,
    )


@dataclass
class Concurrency:
    """``concurrency_and_buffer_size``."""

    concurrency: int = 0
    buffer_size: int = 0

    def render(self) -> dict[str, int]:
        return {"concurrency": self.concurrency, "buffer_size": self.buffer_size}


@dataclass
class ProxyConfig:
    """``proxy_config``: url/username masked with ``Redacted``, password/CA PEM ``FullyRedacted``."""

    type: str = "none"
    url: Secret | None = None
    username: Secret | None = None
    password: Secret | None = None
    ca_cert_pem: Secret | None = None

    def render(self, *, legacy_shape: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        out["url"] = (self.url or Secret()).render(fully=False, legacy_shape=legacy_shape)
        if self.username is not None:
            out["username"] = self.username.render(fully=False, legacy_shape=legacy_shape)
        if self.password is not None:
            out["password"] = self.password.render(fully=True, legacy_shape=legacy_shape)
        if self.ca_cert_pem is not None:
            out["ca_cert_pem"] = self.ca_cert_pem.render(fully=True, legacy_shape=legacy_shape)
        return out


@dataclass
class CustomProviderConfig:
    """``custom_provider_config``."""

    base_provider_type: str = ""
    is_key_less: bool = False
    allowed_requests: dict[str, bool] | None = None
    request_path_overrides: dict[str, str] | None = None

    def render(self) -> dict[str, Any]:
        out: dict[str, Any] = {"is_key_less": self.is_key_less, "base_provider_type": self.base_provider_type}
        if self.allowed_requests is not None:
            out["allowed_requests"] = dict(self.allowed_requests)
        if self.request_path_overrides:
            out["request_path_overrides"] = dict(self.request_path_overrides)
        return out


@dataclass
class Key:
    """A provider key (kept internally; never part of a provider response since v1.5)."""

    id: str
    name: str
    value: Secret
    models: list[str] = field(default_factory=lambda: ["*"])
    weight: float = 1.0
    enabled: bool = True

    def render(self, *, legacy_shape: bool) -> dict[str, Any]:
        return {
            "id": self.id, "name": self.name,
            "value": self.value.render(fully=False, legacy_shape=legacy_shape),
            "models": list(self.models), "weight": self.weight, "enabled": self.enabled,
        }


@dataclass
class ProviderRecord:
    """One stored provider record (``configstore.ProviderConfig`` plus its name).

    ``network_config`` / ``concurrency_and_buffer_size`` of ``None`` mean "unset" and render as the
    defaults; a zero-valued block (what PUT stores when the block is omitted) renders as zeros.
    """

    name: str
    network_config: NetworkConfig | None = None
    concurrency_and_buffer_size: Concurrency | None = None
    proxy_config: ProxyConfig | None = None
    send_back_raw_request: bool = False
    send_back_raw_response: bool = False
    store_raw_request_response: bool = False
    custom_provider_config: CustomProviderConfig | None = None
    openai_config: dict[str, Any] | None = None
    prompt_cache: Any = None
    status: str = ""
    description: str = ""
    config_hash: str = ""
    keys: list[Key] = field(default_factory=list)

    @property
    def concurrency(self) -> int:
        """Effective worker count (the default when unset)."""
        block = self.concurrency_and_buffer_size
        return DEFAULT_CONCURRENCY if block is None else block.concurrency

    @property
    def buffer_size(self) -> int:
        """Effective queue size (the default when unset)."""
        block = self.concurrency_and_buffer_size
        return DEFAULT_BUFFER_SIZE if block is None else block.buffer_size

    @property
    def kind(self) -> str:
        """``custom`` (has custom config), ``standard`` (built-in name) or ``unknown`` (neither)."""
        if self.custom_provider_config is not None:
            return "custom"
        return "standard" if self.name in STANDARD_PROVIDERS else "unknown"

    @property
    def buildable(self) -> bool:
        """Whether the core can build a provider (and so a worker pool) for this record."""
        cpc = self.custom_provider_config
        if cpc is not None:
            return cpc.base_provider_type in SUPPORTED_BASE_PROVIDERS and self.name not in STANDARD_PROVIDERS
        return self.name in STANDARD_PROVIDERS

    @property
    def base_url(self) -> str:
        return self.network_config.base_url if self.network_config else ""


def render_provider(record: ProviderRecord, provider_status: str, *, legacy_secret_shape: bool) -> dict[str, Any]:
    """``ProviderResponse`` for a stored record, secrets masked, defaults substituted when unset."""
    network = record.network_config if record.network_config is not None else default_network_config()
    block = record.concurrency_and_buffer_size
    concurrency = block if block is not None else Concurrency(DEFAULT_CONCURRENCY, DEFAULT_BUFFER_SIZE)
    out: dict[str, Any] = {
        "name": record.name,
        "network_config": network.render(),
        "concurrency_and_buffer_size": concurrency.render(),
        "proxy_config": (record.proxy_config.render(legacy_shape=legacy_secret_shape)
                         if record.proxy_config is not None else None),
        "send_back_raw_request": record.send_back_raw_request,
        "send_back_raw_response": record.send_back_raw_response,
        "store_raw_request_response": record.store_raw_request_response,
    }
    if record.custom_provider_config is not None:
        out["custom_provider_config"] = record.custom_provider_config.render()
    if record.openai_config is not None:
        out["openai_config"] = copy.deepcopy(record.openai_config)
    if record.prompt_cache is not None:
        out["prompt_cache"] = copy.deepcopy(record.prompt_cache)
    out["provider_status"] = provider_status
    if record.status:
        out["status"] = record.status
    if record.description:
        out["description"] = record.description
    if record.config_hash:
        out["config_hash"] = record.config_hash
    return out


def render_deleted(name: str) -> dict[str, Any]:
    """The newest DELETE answer: a ``ProviderResponse`` carrying only ``name``, every other field zero."""
    return {
        "name": name,
        "network_config": NetworkConfig().render(),
        "concurrency_and_buffer_size": Concurrency().render(),
        "proxy_config": None,
        "send_back_raw_request": False,
        "send_back_raw_response": False,
        "store_raw_request_response": False,
        "provider_status": "",
    }


# --------------------------------------------------------------------------------------------------
# decoding (Go encoding/json look-alike)

def _int(raw: Any, where: str) -> int:
    if raw is None:
        return 0
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise PayloadError(f"{where}: cannot unmarshal {type(raw).__name__} into int")
    return raw


def _bool(raw: Any, where: str) -> bool:
    if raw is None:
        return False
    if not isinstance(raw, bool):
        raise PayloadError(f"{where}: cannot unmarshal {type(raw).__name__} into bool")
    return raw


def _str(raw: Any, where: str) -> str:
    if raw is None:
        return ""
    if not isinstance(raw, str):
        raise PayloadError(f"{where}: cannot unmarshal {type(raw).__name__} into string")
    return raw


def _obj(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise PayloadError(f"{where}: cannot unmarshal {type(raw).__name__} into object")
    return raw


def _str_map(raw: Any, where: str) -> dict[str, str]:
    if raw is None:
        return {}
    return {str(k): _str(v, f"{where}.{k}") for k, v in _obj(raw, where).items()}


def _bool_map(raw: Any, where: str) -> dict[str, bool]:
    if raw is None:
        return {}
    return {str(k): _bool(v, f"{where}.{k}") for k, v in _obj(raw, where).items()}


def _backoff(raw: Any, where: str) -> int:
    """Integer milliseconds or a Go duration string → nanoseconds."""
    if raw is None:
        return 0
    if isinstance(raw, str):
        try:
            return parse_duration(raw)
        except DurationError as err:
            raise PayloadError(f"{where}: {err}") from err
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise PayloadError(f"{where}: cannot unmarshal {type(raw).__name__} into duration")
    return int(raw * MILLISECOND)


def decode_network(raw: Any) -> NetworkConfig:
    """``network_config`` from JSON (``null`` → zero value)."""
    if raw is None:
        return NetworkConfig()
    body = _obj(raw, "network_config")
    w = "network_config."
    return NetworkConfig(
        base_url=_str(body.get("base_url"), w + "base_url"),
        extra_headers=_str_map(body.get("extra_headers"), w + "extra_headers"),
        default_request_timeout_in_seconds=_int(body.get("default_request_timeout_in_seconds"),
                                                w + "default_request_timeout_in_seconds"),
        max_retries=_int(body.get("max_retries"), w + "max_retries"),
        retry_backoff_initial_ns=_backoff(body.get("retry_backoff_initial"), w + "retry_backoff_initial"),
        retry_backoff_max_ns=_backoff(body.get("retry_backoff_max"), w + "retry_backoff_max"),
        insecure_skip_verify=_bool(body.get("insecure_skip_verify"), w + "insecure_skip_verify"),
        ca_cert_pem=_str(body.get("ca_cert_pem"), w + "ca_cert_pem"),
        stream_idle_timeout_in_seconds=_int(body.get("stream_idle_timeout_in_seconds"),
                                            w + "stream_idle_timeout_in_seconds"),
        keep_alive_timeout_in_seconds=_int(body.get("keep_alive_timeout_in_seconds"),
                                           w + "keep_alive_timeout_in_seconds"),
        max_conns_per_host=_int(body.get("max_conns_per_host"), w + "max_conns_per_host"),
        enforce_http2=_bool(body.get("enforce_http2"), w + "enforce_http2"),
        beta_header_overrides=_bool_map(body.get("beta_header_overrides"), w + "beta_header_overrides"),
        allow_private_network=_bool(body.get("allow_private_network"), w + "allow_private_network"),
    )


def decode_concurrency(raw: Any) -> Concurrency:
    """``concurrency_and_buffer_size`` from JSON (``null`` → zeros)."""
    if raw is None:
        return Concurrency()
    body = _obj(raw, "concurrency_and_buffer_size")
    return Concurrency(
        concurrency=_int(body.get("concurrency"), "concurrency_and_buffer_size.concurrency"),
        buffer_size=_int(body.get("buffer_size"), "concurrency_and_buffer_size.buffer_size"),
    )


def decode_proxy(raw: Any) -> ProxyConfig | None:
    """``proxy_config`` from JSON (``null`` → ``None``)."""
    if raw is None:
        return None
    body = _obj(raw, "proxy_config")
    return ProxyConfig(
        type=_str(body.get("type"), "proxy_config.type") or "none",
        url=decode_secret(body.get("url"), "proxy_config.url"),
        username=decode_secret(body.get("username"), "proxy_config.username"),
        password=decode_secret(body.get("password"), "proxy_config.password"),
        ca_cert_pem=decode_secret(body.get("ca_cert_pem"), "proxy_config.ca_cert_pem"),
    )


def decode_custom(raw: Any) -> CustomProviderConfig | None:
    """``custom_provider_config`` from JSON (``null`` → ``None``)."""
    if raw is None:
        return None
    body = _obj(raw, "custom_provider_config")
    allowed = body.get("allowed_requests")
    overrides = body.get("request_path_overrides")
    return CustomProviderConfig(
        base_provider_type=_str(body.get("base_provider_type"), "custom_provider_config.base_provider_type"),
        is_key_less=_bool(body.get("is_key_less"), "custom_provider_config.is_key_less"),
        allowed_requests=None if allowed is None else _bool_map(allowed, "custom_provider_config.allowed_requests"),
        request_path_overrides=(None if overrides is None
                                else _str_map(overrides, "custom_provider_config.request_path_overrides")),
    )


def decode_openai(raw: Any) -> dict[str, Any] | None:
    """``openai_config`` from JSON (``null`` → ``None``)."""
    if raw is None:
        return None
    body = _obj(raw, "openai_config")
    return {"disable_store": _bool(body.get("disable_store"), "openai_config.disable_store")}


def decode_prompt_cache(raw: Any) -> Any:
    """``prompt_cache``: schema not researched, so any JSON object is stored as sent."""
    if raw is None:
        return None
    return copy.deepcopy(_obj(raw, "prompt_cache"))


@dataclass
class ProviderPayload:
    """A decoded POST/PUT body plus which top-level fields it carried (``present``).

    A field present with JSON ``null`` decodes to ``None``/zero but is still in ``present``; that is how
    "explicit null clears" is told apart from "absent keeps".
    """

    present: frozenset[str]
    provider: str = ""
    network_config: NetworkConfig | None = None
    concurrency_and_buffer_size: Concurrency | None = None
    proxy_config: ProxyConfig | None = None
    send_back_raw_request: bool | None = None
    send_back_raw_response: bool | None = None
    store_raw_request_response: bool | None = None
    custom_provider_config: CustomProviderConfig | None = None
    openai_config: dict[str, Any] | None = None
    prompt_cache: Any = None
    keys: Any = None

    def has(self, name: str) -> bool:
        return name in self.present


def decode_provider_payload(body: Any) -> ProviderPayload:
    """Decode a POST/PUT provider body; raises :class:`PayloadError` like Go's unmarshal would."""
    obj = _obj(body, "body")

    def opt_bool(name: str) -> bool | None:
        return None if obj.get(name) is None else _bool(obj[name], name)

    return ProviderPayload(
        present=frozenset(obj.keys()),
        provider=_str(obj.get("provider"), "provider"),
        network_config=None if obj.get("network_config") is None else decode_network(obj["network_config"]),
        concurrency_and_buffer_size=(None if obj.get("concurrency_and_buffer_size") is None
                                     else decode_concurrency(obj["concurrency_and_buffer_size"])),
        proxy_config=decode_proxy(obj.get("proxy_config")),
        send_back_raw_request=opt_bool("send_back_raw_request"),
        send_back_raw_response=opt_bool("send_back_raw_response"),
        store_raw_request_response=opt_bool("store_raw_request_response"),
        custom_provider_config=decode_custom(obj.get("custom_provider_config")),
        openai_config=decode_openai(obj.get("openai_config")),
        prompt_cache=decode_prompt_cache(obj.get("prompt_cache")),
        keys=obj.get("keys"),
    )
