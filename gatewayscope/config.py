"""Targets and policy from a TOML file, flags and env, validated with one clear line per problem.

The file::

    [[targets]]
    name = "rl-gateway"
    kind = "rllm"                        # "rllm" (REST or SQLite) or "bifrost"
    url = "http://127.0.0.1:9090"        # or: path = "/srv/rllm/gateway_traces.db"
    timeout_seconds = 10                 # bounds each whole request: connect, send, the whole answer
    max_body_bytes = 536870912           # the largest answer read (default 512 MiB)

    [[targets]]
    name = "bifrost"
    kind = "bifrost"
    url = "http://127.0.0.1:8080"
    memory_limit_bytes = 536870912
    metrics_url = "http://127.0.0.1:8080/metrics"   # optional; default: the management API's /metrics
    read_metrics = true                  # false: never read it (the boot estimate falls back to the band)
    [targets.kubernetes]                 # optional: the gateway's pod, for the mixin's limit join
    namespace = "llm"
    pod = "bifrost-0"
    container = "bifrost"
    [targets.auth]
    username_env = "BIFROST_ADMIN_USER"   # or username = "admin", or username_file = "/run/secrets/bifrost-user"
    password_env = "BIFROST_ADMIN_PASSWORD"   # or password_file = "/run/secrets/bifrost"

    [policy]
    orphan_idle_seconds = 7200
    max_weight_lag = 2
    standard_pool = 512
    custom_pool = 64
    queue_per_worker = 16
    env_file = "/srv/platform/.env"      # optional: the platform's pool overrides

A password never comes from the command line or the file itself: only from an env var or a file
named in the config, read when a source needs it, and never printed. A file key may name a file of
systemd's credentials folder as ``$CREDENTIALS_DIRECTORY/NAME`` (see :func:`credential_path`).
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gatewayscope._files import MAX_CONFIG_BYTES, read_text
from gatewayscope.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

KINDS = ("rllm", "bifrost")
DEFAULT_TIMEOUT_SECONDS = 10.0
DEFAULT_MEMORY_LIMIT_BYTES = 512 * 1024 * 1024
#: the largest answer a client reads from a target. The largest answer is an rLLM gateway's ``GET /sessions``
#: listing, about 120 to 200 bytes a session (its id, trace count and timestamps as compact JSON): a
#: million sessions weigh 115 to 190 MiB, and this leaves room for longer ids
DEFAULT_MAX_BODY_BYTES = 512 * 1024 * 1024
#: the platform's hard ceiling for a pool override (the gateway's default connections per upstream host)
POOL_OVERRIDE_CEILING = 5000
STANDARD_POOL_ENV = "SANDBOX_LLM_GATEWAY_PROVIDER_CONCURRENCY"
CUSTOM_POOL_ENV = "SANDBOX_LLM_GATEWAY_CUSTOM_PROVIDER_CONCURRENCY"


#: how a file key names a file in the folder systemd fills from a unit's ``LoadCredential=`` lines
CREDENTIALS_VARIABLE = "CREDENTIALS_DIRECTORY"
_CREDENTIALS_PREFIXES = (f"${CREDENTIALS_VARIABLE}/", f"${{{CREDENTIALS_VARIABLE}}}/")


def credential_path(value: str) -> str:
    """The path a file key names: ``$CREDENTIALS_DIRECTORY/NAME`` (or ``${CREDENTIALS_DIRECTORY}/NAME``) is the
    credential NAME in the folder systemd passes a service in that variable (``LoadCredential=NAME:PATH``), a
    leading ``~`` is the home folder, and any other path is taken as it is (no other variable is expanded).
    Raises ValueError when the path names the variable and it is not set.

    >>> credential_path("/run/secrets/bifrost")
    '/run/secrets/bifrost'
    >>> import os; os.environ["CREDENTIALS_DIRECTORY"] = "/run/credentials/gs.service"
    >>> credential_path("$CREDENTIALS_DIRECTORY/bifrost-password")
    '/run/credentials/gs.service/bifrost-password'
    >>> del os.environ["CREDENTIALS_DIRECTORY"]
    """
    for prefix in _CREDENTIALS_PREFIXES:
        if value.startswith(prefix):
            folder = os.environ.get(CREDENTIALS_VARIABLE)
            if not folder:
                raise ValueError(f"names ${CREDENTIALS_VARIABLE}, which is not set (systemd sets it for a service "
                                 "with LoadCredential=); run it under such a unit or give the file's own path")
            return str(Path(folder) / value[len(prefix):])
    return os.path.expanduser(value)


def read_secret_file(path: str, key: str) -> str:
    """The secret in the file ``path`` (one trailing newline dropped), for the config key ``key``.

    Raises ConfigError naming the key and the file (never the content) when it cannot be read or is empty."""
    try:
        value = read_text(path, limit=MAX_CONFIG_BYTES).rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or "not UTF-8 text"
        raise ConfigError(f"{key}: cannot read {path}: {reason}; check that the file exists and that this "
                          "user may read it.") from None
    if not value:
        raise ConfigError(f"{key}: {path} is empty; put the secret in it.")
    return value


@dataclass(frozen=True)
class AuthConfig:
    """Where a target's credentials come from. Holds names of places, never a password."""

    username: str | None = None
    username_env: str | None = None
    password_env: str | None = None
    password_file: str | None = None
    #: a file holding the username (a Kubernetes Secret of type basic-auth mounts one)
    username_file: str | None = None

    def resolve(self) -> tuple[str, str]:
        """Read the username and password now. Raises ConfigError naming the missing place."""
        user = self.username
        if user is None and self.username_env:
            user = os.environ.get(self.username_env)
            if not user:
                raise ConfigError(f"auth: the environment variable {self.username_env} (username_env) is not set.")
        if user is None and self.username_file:
            user = read_secret_file(self.username_file, "auth: username_file")
        if not user:
            raise ConfigError("auth: set username, username_env or username_file for this target.")
        if self.password_env:
            password = os.environ.get(self.password_env)
            if password is None:
                raise ConfigError(f"auth: the environment variable {self.password_env} (password_env) is not set.")
        elif self.password_file:
            password = read_secret_file(self.password_file, "auth: password_file")
        else:
            raise ConfigError("auth: set password_env or password_file for this target.")
        return user, password


