"""The management routes of the emulated gateway, case by case.

Each handler takes the decoded path parameter and the raw body and returns a :class:`Reply`; the HTTP
layer (``server.py``) adds auth, faults and the request log around it. Section numbers (§) refer to
docs/sandbox.md, "The emulated management API".
"""

from __future__ import annotations

import base64
import binascii
import copy
import hmac
import ipaddress
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from gatewayscope.sandbox.bifrost_emulator import _go
from gatewayscope.sandbox.bifrost_emulator.globalconfig import ConfigRefused, apply_config_update
from gatewayscope.sandbox.bifrost_emulator.model import (
    STANDARD_PROVIDERS,
    SUPPORTED_BASE_PROVIDERS,
    Concurrency,
    CustomProviderConfig,
    NetworkConfig,
    PayloadError,
    ProviderPayload,
    ProviderRecord,
    ProxyConfig,
    decode_provider_payload,
    keep_or_replace,
    looks_masked,
    render_deleted,
    render_provider,
)
from gatewayscope.sandbox.bifrost_emulator.state import EmulatorState

if TYPE_CHECKING:
    from gatewayscope.sandbox.bifrost_emulator.server import EmulatorOptions

MIN_RETRY_BACKOFF_NS = 100 * _go.MILLISECOND
MAX_RETRY_BACKOFF_NS = 1000 * _go.SECOND  # 16m40s

