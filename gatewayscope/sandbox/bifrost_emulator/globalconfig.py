"""``GET/PUT /api/config`` of the emulated gateway (§4) and its admin auth (§5).

Section numbers (§) refer to docs/sandbox.md, "The emulated management API".

PUT copies every ``client_config`` field from the body, so a field the body leaves out falls back to
its *zero value* (false, 0, "", null), not to the stored value: clients must read-modify-write the full
``client_config``. ``log_retention_days < 1`` is refused, so a body without ``client_config`` fails.
"""

from __future__ import annotations

import copy
import string
from dataclasses import dataclass, field
from typing import Any

from gatewayscope.sandbox.bifrost_emulator.model import looks_masked

#: client_config as the gateway ships it (newest ``framework/configstore/clientconfig.go``)
DEFAULT_CLIENT_CONFIG: dict[str, Any] = {
    "drop_excess_requests": False,
    "initial_pool_size": 300,
    "prometheus_labels": [],
    "enable_logging": True,
    "disable_content_logging": False,
    "retain_content_in_object_storage": False,
    "allow_per_request_content_storage_override": False,
    "allow_per_request_raw_override": False,
    "allow_direct_keys": False,
    "disable_db_pings_in_health": False,
    "log_retention_days": 365,
    "enforce_auth_on_inference": False,
    "dual_credential_conflict_behavior": "",
    "enforce_governance_header": False,
    "enforce_scim_auth": False,
    "allowed_origins": [],
    "allowed_headers": [],
    "max_request_body_size_mb": 100,
    "compat": {
        "convert_text_to_chat": True,
        "convert_chat_to_responses": True,
        "should_drop_params": True,
        "should_convert_params": True,
    },
    "mcp_agent_depth": 10,
    "mcp_tool_execution_timeout": 30,
    "mcp_code_mode_binding_level": "server",
    "mcp_tool_sync_interval": 0,
    "mcp_disable_auto_tool_inject": False,
    "mcp_enable_temp_token_auth": False,
    "header_filter_config": None,
    "async_job_result_ttl": 3600,
    "required_headers": [],
    "logging_headers": [],
    "whitelisted_routes": [],
    "hide_deleted_virtual_keys_in_filters": False,
    "routing_chain_max_depth": 10,
    "mcp_external_client_url": "",
    "mcp_server_auth_mode": "",
    "oauth2_server_config": None,
    "dump_errors_in_console_logs": False,
    "webhook_config": None,
}

#: fields whose change older builds record in ``restart_required``
RESTART_FIELDS = ("prometheus_labels", "allowed_origins", "initial_pool_size", "enable_logging",
                  "disable_content_logging", "max_request_body_size_mb")

DEFAULT_FRAMEWORK_CONFIG: dict[str, Any] = {
    "pricing_url": "https://getbifrost.ai/datasheet",
    "pricing_sync_interval": 86400,
}

_SPECIAL = set(string.punctuation)


class ConfigRefused(Exception):
    """A PUT /api/config refused with 400; ``str(err)`` is the exact message."""


