"""The exporter's settings: the ``[exporter]`` table of the config file, validated line by line.

::

    [exporter]
    listen = "127.0.0.1:9465"              # HOST:PORT; --listen overrides it
    min_interval_seconds = 15              # a target is read at most once per interval; scrapes in
                                           # between reuse its last snapshot
    max_record_series = 50                 # per-record series per Bifrost target; the rest is summed
                                           # under record="_other"
    default_scrape_timeout_seconds = 10    # when Prometheus sends no X-Prometheus-Scrape-Timeout-Seconds
    scrape_timeout_margin_seconds = 0.5    # kept back from the scrape timeout to render the answer
    full_read_interval_seconds = 600       # a SQLite trace store is read whole at least this often; reads in
                                           # between read only the rows added since (0: always whole)
    tls_cert_file = "/etc/gatewayscope/tls.crt"   # both or neither: serve HTTPS
    tls_key_file = "/etc/gatewayscope/tls.key"
    basic_auth_username = "prometheus"             # (or basic_auth_username_file) with exactly one of:
    basic_auth_password_env = "GATEWAYSCOPE_EXPORTER_PASSWORD"
    # basic_auth_password_file = "/run/secrets/gatewayscope-exporter"

A password never comes from the file itself or the command line: only from the environment variable
or the file it names, read once when the exporter starts. Every ``*_file`` key may name a systemd
credential as ``$CREDENTIALS_DIRECTORY/NAME`` (:func:`gatewayscope.config.credential_path`).
"""

from __future__ import annotations

import math
import os
import ssl
from dataclasses import dataclass
from typing import Any

from gatewayscope.config import credential_path, read_secret_file
from gatewayscope.errors import ConfigError

DEFAULT_LISTEN = "127.0.0.1:9465"
DEFAULT_PORT = 9465
DEFAULT_MIN_INTERVAL_SECONDS = 15.0
DEFAULT_MAX_RECORD_SERIES = 50
DEFAULT_SCRAPE_TIMEOUT_SECONDS = 10.0
DEFAULT_SCRAPE_TIMEOUT_MARGIN_SECONDS = 0.5
#: the longest a SQLite trace store goes without a full read (gatewayscope.sources.rllm_sqlite_incremental)
DEFAULT_FULL_READ_INTERVAL_SECONDS = 600.0

EXPORTER_KEYS = (
    "listen",
    "min_interval_seconds",
    "max_record_series",
    "default_scrape_timeout_seconds",
    "scrape_timeout_margin_seconds",
    "full_read_interval_seconds",
    "tls_cert_file",
    "tls_key_file",
    "basic_auth_username",
    "basic_auth_username_file",
    "basic_auth_password_env",
    "basic_auth_password_file",
    "discovery_dir",
)


