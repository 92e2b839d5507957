"""The emulator's HTTP server and its Python face, :class:`BifrostEmulator`.

A real ``ThreadingHTTPServer`` on loopback (daemon threads, HTTP/1.1 keep-alive). Around the management
routes (``api.py``) and ``/metrics`` (``runtime.py``) it adds, in this order: the emulator-only control namespace
``/_emulator/*`` (never behind auth, never logged), a killed process that answers nothing (§7), the request log,
Basic/session auth (when configured) and fault injection.
Section numbers (§) refer to docs/sandbox.md, "The emulated management API".
"""

from __future__ import annotations

import contextlib
import copy
import json
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gatewayscope.sandbox.bifrost_emulator import _go
from gatewayscope.sandbox.bifrost_emulator.api import (
    ManagementAPI,
    Reply,
    error_reply,
    json_reply,
    parse_json,
)
from gatewayscope.sandbox.bifrost_emulator.globalconfig import AuthConfig, GlobalConfig
from gatewayscope.sandbox.bifrost_emulator.model import ProviderRecord
from gatewayscope.sandbox.bifrost_emulator.state import (
    ANY,
    CONFIG,
    DEFAULT_BASELINE_GOROUTINES,
    DEFAULT_BASELINE_MEMORY_BYTES,
    DEFAULT_STACK_BYTES_PER_GOROUTINE,
    LIST,
    METRICS,
    STACK_BYTES_HIGH,
    STACK_BYTES_LOW,
    EmulatorState,
    Fault,
    LoggedRequest,
    Pool,
    ProcessModel,
)

#: routes answered without credentials even when auth is on (§5)
PUBLIC_PATHS = frozenset({"/health", "/api/version", "/api/session/login", "/api/session/is-auth-enabled",
                          "/api/oauth/callback", "/login", "/favicon.ico"})
PUBLIC_PREFIXES = ("/assets/", "/api/dev", "/.well-known/", "/api/skills/serve/")
CONTROL_PREFIX = "/_emulator"
#: routes faults can be injected on
_FAULTABLE = frozenset({"providers", "provider", "keys", "config", "unimplemented", "bad_name", "metrics"})
#: what a Go client of Prometheus serves its text exposition as
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_UNAUTHORIZED = error_reply(401, "Unauthorized")
_DEFAULT_FAULT_MESSAGES = {
    ("PUT", "provider"): "Failed to update provider: emulated fault",
    ("POST", "provider"): "Failed to add provider: emulated fault",
    ("GET", "provider"): "Failed to get provider config: emulated fault",
    ("DELETE", "provider"): "Failed to get provider: emulated fault",
    ("GET", LIST): "Failed to get providers: emulated fault",
}