def zero_of(value: Any) -> Any:
    """The Go zero value for a field whose default is ``value`` (slices and pointers → null)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return 0
    if isinstance(value, float):
        return 0.0
    if isinstance(value, str):
        return ""
    if isinstance(value, dict):
        return {k: zero_of(v) for k, v in value.items()}
    return None


@dataclass
class AuthConfig:
    """The admin account; the password is held in clear inside the emulator (the gateway hashes it)."""

    admin_username: str = ""
    admin_password: str = ""
    is_enabled: bool = False
    disable_auth_on_inference: bool = False

    def render(self) -> dict[str, Any]:
        return {
            "admin_username": self.admin_username,
            "admin_password": "<redacted>" if self.admin_password else "",
            "is_enabled": self.is_enabled,
            "disable_auth_on_inference": self.disable_auth_on_inference,
        }


@dataclass
class GlobalConfig:
    """client_config, framework_config and auth_config, plus the restart reasons PUTs accumulated."""

    client_config: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(DEFAULT_CLIENT_CONFIG))
    framework_config: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(DEFAULT_FRAMEWORK_CONFIG))
    auth: AuthConfig = field(default_factory=AuthConfig)
    restart_reasons: list[str] = field(default_factory=list)

    def render(self) -> dict[str, Any]:
        return {
            "client_config": copy.deepcopy(self.client_config),
            "framework_config": copy.deepcopy(self.framework_config),
            "auth_config": self.auth.render(),
            "is_db_connected": True,
            "is_cache_connected": False,
            "is_logs_connected": True,
            "proxy_config": None,
            "restart_required": {"required": bool(self.restart_reasons),
                                 "reason": ", ".join(self.restart_reasons)},
        }


def _secret_text(raw: Any) -> str:
    """admin_username / admin_password arrive as a bare string or a SecretVar object."""
    if raw is None:
        return ""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, dict) and isinstance(raw.get("value", ""), str):
        return str(raw.get("value") or "")
    raise ConfigRefused("Invalid request payload")


def password_policy_failures(password: str) -> list[str]:
    """What an admin password lacks (newest policy: ≥12 chars, upper, lower, digit, special)."""
    failures = []
    if len(password) < 12:
        failures.append("at least 12 characters")
    if not any(c.isupper() for c in password):
        failures.append("one uppercase letter")
    if not any(c.islower() for c in password):
        failures.append("one lowercase letter")
    if not any(c.isdigit() for c in password):
        failures.append("one digit")
    if not any(c in _SPECIAL for c in password):
        failures.append("one special character")
    return failures


def apply_config_update(current: GlobalConfig, body: Any) -> GlobalConfig:
    """The new global config a PUT /api/config body produces; raises :class:`ConfigRefused` (400)."""
    if not isinstance(body, dict):
        raise ConfigRefused("Invalid request payload")
    raw_client = body.get("client_config") or {}
    if not isinstance(raw_client, dict):
        raise ConfigRefused("Invalid request payload")
    client = {name: copy.deepcopy(raw_client[name]) if name in raw_client else zero_of(default)
              for name, default in DEFAULT_CLIENT_CONFIG.items()}
    for name, value in raw_client.items():  # fields this emulator does not list are kept as sent
        client.setdefault(name, copy.deepcopy(value))
    _check_types(client)

    old = current.client_config
    if client["log_retention_days"] < 1:
        raise ConfigRefused("log_retention_days must be at least 1")
    level = client["mcp_code_mode_binding_level"]
    if level and level not in ("server", "tool"):
        raise ConfigRefused("mcp_code_mode_binding_level must be 'server' or 'tool'")
    if client["mcp_agent_depth"] != old.get("mcp_agent_depth") and client["mcp_agent_depth"] <= 0:
        raise ConfigRefused("mcp_agent_depth must be greater than 0")
    if (client["mcp_tool_execution_timeout"] != old.get("mcp_tool_execution_timeout")
            and client["mcp_tool_execution_timeout"] <= 0):
        raise ConfigRefused("mcp_tool_execution_timeout must be greater than 0")
    if not level:
        client["mcp_code_mode_binding_level"] = old.get("mcp_code_mode_binding_level", "server")

    framework = copy.deepcopy(current.framework_config)
    raw_framework = body.get("framework_config")
    if raw_framework is not None:
        if not isinstance(raw_framework, dict):
            raise ConfigRefused("Invalid request payload")
        interval = raw_framework.get("pricing_sync_interval")
        if interval is not None and (not isinstance(interval, int) or isinstance(interval, bool)
                                     or interval <= 0):
            raise ConfigRefused("pricing sync interval must be greater than 0")
        framework.update({k: copy.deepcopy(v) for k, v in raw_framework.items() if v is not None})

    auth = copy.deepcopy(current.auth)
    raw_auth = body.get("auth_config")
    if raw_auth is not None:
        auth = _apply_auth(current.auth, raw_auth, client, raw_client)

    reasons = list(current.restart_reasons)
    for name in RESTART_FIELDS:
        if client.get(name) != old.get(name) and name not in reasons:
            reasons.append(name)
    return GlobalConfig(client_config=client, framework_config=framework, auth=auth, restart_reasons=reasons)


def _check_types(client: dict[str, Any]) -> None:
    for name, default in DEFAULT_CLIENT_CONFIG.items():
        value = client.get(name)
        if value is None:
            continue
        ok = True
        if isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, int):
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif isinstance(default, str):
            ok = isinstance(value, str)
        elif isinstance(default, list):
            ok = isinstance(value, list)
        if not ok:
            raise ConfigRefused("Invalid request payload")
    for name in ("log_retention_days", "mcp_agent_depth", "mcp_tool_execution_timeout"):
        if client.get(name) is None:
            client[name] = 0
    if client.get("mcp_code_mode_binding_level") is None:
        client["mcp_code_mode_binding_level"] = ""


def _apply_auth(current: AuthConfig, raw: Any, client: dict[str, Any], raw_client: dict[str, Any]) -> AuthConfig:
    if not isinstance(raw, dict):
        raise ConfigRefused("Invalid request payload")
    username = _secret_text(raw.get("admin_username")) or current.admin_username
    sent_password = _secret_text(raw.get("admin_password"))
    keep_password = not sent_password or looks_masked(sent_password)
    password = current.admin_password if keep_password else sent_password
    enabled = raw.get("is_enabled")
    is_enabled = current.is_enabled if enabled is None else bool(enabled)
    if is_enabled and (not username or not password):
        raise ConfigRefused("username and password are required when auth is enabled")
    if not keep_password:
        failures = password_policy_failures(password)
        if failures:
            raise ConfigRefused("auth password must include " + ", ".join(failures))
    first_admin = is_enabled and not current.admin_password
    if first_admin and "enforce_auth_on_inference" not in raw_client:
        client["enforce_auth_on_inference"] = True
    disable_inf = raw.get("disable_auth_on_inference")
    return AuthConfig(
        admin_username=username,
        admin_password=password,
        is_enabled=is_enabled,
        disable_auth_on_inference=(current.disable_auth_on_inference if disable_inf is None
                                   else bool(disable_inf)),
    )