@dataclass(frozen=True)
class ExporterSettings:
    """What the ``[exporter]`` table says (defaults filled in). Holds no password, only where it is."""

    listen: str = DEFAULT_LISTEN
    min_interval_seconds: float = DEFAULT_MIN_INTERVAL_SECONDS
    max_record_series: int = DEFAULT_MAX_RECORD_SERIES
    default_scrape_timeout_seconds: float = DEFAULT_SCRAPE_TIMEOUT_SECONDS
    scrape_timeout_margin_seconds: float = DEFAULT_SCRAPE_TIMEOUT_MARGIN_SECONDS
    full_read_interval_seconds: float = DEFAULT_FULL_READ_INTERVAL_SECONDS
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    basic_auth_username: str | None = None
    basic_auth_password_env: str | None = None
    basic_auth_password_file: str | None = None
    #: a directory where guarded gateways announce themselves (``gatewayscope guard run --discovery-dir``): each
    #: becomes an rLLM target while its process runs
    discovery_dir: str | None = None
    #: a file holding the username instead of ``basic_auth_username`` (a Kubernetes basic-auth Secret's key)
    basic_auth_username_file: str | None = None

    @property
    def tls(self) -> bool:
        """Whether the exporter serves HTTPS."""
        return self.tls_cert_file is not None

    @property
    def basic_auth(self) -> bool:
        """Whether every request must carry Basic credentials."""
        return self.basic_auth_username is not None or self.basic_auth_username_file is not None

    def resolve_username(self) -> str:
        """The basic-auth username: ``basic_auth_username``, or read now from ``basic_auth_username_file``."""
        if self.basic_auth_username is not None:
            return self.basic_auth_username
        if self.basic_auth_username_file:
            return read_secret_file(self.basic_auth_username_file, "exporter.basic_auth_username_file")
        raise ConfigError("exporter: basic auth needs basic_auth_username or basic_auth_username_file.")

    def resolve_password(self) -> str:
        """Read the basic-auth password now (env var or file). Raises ConfigError naming the place."""
        if self.basic_auth_password_env:
            value = os.environ.get(self.basic_auth_password_env)
            if not value:
                raise ConfigError(f"exporter.basic_auth_password_env: the environment variable "
                                  f"{self.basic_auth_password_env} is not set (or empty).")
            return value
        if self.basic_auth_password_file:
            return read_secret_file(self.basic_auth_password_file, "exporter.basic_auth_password_file")
        raise ConfigError("exporter: basic_auth_username needs basic_auth_password_env or basic_auth_password_file.")

    def ssl_context(self) -> ssl.SSLContext | None:
        """A server-side TLS context from the certificate and key files, or None without TLS."""
        if not self.tls_cert_file or not self.tls_key_file:
            return None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        except (OSError, ssl.SSLError) as err:
            reason = getattr(err, "strerror", None) or getattr(err, "reason", None) or str(err)
            raise ConfigError(f"exporter: cannot load the TLS certificate {self.tls_cert_file} with the key "
                              f"{self.tls_key_file}: {reason}.") from None
        return context


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT``, ``:PORT`` for every interface) -> (host, port). Raises ValueError.

    >>> parse_listen("127.0.0.1:9465")
    ('127.0.0.1', 9465)
    >>> parse_listen("[::1]:0")
    ('::1', 0)
    >>> parse_listen(":9465")
    ('', 9465)
    """
    text = value.strip()
    if text.startswith("["):
        host, sep, port_text = text[1:].partition("]:")
        if not sep:
            raise ValueError(f"expected [IPv6]:PORT, got {value!r}")
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ValueError(f"expected HOST:PORT like {DEFAULT_LISTEN!r}, got {value!r}")
        if ":" in host:
            raise ValueError(f"write an IPv6 address in brackets, like [::1]:{DEFAULT_PORT}; got {value!r}")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"expected a port from 0 to 65535 after the ':', got {value!r}")
    return host, int(port_text)


def _number(value: Any) -> bool:
    """A finite number (TOML's ``inf`` and ``nan`` are floats, and no setting means them)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def parse_exporter_settings(raw: dict[str, Any] | None, origin: str = "<config>") -> ExporterSettings:
    """Validate the raw ``[exporter]`` table. Raises ConfigError with one line per problem.

    >>> parse_exporter_settings({"min_interval_seconds": 5}).min_interval_seconds
    5.0
    >>> try:
    ...     parse_exporter_settings({"max_record_series": -1, "basic_auth_password": "x"}, "g.toml")
    ... except ConfigError as err:
    ...     print(err)  # doctest: +NORMALIZE_WHITESPACE
    g.toml: exporter.basic_auth_password: unknown key (a password never goes in the file: use \
basic_auth_password_env or basic_auth_password_file)
    g.toml: exporter.max_record_series: expected a whole number >= 0, got -1
    """
    raw = raw or {}
    problems: list[str] = []

    def add(key: str, message: str) -> None:
        problems.append(f"{origin}: exporter.{key}: {message}")

    for extra in sorted(set(raw) - set(EXPORTER_KEYS)):
        if extra == "basic_auth_password":
            add(extra, "unknown key (a password never goes in the file: use basic_auth_password_env "
                       "or basic_auth_password_file)")
        else:
            add(extra, f"unknown key; expected one of {', '.join(EXPORTER_KEYS)}")
    values: dict[str, Any] = {}

    listen = raw.get("listen", DEFAULT_LISTEN)
    if not isinstance(listen, str):
        add("listen", f"expected \"HOST:PORT\" like {DEFAULT_LISTEN!r}, got {listen!r}")
    else:
        try:
            parse_listen(listen)
            values["listen"] = listen
        except ValueError as err:
            add("listen", str(err))

    for key, minimum, strict in (("min_interval_seconds", 0.0, False),
                                 ("default_scrape_timeout_seconds", 0.0, True),
                                 ("scrape_timeout_margin_seconds", 0.0, False),
                                 ("full_read_interval_seconds", 0.0, False)):
        if key in raw:
            value = raw[key]
            if not _number(value) or value < minimum or (strict and value <= minimum):
                wanted = "a positive number of seconds" if strict else "a number of seconds >= 0"
                add(key, f"expected {wanted}, got {value!r}")
            else:
                values[key] = float(value)

    if "max_record_series" in raw:
        value = raw["max_record_series"]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            add("max_record_series", f"expected a whole number >= 0, got {value!r}")
        else:
            values["max_record_series"] = value

    for key in ("tls_cert_file", "tls_key_file", "basic_auth_username", "basic_auth_username_file",
                "basic_auth_password_env", "basic_auth_password_file", "discovery_dir"):
        if key in raw:
            value = raw[key]
            if not isinstance(value, str) or not value:
                add(key, f"expected a non-empty string, got {value!r}")
            elif key.endswith("_file"):
                try:
                    values[key] = credential_path(value)
                except ValueError as err:
                    add(key, str(err))
            else:
                values[key] = os.path.expanduser(value) if key.endswith("_dir") else value

    cert, key_file = values.get("tls_cert_file"), values.get("tls_key_file")
    if ("tls_cert_file" in raw) != ("tls_key_file" in raw):
        add("tls_cert_file" if "tls_cert_file" not in raw else "tls_key_file",
            "TLS needs both tls_cert_file and tls_key_file")
    for name, path in (("tls_cert_file", cert), ("tls_key_file", key_file)):
        if path is not None and not os.path.isfile(path):
            add(name, f"no such file: {path}")

    users = [k for k in ("basic_auth_username", "basic_auth_username_file") if k in raw]
    sources = [k for k in ("basic_auth_password_env", "basic_auth_password_file") if k in raw]
    if len(users) > 1:
        add("basic_auth_username_file", "give basic_auth_username or basic_auth_username_file, not both")
    if users and len(sources) != 1:
        add(users[0], "needs exactly one of basic_auth_password_env or basic_auth_password_file")
    if sources and not users:
        add(sources[0], "needs basic_auth_username (or basic_auth_username_file) as well")

    if problems:
        raise ConfigError(problems)
    return ExporterSettings(**values)