@dataclass(frozen=True)
class KubernetesPod:
    """Where a Bifrost gateway runs on Kubernetes: the labels kube-state-metrics gives its container."""

    namespace: str
    pod: str
    container: str


@dataclass(frozen=True)
class Target:
    """One gateway to watch."""

    name: str
    kind: str
    url: str | None = None
    path: str | None = None
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    auth: AuthConfig | None = None
    memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT_BYTES
    #: how many reads of this target may run at once (per-session trace reads, DNS checks)
    concurrency: int = 8
    #: the largest answer read from this target; a larger one is an error that names this setting
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: a Bifrost gateway's Prometheus metrics (its telemetry plugin); None: the management API's ``/metrics``
    metrics_url: str | None = None
    #: whether a Bifrost target's metrics are read at all (False: the boot estimate is the band)
    read_metrics: bool = True
    #: a Bifrost gateway's pod on Kubernetes (exported as labels for the mixin's memory-limit join)
    kubernetes: KubernetesPod | None = None

    @property
    def runtime_metrics_url(self) -> str | None:
        """The URL a Bifrost target's metrics are read from (None: not read).

        >>> Target(name="b", kind="bifrost", url="http://bifrost:8080").runtime_metrics_url
        'http://bifrost:8080/metrics'
        >>> Target(name="b", kind="bifrost", url="http://b:8080", read_metrics=False).runtime_metrics_url is None
        True
        """
        if self.kind != "bifrost" or not self.read_metrics or not self.url:
            return None
        return self.metrics_url or self.url + "/metrics"

    @property
    def address(self) -> str:
        """Where it is, for messages and JSON (never carries credentials)."""
        return self.url or self.path or ""

    @property
    def is_remote(self) -> bool:
        """Whether it is read over HTTP at its ``url``; False for an rLLM SQLite file at its ``path``.

        >>> Target(name="a", kind="rllm", url="http://127.0.0.1:9090").is_remote
        True
        >>> Target(name="b", kind="rllm", path="/srv/rllm/gateway_traces.db").is_remote
        False
        """
        return not self.path