@dataclass
class EmulatorOptions:
    """Behaviours that differ between gateway releases, plus emulator knobs.

    Defaults reproduce the newest gateway (transports v2.2.x).
    """

    #: older builds: DELETE of an unknown name → 404 ``Provider not found: not found`` (newest: 200)
    legacy_delete_404: bool = False
    #: older builds emitted SecretVars as ``{value, env_var, from_env}`` (newest ``{value, ref?, type}``)
    legacy_secret_shape: bool = False
    #: older builds answered bad JSON with ``Invalid JSON: <err>`` (newest ``Invalid request payload``)
    legacy_invalid_json_message: bool = False
    #: older handlers assigned proxy_config / custom_provider_config unconditionally on PUT
    legacy_put_clears_blocks: bool = False
    #: ``keys`` on PUT: "reject" (newest, 400) or "ignore" (earlier 1.5.x)
    put_keys_policy: str = "reject"
    #: bound on the base-URL DNS lookup, seconds (the gateway has none; the platform sees ≤ 5 s)
    dns_timeout: float = 5.0
    #: host → addresses; None uses the system resolver (``socket.getaddrinfo``)
    resolver: Callable[[str], list[str]] | None = None
    #: what ``GET /api/version`` answers (a JSON string)
    version: str = "v2.2.4"
    #: emulated upstream model listing after a write (§2.9), seconds, capped at ``model_discovery_timeout``
    model_discovery_delay: float = 0.0
    model_discovery_timeout: float = 15.0
    #: entries kept in the request log
    request_log_limit: int = 10_000
    #: ``GET /metrics`` served (the telemetry plugin on, its default); False: 404, as with the plugin off (§7)
    metrics_enabled: bool = True
    #: the process model (§7): stack bytes per goroutine, memory and goroutines held besides the workers
    stack_bytes_per_goroutine: int = DEFAULT_STACK_BYTES_PER_GOROUTINE
    baseline_memory_bytes: int = DEFAULT_BASELINE_MEMORY_BYTES
    baseline_goroutines: int = DEFAULT_BASELINE_GOROUTINES
    #: a process whose resident memory would exceed this is killed (§7); None: no limit
    memory_limit_bytes: int | None = None
    #: a PUT starts the record's new pool while the old one still runs (§3); False (the core as read): the
    #: old workers retire before the new ones start
    update_overlap: bool = False
    #: how long an overlapping update runs both pools, seconds
    update_overlap_seconds: float = 0.05
    #: report this many goroutines in /metrics whatever runs (a gateway whose metrics lie); None: the truth
    metrics_goroutines: int | None = None

    def process_model(self) -> ProcessModel:
        return ProcessModel(stack_bytes_per_goroutine=self.stack_bytes_per_goroutine,
                            baseline_memory_bytes=self.baseline_memory_bytes,
                            baseline_goroutines=self.baseline_goroutines,
                            memory_limit_bytes=self.memory_limit_bytes)


@dataclass
class _Route:
    kind: str  # see _route()
    name: str | None = None
    target: str | None = None
    error: str | None = None
    allowed: tuple[str, ...] = field(default_factory=tuple)