_PRIVATE_NETWORKS = tuple(ipaddress.ip_network(n) for n in
                          ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"))

UNSUPPORTED_PUT_TEXT = ("Failed to update provider: failed to update provider: "
                        "failed to create provider for the given key: unsupported provider: {name}")
KEYS_ON_PUT_TEXT = ("keys are not accepted on this endpoint; use POST/PUT "
                    "/api/providers/{provider}/keys[/{key_id}] to manage keys")


@dataclass
class Reply:
    """One HTTP answer."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)

    def json(self) -> Any:
        return json.loads(self.body)


def dumps(obj: Any) -> bytes:
    """Compact JSON like Go's encoder (non-ASCII kept as UTF-8)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def json_reply(obj: Any, status: int = 200, headers: list[tuple[str, str]] | None = None) -> Reply:
    return Reply(status, dumps(obj), headers=list(headers or []))


def error_envelope(status: int, message: str) -> dict[str, Any]:
    """The shape every management error has (``SendError``)."""
    return {"is_bifrost_error": False, "status_code": status, "error": {"message": message}, "extra_fields": {}}


def error_reply(status: int, message: str) -> Reply:
    return json_reply(error_envelope(status, message), status)


class Refused(Exception):
    """A handler's early exit with an error answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def reply(self) -> Reply:
        return error_reply(self.status, self.message)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid character '{name[0]}' looking for beginning of value")


def parse_json(body: bytes) -> Any:
    """Decode a request body strictly (no NaN/Infinity, UTF-8 only); ValueError on failure."""
    if not body.strip():
        raise ValueError("unexpected end of JSON input")
    return json.loads(body.decode("utf-8"), parse_constant=_reject_constant)


def host_of(raw_url: str) -> tuple[str, str]:
    """(scheme lower-cased, hostname as written) of a URL, like Go's ``url.Parse`` + ``Hostname()``."""
    parts = urlsplit(raw_url)
    _ = parts.port  # raises ValueError on a port that is not a number in range, as Go's url.Parse refuses it
    netloc = parts.netloc.rsplit("@", 1)[-1]
    if netloc.startswith("["):
        host = netloc[1:].split("]", 1)[0]
    else:
        host = netloc.rsplit(":", 1)[0] if ":" in netloc else netloc
    return parts.scheme.lower(), host


def validate_external_url(raw_url: str, *, allow_private_network: bool, timeout: float,
                          resolver: _go.Resolver | None) -> str | None:
    """``core.ValidateExternalURL`` (§2.8); returns the refusal reason or None when the URL is allowed."""
    try:
        scheme, host = host_of(raw_url)
    except ValueError as err:
        return f"invalid URL: {err}"
    if scheme not in ("http", "https"):
        return f"only https and http schemes are allowed, got: {scheme}"
    if not host:
        return "URL must have a hostname"
    try:
        addresses = _go.lookup_ip(host, timeout=timeout, resolver=resolver)
    except _go.LookupError_ as err:
        return f"failed to resolve hostname: {err}"
    for text in addresses:
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            continue
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if address.is_loopback:
            continue
        if address.is_unspecified:
            return "unspecified IP addresses are not allowed"
        if address.is_link_local:
            return "link-local IP addresses are not allowed"
        if any(address in net for net in _PRIVATE_NETWORKS) and not allow_private_network:
            return "private IP addresses are not allowed"
    return None


def validate_retry_backoff(network: NetworkConfig) -> str | None:
    """Backoff bounds (§2.4 step 5): 0 means unset and is skipped; negatives are not checked."""
    limits = (("initial", network.retry_backoff_initial_ns), ("max", network.retry_backoff_max_ns))
    for label, value in limits:
        if value > 0 and value < MIN_RETRY_BACKOFF_NS:
            return f"retry backoff {label} must be at least {_go.format_duration(MIN_RETRY_BACKOFF_NS)}"
        if value > MAX_RETRY_BACKOFF_NS:
            return f"retry backoff {label} must be at most {_go.format_duration(MAX_RETRY_BACKOFF_NS)}"
    initial, maximum = network.retry_backoff_initial_ns, network.retry_backoff_max_ns
    if initial > 0 and maximum > 0 and initial > maximum:
        return "retry backoff initial must be less than or equal to retry backoff max"
    return None


def concurrency_refusal(block: Concurrency) -> str | None:
    """§2.4 step 4 (and §2.5 step 3): only == 0 is checked, not negatives."""
    if block.concurrency == 0:
        return "Concurrency must be greater than 0"
    if block.buffer_size == 0:
        return "Buffer size must be greater than 0"
    if block.concurrency > block.buffer_size:
        return "Concurrency must be less than or equal to buffer size"
    return None


def validate_custom_provider(cpc: CustomProviderConfig | None, name: str) -> str | None:
    """``ValidateCustomProvider`` (run when a record gains a custom config)."""
    if cpc is None:
        return None
    if name in STANDARD_PROVIDERS:
        return f"custom provider validation failed: cannot be created on standard providers: {name}"
    if not cpc.base_provider_type:
        return "custom provider validation failed: base_provider_type is required"
    if cpc.base_provider_type not in SUPPORTED_BASE_PROVIDERS:
        return f"custom provider validation failed: unsupported base_provider_type: {cpc.base_provider_type}"
    return None


def validate_custom_update(new: CustomProviderConfig | None, stored: CustomProviderConfig | None,
                           name: str) -> str | None:
    """``ValidateCustomProviderUpdate`` (§2.5 step 4): the block is immutable once set."""
    if new is None and stored is None:
        return None
    if new is None:
        return f"custom_provider_config cannot be removed after creation for provider {name}"
    if stored is None:
        return validate_custom_provider(new, name)
    if new.base_provider_type != stored.base_provider_type:
        return (f"provider {name}: base_provider_type cannot be changed from "
                f"{stored.base_provider_type} to {new.base_provider_type} after creation")
    return None


def merge_proxy(incoming: ProxyConfig | None, stored: ProxyConfig | None) -> ProxyConfig | None:
    """A present ``proxy_config`` replaces the stored one, except masked secrets keep the stored ones."""
    if incoming is None:
        return None
    merged = copy.deepcopy(incoming)
    merged.url = keep_or_replace(incoming.url, stored.url if stored else None)
    merged.username = keep_or_replace(incoming.username, stored.username if stored else None)
    merged.password = keep_or_replace(incoming.password, stored.password if stored else None)
    merged.ca_cert_pem = keep_or_replace(incoming.ca_cert_pem, stored.ca_cert_pem if stored else None)
    return merged


def apply_update(current: ProviderRecord, payload: ProviderPayload, *, legacy_clear: bool = False) -> ProviderRecord:
    """The record a PUT stores (§2.5 table, newest ``applyProviderConfigUpdates``)."""
    new = copy.deepcopy(current)
    network = copy.deepcopy(payload.network_config) if payload.network_config is not None else NetworkConfig()
    old_network = current.network_config
    if (old_network is not None and old_network.ca_cert_pem and network.ca_cert_pem
            and looks_masked(network.ca_cert_pem)):
        network.ca_cert_pem = old_network.ca_cert_pem
    new.network_config = network
    new.concurrency_and_buffer_size = copy.deepcopy(payload.concurrency_and_buffer_size) or Concurrency()
    if legacy_clear or payload.has("proxy_config"):
        new.proxy_config = merge_proxy(payload.proxy_config, current.proxy_config)
    if legacy_clear or payload.has("custom_provider_config"):
        new.custom_provider_config = copy.deepcopy(payload.custom_provider_config)
    if payload.has("openai_config"):
        new.openai_config = copy.deepcopy(payload.openai_config)
    if payload.has("prompt_cache"):
        new.prompt_cache = copy.deepcopy(payload.prompt_cache)
    if payload.store_raw_request_response is not None:
        new.store_raw_request_response = payload.store_raw_request_response
    new.send_back_raw_request = bool(payload.send_back_raw_request)
    new.send_back_raw_response = bool(payload.send_back_raw_response)
    return new


class ManagementAPI:
    """The route handlers over one :class:`EmulatorState`."""

    def __init__(self, state: EmulatorState, options: EmulatorOptions, sleep: Callable[[float], None]) -> None:
        self.state = state
        self.options = options
        self._sleep = sleep

    # -- helpers ---------------------------------------------------------------------------------

    def _render(self, record: ProviderRecord, status: str) -> dict[str, Any]:
        return render_provider(record, status, legacy_secret_shape=self.options.legacy_secret_shape)

    def _decode(self, body: bytes) -> ProviderPayload:
        try:
            payload = decode_provider_payload(parse_json(body))
            if payload.keys is not None and not isinstance(payload.keys, list):
                raise PayloadError("keys: cannot unmarshal into []Key")
            return payload
        except (ValueError, PayloadError) as err:
            message = f"Invalid JSON: {err}" if self.options.legacy_invalid_json_message else "Invalid request payload"
            raise Refused(400, message) from err

    def _check_network(self, network: NetworkConfig) -> None:
        reason = validate_retry_backoff(network)
        if reason:
            raise Refused(400, f"Invalid retry backoff: {reason}")
        if network.base_url:
            reason = validate_external_url(network.base_url, allow_private_network=network.allow_private_network,
                                           timeout=self.options.dns_timeout, resolver=self.options.resolver)
            if reason:
                raise Refused(400, f"Invalid base URL: {reason}")

    def _discover_models(self, record: ProviderRecord) -> None:
        """§2.9: the bounded upstream model listing after a write (emulated as a wait)."""
        delay = min(self.options.model_discovery_delay, self.options.model_discovery_timeout)
        if delay <= 0:
            return
        keyless = record.custom_provider_config is not None and record.custom_provider_config.is_key_less
        if keyless or any(k.enabled for k in record.keys):
            self._sleep(delay)

    # -- providers -------------------------------------------------------------------------------

    def list_providers(self) -> Reply:
        """§2.2: every record, redacted, sorted by name, with its pool status."""
        with self.state.lock:
            rows = [self._render(self.state.records[name], self.state.provider_status(name))
                    for name in sorted(self.state.records)]
        return json_reply({"providers": rows, "total": len(rows)})

    def get_provider(self, name: str) -> Reply:
        """§2.3: one record, as its row of the listing; 404 when unknown."""
        with self.state.lock:
            record = self.state.records.get(name)
            if record is None:
                return error_reply(404, "Provider not found: not found")
            return json_reply(self._render(record, self.state.provider_status(name)))

    def create_provider(self, body: bytes) -> Reply | None:
        """§2.4 ``POST /api/providers``, checks in the gateway's order (steps 1-7)."""
        try:
            payload = self._decode(body)
            name = payload.provider
            if not name:
                raise Refused(400, "Missing provider")
            cpc = payload.custom_provider_config
            if cpc is not None:
                if name in STANDARD_PROVIDERS:
                    raise Refused(400, "Custom provider cannot be same as a standard provider")
                if not cpc.base_provider_type:
                    raise Refused(400, "BaseProviderType is required when CustomProviderConfig is provided")
                if cpc.base_provider_type not in SUPPORTED_BASE_PROVIDERS:
                    raise Refused(400, "BaseProviderType must be a standard provider")
            if payload.concurrency_and_buffer_size is not None:
                reason = concurrency_refusal(payload.concurrency_and_buffer_size)
                if reason:
                    raise Refused(400, reason)
            if payload.network_config is not None:
                self._check_network(payload.network_config)
            with self.state.lock:
                if name in self.state.records:
                    raise Refused(409, f"Provider {name} already exists")
                reason = validate_custom_provider(cpc, name)
                if reason:
                    raise Refused(400, f"Invalid custom provider config: {reason}")
                record = ProviderRecord(
                    name=name,
                    network_config=copy.deepcopy(payload.network_config),
                    concurrency_and_buffer_size=copy.deepcopy(payload.concurrency_and_buffer_size),
                    proxy_config=copy.deepcopy(payload.proxy_config),
                    send_back_raw_request=bool(payload.send_back_raw_request),
                    send_back_raw_response=bool(payload.send_back_raw_response),
                    store_raw_request_response=bool(payload.store_raw_request_response),
                    custom_provider_config=copy.deepcopy(cpc),
                    openai_config=copy.deepcopy(payload.openai_config),
                    prompt_cache=copy.deepcopy(payload.prompt_cache),
                )
                self.state.store_record(record, restart=True)
                stored = copy.deepcopy(record)
                alive = self.state.check_memory(f"POST /api/providers ({name})")
        except Refused as refused:
            return refused.reply()
        if not alive:  # §7: the new pool took the process over its memory limit; it is killed mid-request
            return None
        self._discover_models(stored)
        return json_reply(self._render(stored, "active"))

    def update_provider(self, name: str, body: bytes) -> Reply | None:
        """§2.5 ``PUT /api/providers/{provider}``: an upsert, steps 1-9.

        Step 7 restarts the record's pool (§3): with ``update_overlap`` the new pool starts while the old one
        still runs, for ``update_overlap_seconds``; otherwise the old one retires first. A process that the
        new pool takes over its memory limit is killed (§7): the record is stored, the answer never comes.
        """
        try:
            payload = self._decode(body)
            if payload.keys and self.options.put_keys_policy == "reject":
                raise Refused(400, KEYS_ON_PUT_TEXT)
            reason = concurrency_refusal(payload.concurrency_and_buffer_size or Concurrency())
            if reason:
                raise Refused(400, reason)
            stored = self.state.get_record(name)
            reason = validate_custom_update(payload.custom_provider_config,
                                            stored.custom_provider_config if stored else None, name)
            if reason:
                raise Refused(400, f"Invalid custom provider config: {reason}")
            self._check_network(payload.network_config or NetworkConfig())
            with self.state.lock:  # steps 6-7: add first when missing, then store + UpdateProvider
                current = self.state.records.get(name) or ProviderRecord(name=name)
                record = apply_update(current, payload, legacy_clear=self.options.legacy_put_clears_blocks)
                old_workers = self.state.previous_workers(name)
                built = self.state.store_record(record, restart=True)
                overlap = old_workers if built and self.options.update_overlap else 0
                self.state.begin_overlap(name, overlap)
                alive = self.state.check_memory(f"PUT /api/providers/{name}")
                result = copy.deepcopy(record)
        except Refused as refused:
            return refused.reply()
        if not alive:
            return None
        if overlap:
            self._sleep(self.options.update_overlap_seconds)
            self.state.end_overlap(name, overlap)
        if not built:
            return error_reply(500, UNSUPPORTED_PUT_TEXT.format(name=name))
        self._discover_models(result)
        return json_reply(self._render(result, "active"))

    def delete_provider(self, name: str) -> Reply:
        """§2.6: newest answers 200 with a name-only zero response, known name or not."""
        existed = self.state.remove_record(name)
        if not existed and self.options.legacy_delete_404:
            return error_reply(404, "Provider not found: not found")
        return json_reply(render_deleted(name))

    def list_keys(self, name: str) -> Reply:
        """§2.7 ``GET /api/providers/{p}/keys`` (read-only in the emulator)."""
        with self.state.lock:
            record = self.state.records.get(name)
            if record is None:
                return error_reply(404, "Provider not found: not found")
            keys = [k.render(legacy_shape=self.options.legacy_secret_shape) for k in record.keys]
        return json_reply({"keys": keys, "total": len(keys)})

    # -- global config ---------------------------------------------------------------------------

    def get_config(self) -> Reply:
        """§4 ``GET /api/config``."""
        with self.state.lock:
            return json_reply(self.state.config.render())

    def put_config(self, body: bytes) -> Reply:
        """§4 ``PUT /api/config``: full read-modify-write of client_config expected."""
        try:
            parsed = parse_json(body)
        except ValueError:
            return error_reply(400, "Invalid request payload")
        with self.state.lock:
            try:
                updated = apply_config_update(self.state.config, parsed)
            except ConfigRefused as err:
                return error_reply(400, str(err))
            if not updated.auth.is_enabled or updated.auth.admin_password != self.state.config.auth.admin_password:
                self.state.sessions.clear()
            self.state.config = updated
            return json_reply({"status": "success", "message": "configuration updated successfully"})

    # -- sessions (§5) ---------------------------------------------------------------------------

    def check_auth(self, headers: dict[str, str]) -> bool:
        """Whether a request may pass the auth middleware (always, when auth is off)."""
        with self.state.lock:
            auth = self.state.config.auth
            if not auth.is_enabled:
                return True
            user, password, sessions = auth.admin_username, auth.admin_password, set(self.state.sessions)
        header = headers.get("authorization", "")
        scheme, _, credential = header.partition(" ")
        credential = credential.strip()
        if scheme.lower() in ("basic", "bearer") and credential:
            if scheme.lower() == "bearer" and credential in sessions:
                return True
            try:
                decoded = base64.b64decode(credential, validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                decoded = ""
            sent_user, sep, sent_password = decoded.partition(":")
            if sep and hmac.compare_digest(sent_user, user) and hmac.compare_digest(sent_password, password):
                return True
        token = _cookie(headers.get("cookie", ""), "token")
        return bool(token) and token in sessions

    def login(self, body: bytes) -> Reply:
        try:
            parsed = parse_json(body)
        except ValueError:
            return error_reply(400, "Invalid request payload")
        if not isinstance(parsed, dict):
            return error_reply(400, "Invalid request payload")
        with self.state.lock:
            auth = self.state.config.auth
            if not auth.is_enabled:
                return error_reply(403, "Authentication is not enabled")
            ok = (hmac.compare_digest(str(parsed.get("username", "")), auth.admin_username)
                  and hmac.compare_digest(str(parsed.get("password", "")), auth.admin_password))
            if not ok:
                return error_reply(401, "Invalid username or password")
            token = str(uuid.uuid4())
            self.state.sessions.add(token)
        cookie = f"token={token}; Path=/; Max-Age=2592000; HttpOnly; SameSite=Lax"
        return json_reply({"message": "Login successful"}, headers=[("Set-Cookie", cookie)])

    def logout(self, headers: dict[str, str]) -> Reply:
        token = _cookie(headers.get("cookie", ""), "token")
        bearer = headers.get("authorization", "")
        if bearer.lower().startswith("bearer "):
            token = token or bearer[7:].strip()
        with self.state.lock:
            self.state.sessions.discard(token)
        return json_reply({"message": "Logout successful"},
                          headers=[("Set-Cookie", "token=; Path=/; Max-Age=0; HttpOnly; SameSite=Lax")])

    def is_auth_enabled(self, headers: dict[str, str]) -> Reply:
        with self.state.lock:
            auth = self.state.config.auth
            enforced = bool(self.state.config.client_config.get("enforce_auth_on_inference"))
            enabled = auth.is_enabled
        valid = enabled and self.check_auth(headers)
        return json_reply({"is_auth_enabled": enabled, "has_valid_token": valid,
                           "auth_type": "password" if enabled else "none",
                           "inference_auth_enforced": enforced})


def _cookie(header: str, name: str) -> str:
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return ""