def is_remote_address(address: str) -> bool:
    """Whether an address as given on a command line names a gateway's URL (http:// or https://, in any case)
    rather than the path of a SQLite file.

    >>> is_remote_address("http://127.0.0.1:9000"), is_remote_address("HTTPS://gw"), is_remote_address("/a.db")
    (True, True, False)
    """
    return re.match(r"https?://", address, re.IGNORECASE) is not None


@dataclass
class Policy:
    """The thresholds every finding uses."""

    orphan_idle_seconds: float = 7200.0
    max_weight_lag: int = 2
    standard_pool: int = 512
    custom_pool: int = 64
    queue_per_worker: int = 16
    env_file: str | None = None
    #: warnings raised while resolving the policy (e.g. an unusable override in the env file)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The thresholds as the scan report and a plan record them (where they came from is left out).

        >>> Policy(custom_pool=32).to_dict()
        {'orphan_idle_seconds': 7200.0, 'max_weight_lag': 2, 'standard_pool': 512, 'custom_pool': 32, \
'queue_per_worker': 16}
        """
        return {
            "orphan_idle_seconds": self.orphan_idle_seconds,
            "max_weight_lag": self.max_weight_lag,
            "standard_pool": self.standard_pool,
            "custom_pool": self.custom_pool,
            "queue_per_worker": self.queue_per_worker,
        }


@dataclass
class Config:
    targets: list[Target]
    policy: Policy
    source: str | None = None  # the file it came from, if any
    #: raw ``[exporter]`` table, validated by the exporter itself
    exporter: dict[str, Any] = field(default_factory=dict)
    #: raw ``[heal]`` table, validated by heal itself (:func:`gatewayscope.heal.settings.parse_heal_settings`)
    heal: dict[str, Any] = field(default_factory=dict)

    def target(self, name: str) -> Target:
        for target in self.targets:
            if target.name == name:
                return target
        known = ", ".join(t.name for t in self.targets) or "none"
        raise ConfigError(f"No target named {name!r} (configured: {known}).")


# -- validation helpers -------------------------------------------------------------------------

_TARGET_KEYS = {"name", "kind", "url", "path", "timeout_seconds", "auth", "memory_limit_bytes", "concurrency",
                "max_body_bytes", "metrics_url", "read_metrics", "kubernetes"}
_KUBERNETES_KEYS = ("namespace", "pod", "container")
#: a Kubernetes object name (namespaces and containers: DNS-1123 labels; pods: DNS-1123 subdomains)
_KUBERNETES_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_AUTH_KEYS = {"username", "username_env", "username_file", "password_env", "password_file"}
#: the auth keys that name a file (``$CREDENTIALS_DIRECTORY/NAME`` allowed: :func:`credential_path`)
_AUTH_FILE_KEYS = {"username_file", "password_file"}
_POLICY_KEYS = {"orphan_idle_seconds", "max_weight_lag", "standard_pool", "custom_pool", "queue_per_worker",
                "env_file"}
_TOP_KEYS = {"targets", "policy", "exporter", "heal"}


class _Problems:
    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.lines: list[str] = []

    def add(self, key: str, message: str) -> None:
        self.lines.append(f"{self.origin}: {key}: {message}")


def _is_number(value: Any) -> bool:
    """A finite number (TOML's ``inf`` and ``nan`` are floats, and no setting means them)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_url(value: Any, key: str, problems: _Problems) -> str | None:
    if not isinstance(value, str) or not value:
        problems.add(key, f"expected a URL string like \"http://127.0.0.1:9090\", got {value!r}")
        return None
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - a port out of range or not a number raises here
    except ValueError as err:
        problems.add(key, f"expected an http:// or https:// URL with a host, got {value!r} ({err})")
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        problems.add(key, f"expected an http:// or https:// URL with a host, got {value!r}")
        return None
    if parts.username or parts.password:
        problems.add(key, "must not carry credentials; use the [targets.auth] table instead")
        return None
    return value.rstrip("/")


def check_url(value: str, key: str) -> str:
    """``value`` as a gateway URL (http:// or https://, a host, no credentials; no trailing slash), or ConfigError
    naming ``key`` (a flag, an argument).

    >>> check_url("http://127.0.0.1:9090/", "target")
    'http://127.0.0.1:9090'
    """
    problems = _Problems("command line")
    url = _check_url(value, key, problems)
    if problems.lines or url is None:
        raise ConfigError(problems.lines)
    return url


def _parse_auth(raw: Any, key: str, problems: _Problems) -> AuthConfig | None:
    if not isinstance(raw, dict):
        problems.add(key, "expected a table with username/username_env/username_file and password_env/password_file")
        return None
    for extra in sorted(set(raw) - _AUTH_KEYS):
        hint = " (a password never goes in the file: use password_env or password_file)" if extra == "password" \
            else ""
        problems.add(f"{key}.{extra}", f"unknown key{hint}; expected one of {', '.join(sorted(_AUTH_KEYS))}")
    values = {}
    for name in sorted(_AUTH_KEYS):
        if name in raw:
            if not isinstance(raw[name], str) or not raw[name]:
                problems.add(f"{key}.{name}", f"expected a non-empty string, got {raw[name]!r}")
            elif name in _AUTH_FILE_KEYS:
                try:
                    values[name] = credential_path(raw[name])
                except ValueError as err:
                    problems.add(f"{key}.{name}", str(err))
                    values[name] = raw[name]  # it is there: no "needs ..." line as well
            else:
                values[name] = raw[name]
    if not {"username", "username_env", "username_file"} & set(values):
        problems.add(key, "needs username, username_env or username_file")
    if ("password_env" in values) == ("password_file" in values):
        problems.add(key, "needs exactly one of password_env or password_file")
    return AuthConfig(**values)


def _parse_kubernetes(raw: Any, key: str, problems: _Problems) -> KubernetesPod | None:
    if not isinstance(raw, dict):
        problems.add(key, "expected a table with namespace, pod and container")
        return None
    for extra in sorted(set(raw) - set(_KUBERNETES_KEYS)):
        problems.add(f"{key}.{extra}", f"unknown key; expected one of {', '.join(_KUBERNETES_KEYS)}")
    values: dict[str, str] = {}
    for name in _KUBERNETES_KEYS:
        value = raw.get(name)
        if not isinstance(value, str) or not _KUBERNETES_NAME.fullmatch(value):
            problems.add(f"{key}.{name}", f"expected a Kubernetes name (lowercase letters, digits, '-', '.'), "
                                          f"got {value!r}")
        else:
            values[name] = value
    return KubernetesPod(**values) if len(values) == len(_KUBERNETES_KEYS) else None


def _parse_target(raw: Any, index: int, problems: _Problems) -> Target | None:
    key = f"targets[{index}]"
    if not isinstance(raw, dict):
        problems.add(key, "expected a table ([[targets]])")
        return None
    for extra in sorted(set(raw) - _TARGET_KEYS):
        problems.add(f"{key}.{extra}", f"unknown key; expected one of {', '.join(sorted(_TARGET_KEYS))}")
    before = len(problems.lines)
    name = raw.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.:-]{1,100}", name or ""):
        problems.add(f"{key}.name", f"expected a short name of letters, digits, '_', '-', '.', ':', got {name!r}")
    kind = raw.get("kind")
    if kind not in KINDS:
        problems.add(f"{key}.kind", f"expected \"rllm\" or \"bifrost\", got {kind!r}")
    url = path = None
    if "url" in raw:
        url = _check_url(raw["url"], f"{key}.url", problems)
    if "path" in raw:
        if kind == "bifrost":
            problems.add(f"{key}.path", "a bifrost target is read over HTTP: give url, not path")
        elif not isinstance(raw["path"], str) or not raw["path"]:
            problems.add(f"{key}.path", f"expected the path of a SQLite trace store, got {raw['path']!r}")
        else:
            path = os.path.expanduser(raw["path"])
    if kind == "rllm" and ("url" in raw) == ("path" in raw):
        problems.add(key, "an rllm target needs exactly one of url (the gateway) or path (its SQLite file)")
    if kind == "bifrost" and "url" not in raw:
        problems.add(key, "a bifrost target needs url (its management API)")
    timeout = raw.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS)
    if not _is_number(timeout) or timeout <= 0:
        problems.add(f"{key}.timeout_seconds", f"expected a positive number of seconds, got {timeout!r}")
    limit = raw.get("memory_limit_bytes", DEFAULT_MEMORY_LIMIT_BYTES)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
        problems.add(f"{key}.memory_limit_bytes", f"expected a positive whole number of bytes, got {limit!r}")
    max_body = raw.get("max_body_bytes", DEFAULT_MAX_BODY_BYTES)
    if not isinstance(max_body, int) or isinstance(max_body, bool) or max_body <= 0:
        problems.add(f"{key}.max_body_bytes", f"expected a positive whole number of bytes, got {max_body!r}")
    concurrency = raw.get("concurrency", 8)
    if not isinstance(concurrency, int) or isinstance(concurrency, bool) or not 1 <= concurrency <= 256:
        problems.add(f"{key}.concurrency", f"expected a whole number from 1 to 256, got {concurrency!r}")
    auth = _parse_auth(raw["auth"], f"{key}.auth", problems) if "auth" in raw else None
    if auth is not None and kind == "rllm":
        problems.add(f"{key}.auth", "the rLLM gateway has no authentication; remove this table")
    for bifrost_only in ("metrics_url", "read_metrics", "kubernetes"):
        if bifrost_only in raw and kind == "rllm":
            problems.add(f"{key}.{bifrost_only}", "only a bifrost target has it; remove it")
    metrics_url = _check_url(raw["metrics_url"], f"{key}.metrics_url", problems) if "metrics_url" in raw else None
    read_metrics = raw.get("read_metrics", True)
    if not isinstance(read_metrics, bool):
        problems.add(f"{key}.read_metrics", f"expected true or false, got {read_metrics!r}")
    kubernetes = _parse_kubernetes(raw["kubernetes"], f"{key}.kubernetes", problems) if "kubernetes" in raw else None
    if len(problems.lines) > before:
        return None
    return Target(name=name, kind=kind, url=url, path=path, timeout_seconds=float(timeout), auth=auth,  # type: ignore[arg-type]
                  memory_limit_bytes=limit, concurrency=concurrency, max_body_bytes=max_body,
                  metrics_url=metrics_url, read_metrics=read_metrics, kubernetes=kubernetes)