def _route(method: str, path: str) -> _Route:
    """Match a raw path (query stripped) against the emulated routes."""
    segments = path.split("/")[1:]
    if path == "/metrics":
        return _Route("metrics", target=METRICS, allowed=("GET",))
    if path == "/health":
        return _Route("health", allowed=("GET",))
    if path == "/api/version":
        return _Route("version", allowed=("GET",))
    if path == "/api/config":
        return _Route("config", target=CONFIG, allowed=("GET", "PUT"))
    if path == "/api/session/login":
        return _Route("login", allowed=("POST",))
    if path == "/api/session/logout":
        return _Route("logout", allowed=("POST",))
    if path == "/api/session/is-auth-enabled":
        return _Route("is_auth_enabled", allowed=("GET",))
    if path == "/api/providers":
        return _Route("providers", target=LIST if method == "GET" else None, allowed=("GET", "POST"))
    if len(segments) >= 3 and segments[:2] == ["api", "providers"] and segments[2]:
        try:
            name = _go.path_unescape(segments[2])
        except _go.EscapeError as err:
            return _Route("bad_name", error=str(err), allowed=("GET", "PUT", "DELETE", "POST"))
        rest = segments[3:]
        if not rest:
            return _Route("provider", name=name, target=name, allowed=("GET", "PUT", "DELETE"))
        if rest == ["keys"]:
            return _Route("keys", name=name, target=name, allowed=("GET", "POST"))
        if rest[0] in ("keys", "refresh-models"):
            return _Route("unimplemented", name=name, target=name, allowed=("GET", "POST", "PUT", "DELETE"))
    return _Route("not_found")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    emulator: BifrostEmulator

    def __init__(self, address: tuple[str, int], emulator: BifrostEmulator) -> None:
        self.emulator = emulator
        self.open_sockets: set[socket.socket] = set()
        self.sockets_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.sockets_lock:
            self.open_sockets.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.sockets_lock:
            self.open_sockets.discard(request)
        super().shutdown_request(request)

    def close_open_connections(self) -> None:
        with self.sockets_lock:
            sockets = list(self.open_sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    server_version = "bifrost-emulator"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the request log is the record."""

    def _body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if not length:
            return b""
        try:
            return self.rfile.read(max(0, int(length)))
        except ValueError:
            return b""

    def _serve(self) -> None:
        body = self._body()
        headers = {k.lower(): v for k, v in self.headers.items()}
        reply = self.server.emulator._dispatch(self.command, self.path, headers, body)
        if reply is None:  # an injected no-answer: send nothing, drop the connection
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.body)))
            for name, value in reply.headers:
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(reply.body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _serve


class BifrostEmulator:
    """An emulator of the Bifrost management API (not the real gateway), served on loopback.

    >>> with BifrostEmulator() as emu:            # doctest: +SKIP
    ...     httpx.get(emu.url + "/api/providers").json()
    {'providers': [], 'total': 0}
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, auth: tuple[str, str] | None = None,
                 options: EmulatorOptions | None = None) -> None:
        self.host = host
        self.port = port
        self.options = options or EmulatorOptions()
        self.state = EmulatorState(request_log_limit=self.options.request_log_limit,
                                   process=self.options.process_model())
        if auth is not None:
            self.state.config.auth = AuthConfig(admin_username=auth[0], admin_password=auth[1], is_enabled=True)
        self._stopping = threading.Event()
        self.api = ManagementAPI(self.state, self.options, self._sleep)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> BifrostEmulator:
        """Bind and serve in a daemon thread; ``port=0`` picks a free port (see :attr:`url`)."""
        if self._server is not None:
            return self
        self._stopping.clear()
        self._server = _Server((self.host, self.port), self)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=f"bifrost-emulator:{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, wake any injected wait, close open connections; safe to call twice."""
        self._stopping.set()
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.close_open_connections()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> BifrostEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:43121``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._server is not None

    def _sleep(self, seconds: float) -> None:
        """A wait that :meth:`stop` cuts short."""
        if seconds > 0:
            self._stopping.wait(seconds)

    # -- store access (direct, no HTTP) ----------------------------------------------------------

    def load(self, records: list[ProviderRecord], config: GlobalConfig | None = None) -> bool:
        """Replace the store as it was at boot (pools started, no restarts); keeps auth when
        ``config`` is None or carries no admin account. Returns whether the process survives that boot
        (§7: False when it needs more than its memory limit)."""
        with self.state.lock:
            if config is not None and not config.auth.admin_username:
                config = copy.deepcopy(config)
                config.auth = copy.deepcopy(self.state.config.auth)
            return self.state.load(records, config)

    def get_record(self, name: str) -> ProviderRecord | None:
        """The stored record, unmasked (a copy), or None."""
        return self.state.get_record(name)

    def record_names(self) -> list[str]:
        with self.state.lock:
            return sorted(self.state.records)

    def put_record(self, record: ProviderRecord) -> None:
        """Store a record directly, as if it had been there at boot (its pool starts, no restart counted)."""
        with self.state.lock:
            self.state.records[record.name] = copy.deepcopy(record)
            self.state.pools.pop(record.name, None)
            if record.buildable:
                self.state.pools[record.name] = Pool(max(0, record.concurrency), max(0, record.buffer_size))

    def client_config(self) -> dict[str, Any]:
        with self.state.lock:
            return copy.deepcopy(self.state.config.client_config)

    def set_client_config(self, **values: Any) -> None:
        """Change client_config fields directly (e.g. to model an operator's edit)."""
        with self.state.lock:
            self.state.config.client_config.update(copy.deepcopy(values))

    # -- worker accounting -----------------------------------------------------------------------

    def state_snapshot(self) -> dict[str, Any]:
        """Same as ``GET /_emulator/state``."""
        return self.state.snapshot(version=self.options.version)

    def parked_workers(self, name: str | None = None) -> int:
        """Parked workers of one record (0 if unknown or without pool), or of all records."""
        with self.state.lock:
            if name is not None:
                pool = self.state.pools.get(name)
                return pool.workers if pool else 0
            return sum(p.workers for p in self.state.pools.values())

    def restarts(self, name: str) -> int:
        """How many writes restarted this record's pool since boot."""
        with self.state.lock:
            pool = self.state.pools.get(name)
            return pool.restarts if pool else 0

    def boot_memory(self) -> tuple[int, int]:
        """(low, high) bytes of parked goroutine stacks: 2 KiB and 8 KiB per worker."""
        workers = self.parked_workers()
        return workers * STACK_BYTES_LOW, workers * STACK_BYTES_HIGH

    # -- the process (§7) ------------------------------------------------------------------------

    def boot_memory_bytes(self) -> int:
        """What a restart would hold once booted: the baseline memory plus the baseline goroutines and every
        stored buildable record's workers at the process's stack per goroutine."""
        return self.state.boot_memory_bytes()

    def resident_memory_bytes(self) -> int:
        """What the process holds now (an overlapping update's old pools included)."""
        return self.state.resident_memory_bytes()

    def goroutines(self) -> int:
        """The goroutines that run now (the truth, whatever ``metrics_goroutines`` makes /metrics say)."""
        return self.state.process.goroutines(self.state.running_workers())

    def runtime(self) -> dict[str, Any]:
        """The process as ``GET /_emulator/state`` shows it under ``runtime``."""
        return self.state.runtime_snapshot()

    @property
    def dead(self) -> bool:
        """Killed for going over its memory limit: it answers nothing until :meth:`restart`."""
        return self.state.dead

    def restart(self) -> bool:
        """Restart the process over its stored records (as an orchestrator restarts a killed container);
        returns whether it survives the boot."""
        return self.state.boot()

    # -- faults ----------------------------------------------------------------------------------

    def add_fault(self, fault: Fault) -> Fault:
        """Arm a fault (see :class:`Fault`); returns it with its id."""
        return self.state.add_fault(fault)

    def inject_error(self, method: str, target: str, *, status: int = 500, message: str | None = None,
                     times: int | None = 1, apply_write: bool = False) -> Fault:
        """Answer the next ``times`` matching requests with ``status``/``message`` (error envelope)."""
        text = message or _default_fault_message(method, target)
        return self.add_fault(Fault("error", method=method, target=target, times=times, status=status,
                                    message=text, apply_write=apply_write))

    def inject_slow(self, method: str, target: str, *, delay: float, apply_write: bool = False,
                    times: int | None = 1) -> Fault:
        """Delay the answer by ``delay`` s; with ``apply_write`` the write lands before the wait."""
        return self.add_fault(Fault("slow", method=method, target=target, times=times, delay=delay,
                                    apply_write=apply_write))

    def inject_no_answer(self, method: str, target: str, *, mode: str = "close", hang_seconds: float = 30.0,
                         apply_write: bool = True, times: int | None = 1) -> Fault:
        """Process the request (the write lands), then send nothing: close, or hang then close."""
        return self.add_fault(Fault("no_answer", method=method, target=target, times=times, mode=mode,
                                    hang_seconds=hang_seconds, apply_write=apply_write))

    def inject_delete_after_read(self, name: str, *, times: int | None = 1) -> Fault:
        """After the next ``GET /api/providers/{name}`` is answered, delete the record."""
        return self.add_fault(Fault("delete_after_read", method="GET", target=name, times=times))

    def inject_garbage(self, method: str = "GET", target: str = LIST, *, body: str | None = None,
                       status: int = 200, content_type: str = "text/html", times: int | None = 1) -> Fault:
        """Answer a non-JSON body (by default on the listing)."""
        fault = Fault("garbage", method=method, target=target, times=times, status=status,
                      content_type=content_type)
        if body is not None:
            fault.body = body
        return self.add_fault(fault)

    def faults(self) -> list[Fault]:
        with self.state.lock:
            return [copy.copy(f) for f in self.state.faults]

    def reset_faults(self) -> int:
        """Disarm every fault; returns how many there were."""
        return self.state.reset_faults()

    # -- request log -----------------------------------------------------------------------------

    def requests(self, method: str | None = None, path_prefix: str | None = None) -> list[LoggedRequest]:
        """Logged requests (oldest first), optionally filtered by method and raw-path prefix."""
        with self.state.lock:
            entries = list(self.state.requests)
        return [copy.copy(e) for e in entries
                if (method is None or e.method == method.upper())
                and (path_prefix is None or e.path.startswith(path_prefix))]

    def clear_requests(self) -> None:
        with self.state.lock:
            self.state.requests.clear()

    # -- dispatch --------------------------------------------------------------------------------

    def _dispatch(self, method: str, raw_path: str, headers: dict[str, str], body: bytes) -> Reply | None:
        path = raw_path.split("?", 1)[0]
        if path == CONTROL_PREFIX or path.startswith(CONTROL_PREFIX + "/"):
            return self._control(method, path, raw_path, body)
        if self.state.dead:  # §7: a killed process answers nothing and logs nothing
            return None
        logged_headers = dict(headers)
        if "authorization" in logged_headers:
            logged_headers["authorization"] = logged_headers["authorization"].split(" ", 1)[0] + " <redacted>"
        entry = self.state.log_request(method, raw_path, logged_headers, body)
        reply = self._serve_api(method, path, headers, body)
        if reply is None:
            self.state.finish_request(entry, None, "dropped")
        else:
            self.state.finish_request(entry, reply.status, "answered")
            self.state.count_request(_route_label(_route(method, path)), method, reply.status)
        return reply

    def _serve_api(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Reply | None:
        public = (path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES) or self._whitelisted(path))
        if not public and not self.api.check_auth(headers):
            return _UNAUTHORIZED
        route = _route(method, path)
        if route.kind == "not_found":
            return Reply(404, b"Not Found", content_type="text/plain; charset=utf-8")
        if method not in route.allowed:
            return Reply(405, b"Method Not Allowed", content_type="text/plain; charset=utf-8",
                         headers=[("Allow", ", ".join(route.allowed))])
        target = route.target
        if route.kind == "providers" and method == "POST":
            target = _body_provider(body)
        if route.kind == "metrics" and not self.options.metrics_enabled:
            return Reply(404, b"Not Found", content_type="text/plain; charset=utf-8")
        fault = self.state.take_fault(method, target) if route.kind in _FAULTABLE else None
        if fault is None:
            return self._handle(method, route, headers, body)
        return self._with_fault(fault, method, route, headers, body)

    def _with_fault(self, fault: Fault, method: str, route: _Route, headers: dict[str, str],
                    body: bytes) -> Reply | None:
        if fault.kind == "garbage":
            return Reply(fault.status, fault.body.encode("utf-8"), content_type=fault.content_type)
        if fault.kind == "error":
            if fault.apply_write:
                reply = self._handle(method, route, headers, body)
                if reply is None or reply.status >= 400:
                    return reply
            return error_reply(fault.status, fault.message)
        if fault.kind == "slow":
            if fault.apply_write:
                reply = self._handle(method, route, headers, body)
                self._sleep(fault.delay)
                return reply
            self._sleep(fault.delay)
            return self._handle(method, route, headers, body)
        if fault.kind == "no_answer":
            if fault.apply_write:
                self._handle(method, route, headers, body)
            if fault.mode == "hang":
                self._sleep(fault.hang_seconds)
            return None
        # delete_after_read: answer the read, then the record disappears before the client's write
        reply = self._handle(method, route, headers, body)
        if route.kind == "provider" and route.name is not None:
            self.state.remove_record(route.name)
        return reply

    def _whitelisted(self, path: str) -> bool:
        with self.state.lock:
            routes = list(self.state.config.client_config.get("whitelisted_routes") or [])
        for item in routes:
            if not isinstance(item, str) or not item:
                continue
            if item.endswith("*") and path.startswith(item[:-1]):
                return True
            if path == item:
                return True
        return False

    def _handle(self, method: str, route: _Route, headers: dict[str, str], body: bytes) -> Reply | None:
        api = self.api
        kind = route.kind
        if kind == "metrics":
            from gatewayscope.sandbox.bifrost_emulator.runtime import exposition

            return Reply(200, exposition(self.state, metrics_goroutines=self.options.metrics_goroutines),
                         content_type=METRICS_CONTENT_TYPE)
        if kind == "health":
            return json_reply({"status": "ok"})
        if kind == "version":
            return json_reply(self.options.version)
        if kind == "config":
            return api.get_config() if method == "GET" else api.put_config(body)
        if kind == "login":
            return api.login(body)
        if kind == "logout":
            return api.logout(headers)
        if kind == "is_auth_enabled":
            return api.is_auth_enabled(headers)
        if kind == "providers":
            return api.list_providers() if method == "GET" else api.create_provider(body)
        if kind == "bad_name":
            return error_reply(400, f"Invalid provider: invalid provider parameter encoding: {route.error}")
        assert route.name is not None
        if kind == "provider":
            if method == "GET":
                return api.get_provider(route.name)
            if method == "PUT":
                return api.update_provider(route.name, body)
            return api.delete_provider(route.name)
        if kind == "keys" and method == "GET":
            return api.list_keys(route.name)
        return error_reply(501, "not implemented by the Bifrost emulator (keys sub-resource is read-only)")

    # -- emulator control namespace --------------------------------------------------------------

    def _control(self, method: str, path: str, raw_path: str, body: bytes) -> Reply:
        action = path[len(CONTROL_PREFIX):].strip("/")
        try:
            if action == "state" and method == "GET":
                return json_reply(self.state_snapshot())
            if action == "requests" and method == "GET":
                return json_reply({"requests": [e.to_json() for e in self.requests()]})
            if action == "requests" and method == "DELETE":
                self.clear_requests()
                return json_reply({"cleared": True})
            if action == "faults" and method == "GET":
                return json_reply({"faults": [f.to_json() for f in self.faults()]})
            if action == "faults" and method == "POST":
                return json_reply(self._fault_from_json(parse_json(body)).to_json())
            if action == "reset-faults" and method == "POST":
                return json_reply({"removed": self.reset_faults()})
            if action == "restart" and method == "POST":
                self.restart()
                return json_reply(self.runtime())
            if action == "seed" and method == "POST":
                from gatewayscope.sandbox.bifrost_emulator.seed import apply_seed
                spec = parse_json(body) if body.strip() else {}
                summary = apply_seed(self, str(spec.get("seed", "small")),
                                     rng_seed=spec.get("rng_seed"), live_port=spec.get("live_port"))
                return json_reply(summary.to_json())
        except (ValueError, TypeError) as err:
            return error_reply(400, f"emulator control: {err}")
        return error_reply(404, f"emulator control: no {method} {path}")

    def _fault_from_json(self, spec: Any) -> Fault:
        if not isinstance(spec, dict):
            raise ValueError("a fault is a JSON object")
        known = {"kind", "method", "target", "times", "status", "message", "delay", "apply_write", "mode",
                 "hang_seconds", "body", "content_type"}
        unknown = sorted(set(spec) - known)
        if unknown:
            raise ValueError(f"unknown fault fields: {', '.join(unknown)}")
        fault = Fault(**spec)
        if fault.kind == "error" and not fault.message:
            fault.message = _default_fault_message(fault.method, fault.target)
        if fault.kind == "no_answer" and "apply_write" not in spec:
            fault.apply_write = True
        return self.add_fault(fault)


def _route_label(route: _Route) -> str:
    """A route's pattern, as the HTTP series label it (a provider's name never becomes a label value)."""
    patterns = {"metrics": "/metrics", "health": "/health", "version": "/api/version", "config": "/api/config",
                "login": "/api/session/login", "logout": "/api/session/logout",
                "is_auth_enabled": "/api/session/is-auth-enabled", "providers": "/api/providers",
                "provider": "/api/providers/{provider}", "bad_name": "/api/providers/{provider}",
                "keys": "/api/providers/{provider}/keys", "unimplemented": "/api/providers/{provider}/*"}
    return patterns.get(route.kind, "unmatched")


def _default_fault_message(method: str, target: str) -> str:
    method = method.upper()
    key = (method, target) if target in (LIST, CONFIG, ANY) else (method, "provider")
    return _DEFAULT_FAULT_MESSAGES.get(key, "emulated fault")


def _body_provider(body: bytes) -> str | None:
    """The ``provider`` of a POST body, for fault matching (None when unreadable)."""
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if isinstance(parsed, dict) and isinstance(parsed.get("provider"), str):
        return str(parsed["provider"])
    return None