def _parse_policy(raw: Any, problems: _Problems) -> Policy:
    policy = Policy()
    if not isinstance(raw, dict):
        problems.add("policy", "expected a table ([policy])")
        return policy
    for extra in sorted(set(raw) - _POLICY_KEYS):
        problems.add(f"policy.{extra}", f"unknown key; expected one of {', '.join(sorted(_POLICY_KEYS))}")
    if "orphan_idle_seconds" in raw:
        value = raw["orphan_idle_seconds"]
        if not _is_number(value) or value <= 0:
            problems.add("policy.orphan_idle_seconds", f"expected a positive number of seconds, got {value!r}")
        else:
            policy.orphan_idle_seconds = float(value)
    for name in ("max_weight_lag", "standard_pool", "custom_pool", "queue_per_worker"):
        if name in raw:
            value = raw[name]
            minimum = 0 if name == "max_weight_lag" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                problems.add(f"policy.{name}", f"expected a whole number >= {minimum}, got {value!r}")
            else:
                setattr(policy, name, value)
    if "env_file" in raw:
        if not isinstance(raw["env_file"], str) or not raw["env_file"]:
            problems.add("policy.env_file", f"expected a path, got {raw['env_file']!r}")
        else:
            policy.env_file = os.path.expanduser(raw["env_file"])
    return policy


def parse_config(data: dict[str, Any], origin: str = "<config>") -> Config:
    """Validate a parsed TOML document. Raises ConfigError with every problem found."""
    problems = _Problems(origin)
    for extra in sorted(set(data) - _TOP_KEYS):
        problems.add(extra, "unknown section; expected [[targets]], [policy], [exporter] or [heal]")
    raw_targets = data.get("targets", [])
    targets: list[Target] = []
    if not isinstance(raw_targets, list):
        problems.add("targets", "expected an array of tables ([[targets]])")
        raw_targets = []
    for index, raw in enumerate(raw_targets):
        target = _parse_target(raw, index, problems)
        if target is not None:
            targets.append(target)
    seen: set[str] = set()
    for index, target in enumerate(targets):
        if target.name in seen:
            problems.add(f"targets[{index}].name", f"{target.name!r} is used by another target; names must be unique")
        seen.add(target.name)
    policy = _parse_policy(data.get("policy", {}), problems)
    exporter = data.get("exporter", {})
    if not isinstance(exporter, dict):
        problems.add("exporter", "expected a table ([exporter])")
        exporter = {}
    heal = data.get("heal", {})
    if not isinstance(heal, dict):
        problems.add("heal", "expected a table ([heal])")
        heal = {}
    if problems.lines:
        raise ConfigError(problems.lines)
    config = Config(targets=targets, policy=policy, source=origin, exporter=exporter, heal=heal)
    if policy.env_file:
        apply_env_file(policy, policy.env_file)
    return config


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate a TOML config file."""
    origin = str(path)
    try:
        data = tomllib.loads(read_text(path, limit=MAX_CONFIG_BYTES))
    except UnicodeDecodeError:
        raise ConfigError(f"{origin}: not UTF-8 text; a TOML file is UTF-8") from None
    except FileNotFoundError:
        raise ConfigError(f"{origin}: no such file; pass --config with the path of your gatewayscope.toml") from None
    except IsADirectoryError:
        raise ConfigError(f"{origin}: is a folder; pass the TOML file itself") from None
    except OSError as err:
        raise ConfigError(f"{origin}: cannot read it: {err.strerror or err}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{origin}: not valid TOML: {err}") from None
    except RecursionError:
        # the TOML reader recurses once per level of nested arrays and inline tables
        raise ConfigError(f"{origin}: its arrays or inline tables are nested too deeply to read; a gatewayscope "
                          "config needs no more than a few levels, so fix the file") from None
    return parse_config(data, origin)


# -- quick-look flags ---------------------------------------------------------------------------

def target_from_address(address: str, kind: str, index: int, timeout_seconds: float) -> Target:
    """A target from a ``--trace-store URL|PATH`` or ``--bifrost URL`` flag."""
    problems = _Problems("command line")
    flag = "--trace-store" if kind == "rllm" else "--bifrost"
    if is_remote_address(address):
        url = _check_url(address, flag, problems)
        if problems.lines:
            raise ConfigError(problems.lines)
        return Target(name=f"{kind}-{index}", kind=kind, url=url, timeout_seconds=timeout_seconds)
    if kind == "bifrost" or "://" in address:
        raise ConfigError(f"command line: {flag}: expected an http:// or https:// URL, got {address!r}")
    return Target(name=f"{kind}-{index}", kind=kind, path=os.path.expanduser(address),
                  timeout_seconds=timeout_seconds)


def build_config(
    config_path: str | None,
    *,
    trace_stores: Sequence[str] = (),
    bifrost_urls: Sequence[str] = (),
    timeout_seconds: float | None = None,
    orphan_idle_seconds: float | None = None,
    max_weight_lag: int | None = None,
    max_body_bytes: int | None = None,
) -> Config:
    """The config a command runs with: the file (if any), then flag targets and policy overrides.

    ``timeout_seconds`` and ``max_body_bytes`` (flags) override every target's own setting."""
    config = load_config(config_path) if config_path else Config(targets=[], policy=Policy())
    timeout = timeout_seconds if timeout_seconds is not None else DEFAULT_TIMEOUT_SECONDS
    for index, address in enumerate(trace_stores):
        config.targets.append(target_from_address(address, "rllm", index, timeout))
    for index, address in enumerate(bifrost_urls):
        config.targets.append(target_from_address(address, "bifrost", index, timeout))
    if timeout_seconds is not None:
        config.targets = [replace(t, timeout_seconds=timeout_seconds) for t in config.targets]
    if max_body_bytes is not None:
        if max_body_bytes <= 0:
            raise ConfigError("command line: --max-body-bytes: expected a positive whole number of bytes")
        config.targets = [replace(t, max_body_bytes=max_body_bytes) for t in config.targets]
    if orphan_idle_seconds is not None:
        if orphan_idle_seconds <= 0:
            raise ConfigError("command line: --orphan-idle-seconds: expected a positive number of seconds")
        config.policy.orphan_idle_seconds = orphan_idle_seconds
    if max_weight_lag is not None:
        if max_weight_lag < 0:
            raise ConfigError("command line: --max-weight-lag: expected a whole number >= 0")
        config.policy.max_weight_lag = max_weight_lag
    if not config.targets and not (isinstance(config.exporter, dict) and config.exporter.get("discovery_dir")):
        raise ConfigError(
            "No targets: pass --config FILE with [[targets]] (or an [exporter] discovery_dir where guarded "
            "gateways announce themselves), or --trace-store URL|PATH / --bifrost URL."
        )
    return config


# -- the platform's pool overrides ---------------------------------------------------------------

def read_env_file(path: str) -> dict[str, str]:
    """Parse a dotenv file: KEY=VALUE lines, optional ``export``, quotes, ``#`` comments."""
    values: dict[str, str] = {}
    try:
        text = read_text(path, limit=MAX_CONFIG_BYTES)
    except OSError as err:
        raise ConfigError(f"policy.env_file: cannot read {path}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"policy.env_file: cannot read {path}: not UTF-8 text") from None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        key, sep, value = line.partition("=")
        if not sep:
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        else:
            value = value.split(" #", 1)[0].strip()
        values[key.strip()] = value
    return values


def pool_override(raw: str | None, default: int, variable: str) -> tuple[int, str | None]:
    """The seed's rule for one override: not a positive whole number keeps the default with one
    warning; above 5,000 is held at 5,000. Returns (pool, warning or None).

    >>> pool_override("64", 512, "X")
    (64, None)
    >>> pool_override("abc", 512, "X")[0]
    512
    >>> pool_override("9000", 512, "X")[0]
    5000
    """
    if raw is None or raw == "":
        return default, None
    text = raw.strip()
    if not re.fullmatch(r"\+?[0-9]+", text) or int(text) <= 0:
        return default, (f"{variable}={raw!r} is not a positive whole number; keeping the default {default} "
                         "(the gateway would refuse every provision with it)")
    value = int(text)
    if value > POOL_OVERRIDE_CEILING:
        return POOL_OVERRIDE_CEILING, (f"{variable}={value} is above {POOL_OVERRIDE_CEILING}, the gateway's default "
                                       f"connections per upstream host; held at {POOL_OVERRIDE_CEILING}")
    return value, None


def apply_env_file(policy: Policy, path: str) -> None:
    """Take the platform's pool overrides from its env file into ``policy`` (warnings kept on it)."""
    values = read_env_file(path)
    for variable, attribute in ((STANDARD_POOL_ENV, "standard_pool"), (CUSTOM_POOL_ENV, "custom_pool")):
        pool, warning = pool_override(values.get(variable), getattr(policy, attribute), variable)
        setattr(policy, attribute, pool)
        if warning:
            policy.warnings.append(warning)
