"""The exporter's HTTP side: a stdlib threading server around one function that renders a registry.

Paths:

* ``/metrics``: the exporter's own metrics and every configured target (label ``target``);
* ``/probe?target=NAME``: one target (the multi-target pattern; an unknown or missing name is a 400
  that lists the configured targets; credentials stay in the config, never in the URL);
* ``/exporter-metrics``: the exporter's own metrics only (the second job of the multi-target pattern);
* ``/``: a landing page listing the targets with their last read, the kind of their error, and links
  (addresses and error messages only behind basic auth: see :meth:`Exporter.landing_page`);
* ``/-/healthy`` and ``/-/ready``: ``OK`` while the process serves (the liveness and readiness probes). They
  answer without basic auth, so a kubelet probe needs no credentials, and say nothing else.

Connections are served by at most ``max_threads`` worker threads; more wait in a queue (and, beyond
``MAX_QUEUED_CONNECTIONS``, in the listen backlog of ``LISTEN_BACKLOG``), never refused. While connections
wait, a worker closes its keep-alive connection after the answer it is writing, so idle clients do not
hold the workers others wait for.

Each scrape builds a fresh private :class:`CollectorRegistry` with the collectors it needs and renders
it with :func:`render` (text 0.0.4 or OpenMetrics, as the scraper's ``Accept`` asks; gzip when
accepted). The deadline for the targets' reads is ``X-Prometheus-Scrape-Timeout-Seconds`` minus
``scrape_timeout_margin_seconds`` (see :func:`read_budget`). With ``tls_cert_file``/``tls_key_file`` it
serves HTTPS (the handshake runs in the connection's own thread); with ``basic_auth_username`` every
path but the two probes asks for Basic credentials.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hmac
import html
import logging
import queue
import socket
import ssl
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote, urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from gatewayscope import __version__
from gatewayscope.config import Config, Target
from gatewayscope.errors import GatewayscopeError
from gatewayscope.exporter.cache import Reader, TargetCache, TargetResult
from gatewayscope.exporter.collectors import ExporterCollector, FindingsCache, TargetsCollector
from gatewayscope.exporter.settings import ExporterSettings, parse_listen
from gatewayscope.snapshot import Snapshot

if TYPE_CHECKING:
    from gatewayscope.heal.loop import HealLoop

log = logging.getLogger(__name__)

SCRAPE_TIMEOUT_HEADER = "X-Prometheus-Scrape-Timeout-Seconds"
#: the smallest read budget a scrape gets, however short its timeout
MIN_READ_BUDGET_SECONDS = 0.05
#: seconds a client has to finish the TLS handshake, and an idle keep-alive connection stays open
CONNECTION_TIMEOUT_SECONDS = 30.0
#: the listen backlog: connections the kernel holds while the accept loop waits for room in the queue
LISTEN_BACKLOG = max(128, socket.SOMAXCONN)
#: the most connections served at once, each by its own worker thread
MAX_HANDLER_THREADS = 32
#: accepted connections waiting for a worker; beyond it the accept loop waits and the backlog fills
MAX_QUEUED_CONNECTIONS = 1024
#: how often the discovery directory is looked at, at most (a scrape between two looks reuses the last)
DISCOVERY_INTERVAL_SECONDS = 1.0
#: each request to a discovered gateway may take this long in all (its config names no timeout)
DISCOVERED_TIMEOUT_SECONDS = 10.0
#: the liveness and readiness paths: served without basic auth (they only ever say OK), like a kubelet asks
PROBE_PATHS = ("/-/healthy", "/-/ready")
#: heal's kill switch (POST, behind basic auth like every path but the probes)
HEAL_PATHS = ("/-/heal/pause", "/-/heal/resume")


def render(registry: CollectorRegistry, accept: str | None = None) -> tuple[bytes, str]:
    """The one exposition function: ``registry`` in the format ``accept`` asks for -> (body, content type)."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type


def read_budget(header: str | None, settings: ExporterSettings) -> float:
    """Seconds the targets' reads may take in this scrape.

    Prometheus's scrape timeout (the header; ``default_scrape_timeout_seconds`` when absent or not a
    positive number) minus ``scrape_timeout_margin_seconds``, kept for rendering and the network; when
    the margin would take half the timeout or more, half the timeout.

    >>> s = ExporterSettings()
    >>> read_budget("10", s), read_budget(None, s), read_budget("0.8", s), read_budget("junk", s)
    (9.5, 9.5, 0.4, 9.5)
    """
    timeout = settings.default_scrape_timeout_seconds
    if header:
        try:
            value = float(header)
        except ValueError:
            value = 0.0
        if value > 0 and value == value and value != float("inf"):
            timeout = value
    margin = settings.scrape_timeout_margin_seconds
    budget = timeout - margin if margin < timeout / 2 else timeout / 2
    return max(MIN_READ_BUDGET_SECONDS, budget)


class Exporter:
    """The exporter without HTTP: targets, settings, the per-target cache, and the registries per scrape."""

    def __init__(self, config: Config, settings: ExporterSettings, *, reader: Reader | None = None,
                 transports: dict[str, Any] | None = None, heal: HealLoop | None = None) -> None:
        self.config = config
        self.settings = settings
        #: the heal loop this exporter serves the metrics and the pause switch of (``export --heal``), or None
        self.heal = heal
        # with a heal that shares its reads, every read is one a plan can be made from (fingerprints, and the
        # sessions heal's journals record as deleted)
        shares = heal is not None and heal.shares_reads
        self.cache = TargetCache(config.targets, config.policy, min_interval_seconds=settings.min_interval_seconds,
                                 reader=reader, transports=transports,
                                 full_read_interval_seconds=settings.full_read_interval_seconds,
                                 plan_reads=shares, also=heal.known_deleted if heal is not None and shares else None)
        #: the findings of each target's last read, so a scrape served from the cache does not analyse again
        self.findings = FindingsCache()
        self._discovered: list[Target] = []
        self._discovered_at: float | None = None
        self._discovery_lock = threading.Lock()

    @property
    def targets(self) -> list[Target]:
        """The configured targets, then the guarded gateways announced in ``discovery_dir`` whose process runs
        (looked up at most once a second; a name a configured target has is left to it)."""
        return [*self.config.targets, *self.discovered()]

    def discovered(self) -> list[Target]:
        """The targets the discovery directory holds now (see :mod:`gatewayscope.guard.discovery`)."""
        directory = self.settings.discovery_dir
        if not directory:
            return []
        with self._discovery_lock:
            now = self.cache.clock()
            if self._discovered_at is None or now - self._discovered_at >= DISCOVERY_INTERVAL_SECONDS:
                from gatewayscope.guard.discovery import discover

                named = {t.name for t in self.config.targets}
                before = {t.name for t in self._discovered}
                self._discovered = [
                    Target(name=entry.name, kind="rllm", url=entry.url, timeout_seconds=DISCOVERED_TIMEOUT_SECONDS)
                    for entry in discover(directory) if entry.name not in named]
                self._discovered_at = now
                gone = before - {t.name for t in self._discovered}
                if gone:
                    self.cache.forget(gone)
                    log.info("discovery: %s gone", ", ".join(sorted(gone)))
            return list(self._discovered)

    def find_target(self, name: str) -> Target | None:
        return next((t for t in self.targets if t.name == name), None)

    def _targets_collector(self, results: Sequence[TargetResult]) -> TargetsCollector:
        return TargetsCollector(results, self.config.policy, max_record_series=self.settings.max_record_series,
                                min_interval_seconds=self.settings.min_interval_seconds, cache=self.findings)

    def metrics_registry(self, budget: float) -> CollectorRegistry:
        """``/metrics``: the exporter's own metrics and every target's, reads bounded by ``budget`` seconds."""
        results = self.cache.fetch(self.targets, budget)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(ExporterCollector(self.cache.counters))
        self._register_heal(registry)
        registry.register(self._targets_collector(results))
        return registry

    def _register_heal(self, registry: CollectorRegistry) -> None:
        if self.heal is not None:
            from gatewayscope.heal.metrics import HealCollector

            registry.register(HealCollector(self.heal))

    def read_for_heal(self, config: Config, deleted: Any) -> Snapshot:
        """Heal's read of ``config``'s targets through this exporter's per-target cache (one read serves both)."""
        timeout = max([t.timeout_seconds for t in config.targets] or [DISCOVERED_TIMEOUT_SECONDS]) * 3
        results = self.cache.fetch(config.targets, timeout)
        taken_at = min((r.snapshot.started_at for r in results), default=self.cache.wall_clock())
        return Snapshot(taken_at=taken_at, targets=[r.snapshot for r in results])

    def probe_registry(self, target: Target, budget: float) -> CollectorRegistry:
        """``/probe?target=NAME``: one target's metrics."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self._targets_collector(self.cache.fetch([target], budget)))
        return registry

    def self_registry(self) -> CollectorRegistry:
        """``/exporter-metrics``: only the exporter's own metrics (reads no target)."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(ExporterCollector(self.cache.counters))
        self._register_heal(registry)
        return registry

    def landing_page(self, *, detailed: bool = False) -> str:
        """The HTML of ``/``: every target's name and whether its last read succeeded, and links to every path.

        Only ``detailed`` pages (served to a request that passed the configured basic auth) show each target's
        kind, address, read times and error message: they name internal hosts and paths, and anyone who reaches an
        exporter without basic auth could read them. Other pages show the kind of a target's error (``timeout``,
        ``store``, ...: one of a fixed set of words, see :mod:`gatewayscope.errors`); the message itself is in
        the exporter's log (:func:`gatewayscope.exporter.cache.log_error_change`).
        """
        state = self.cache.counters()
        now = self.cache.clock()
        rows = []
        for target in self.targets:
            entry = state.get(target.name, {})
            last = entry.get("last")
            kind = ""
            if last is None:
                status, detail = "not read yet", ""
            else:
                snap = last.snapshot
                status = "up" if snap.up else "down"
                detail = f"{now - last.finished_mono:.0f} s ago, took {snap.duration_seconds:.2f} s"
                if snap.error:
                    detail += f": {snap.error}"
                    kind = snap.error_kind or "error"
            if entry.get("in_flight"):
                detail += " (a read is running)"
            link = f"/probe?target={quote(target.name, safe='')}"
            cells = [f"<a href=\"{html.escape(link)}\">{html.escape(target.name)}</a>"]
            if detailed:
                cells += [html.escape(target.kind), html.escape(target.address), html.escape(status),
                          html.escape(detail)]
            else:
                cells += [html.escape(status), html.escape(kind)]
            rows.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
        columns = (("target", "kind", "address", "last read", "detail") if detailed
                   else ("target", "last read", "error kind"))
        table = "\n".join(rows) or f"<tr><td colspan=\"{len(columns)}\">no targets configured</td></tr>"
        header = "".join(f"<th>{name}</th>" for name in columns)
        note = "" if detailed else ("<p>Addresses and error messages are shown only when the exporter requires "
                                    "basic auth (basic_auth_username in its [exporter] table); the exporter's log "
                                    "has every target's error, once each time it changes.</p>\n")
        settings = self.settings
        return (
            "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>gatewayscope exporter</title></head>\n"
            f"<body><h1>gatewayscope exporter {html.escape(__version__)}</h1>\n"
            "<p><a href=\"/metrics\">/metrics</a>: this exporter's own metrics and every target's.<br>\n"
            "<a href=\"/exporter-metrics\">/exporter-metrics</a>: this exporter's own metrics only.<br>\n"
            "/probe?target=NAME: one target (the multi-target pattern).</p>\n"
            f"<p>Each target is read at most once every {settings.min_interval_seconds:g} s "
            "(min_interval_seconds); scrapes in between get its last read.</p>\n"
            f"{note}<table border=\"1\" cellpadding=\"4\">\n"
            f"<tr>{header}</tr>\n"
            f"{table}\n</table>\n</body></html>\n"
        )


class _Handler(BaseHTTPRequestHandler):
    server: ExporterServer
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY: headers and body go out as two writes; with Nagle on, a keep-alive scraper (Prometheus
    # reuses its connection) waits for its own delayed ACK of the headers before the body leaves
    # (docs/performance.md, "Figures behind the code")
    disable_nagle_algorithm = True
    timeout = CONNECTION_TIMEOUT_SECONDS
    server_version = f"gatewayscope-exporter/{__version__}"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def handle(self) -> None:
        """Serve the connection's requests; while other connections wait for a worker, close it after this
        answer instead of keeping it alive (an idle keep-alive client would hold the worker)."""
        self.close_connection = True
        self.handle_one_request()
        while not self.close_connection:
            if self.server.connections_waiting():
                self.close_connection = True
                break
            self.handle_one_request()

    def _send(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        encoding = self.headers.get("Accept-Encoding", "") or ""
        if len(body) > 1024 and "gzip" in encoding.lower():
            body = gzip.compress(body)
            headers = {**(headers or {}), "Content-Encoding": "gzip"}
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _text(self, status: int, text: str, headers: dict[str, str] | None = None) -> None:
        self._send(status, text.encode(), "text/plain; charset=utf-8", headers)

    def _authorized(self) -> bool:
        expected = self.server.basic_auth
        if expected is None:
            return True
        header = self.headers.get("Authorization", "") or ""
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        user, sep, password = decoded.partition(b":")
        want_user, want_password = expected
        user_ok = hmac.compare_digest(user, want_user.encode())
        password_ok = hmac.compare_digest(password, want_password.encode())
        return bool(sep) and user_ok and password_ok

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        if parts.path in PROBE_PATHS:
            self._text(200, "OK\n")
            return
        if not self._authorized():
            self._text(401, "gatewayscope exporter: authentication required\n",
                       {"WWW-Authenticate": 'Basic realm="gatewayscope exporter", charset="UTF-8"'})
            return
        exporter = self.server.exporter
        try:
            if parts.path == "/metrics":
                budget = read_budget(self.headers.get(SCRAPE_TIMEOUT_HEADER), exporter.settings)
                self._registry(exporter.metrics_registry(budget))
            elif parts.path == "/probe":
                self._probe(parse_qs(parts.query))
            elif parts.path == "/exporter-metrics":
                self._registry(exporter.self_registry())
            elif parts.path == "/":
                # every request got past _authorized: with basic auth configured, this one carried it
                page = exporter.landing_page(detailed=self.server.basic_auth is not None)
                self._send(200, page.encode(), "text/html; charset=utf-8")
            else:
                self._text(404, f"gatewayscope exporter: no page {parts.path}; see / for the paths.\n")
        except (BrokenPipeError, ConnectionResetError):
            raise
        except Exception as err:  # a bug: say so, keep serving
            log.exception("serving %s failed", parts.path)
            self._text(500, f"gatewayscope exporter: internal error ({type(err).__name__}); see its log.\n")

    def do_POST(self) -> None:
        parts = urlsplit(self.path)
        # a POST's body is never read: drop the connection after the answer instead of parsing what follows
        self.close_connection = True
        if not self._authorized():
            self._text(401, "gatewayscope exporter: authentication required\n",
                       {"WWW-Authenticate": 'Basic realm="gatewayscope exporter", charset="UTF-8"'})
            return
        heal = self.server.exporter.heal
        if parts.path not in HEAL_PATHS:
            self._text(404, f"gatewayscope exporter: no page {parts.path} to POST to.\n")
            return
        if heal is None:
            self._text(404, "gatewayscope exporter: heal is not running here (start it with 'gatewayscope export "
                            "--heal').\n")
            return
        who = f"POST {parts.path} from {self.address_string()}"
        try:
            if parts.path == "/-/heal/pause":
                heal.pause(who)
                self._text(200, "heal paused: no write starts until it is resumed\n")
            else:
                heal.resume(who)
                self._text(200, "heal resumed\n")
        except (OSError, GatewayscopeError) as err:
            log.warning("%s failed: %s", who, err)
            self._text(500, f"gatewayscope exporter: {parts.path} failed: {err}\n")

    def _registry(self, registry: CollectorRegistry) -> None:
        body, content_type = render(registry, self.headers.get("Accept"))
        self._send(200, body, content_type)

    def _probe(self, query: dict[str, list[str]]) -> None:
        exporter = self.server.exporter
        known = ", ".join(t.name for t in exporter.targets) or "none"
        names = query.get("target", [])
        if len(names) != 1 or not names[0]:
            self._text(400, f"gatewayscope exporter: /probe needs exactly one ?target=NAME; "
                            f"configured targets: {known}.\n")
            return
        target = exporter.find_target(names[0])
        if target is None:
            self._text(400, f"gatewayscope exporter: unknown target {names[0]!r}; configured targets: {known}. "
                            "Targets (and their credentials) come from the exporter's config file.\n")
            return
        budget = read_budget(self.headers.get(SCRAPE_TIMEOUT_HEADER), exporter.settings)
        self._registry(exporter.probe_registry(target, budget))


class ExporterServer(HTTPServer):
    """An HTTP(S) server for one :class:`Exporter`, its connections served by a bounded pool of worker threads.

    At most ``max_threads`` connections are served at once, each by one daemon worker thread (started when
    needed, kept for the next connection). Accepted connections beyond them wait in a queue; when
    ``max_queued`` wait, the accept loop waits too and new connections wait in the listen backlog. None is
    refused. ``start()`` serves in a background thread.
    """

    allow_reuse_address = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, exporter: Exporter, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None,
                 basic_auth: tuple[str, str] | None = None, max_threads: int = MAX_HANDLER_THREADS,
                 max_queued: int = MAX_QUEUED_CONNECTIONS) -> None:
        if max_threads < 1 or max_queued < 0:
            raise ValueError("max_threads must be at least 1 and max_queued at least 0")
        self.exporter = exporter
        self.ssl_context = ssl_context
        self.basic_auth = basic_auth
        self.max_threads = max_threads
        if ":" in host:
            self.address_family = socket.AF_INET6
        #: a place for every connection served or waiting; the accept loop takes one before it queues
        self._places = threading.BoundedSemaphore(max_threads + max_queued)
        self._connections: queue.SimpleQueue[tuple[Any, Any] | None] = queue.SimpleQueue()
        self._pool_lock = threading.Lock()
        self._workers = 0  # worker threads alive
        self._idle = 0  # workers waiting for a connection
        self._waiting = 0  # connections queued, not yet taken by a worker
        self._closing = threading.Event()
        super().__init__((host, port), _Handler)
        self._thread: threading.Thread | None = None

    # -- the worker pool ---------------------------------------------------------------------------

    def connections_waiting(self) -> bool:
        """Whether accepted connections are waiting for a worker."""
        with self._pool_lock:
            return self._waiting > 0

    def process_request(self, request: Any, client_address: Any) -> None:
        """Queue the connection for a worker, starting one when every live worker is busy and there is room."""
        while not self._places.acquire(timeout=0.2):
            if self._closing.is_set():
                self.shutdown_request(request)
                return
        with self._pool_lock:
            self._waiting += 1
            start = self._waiting > self._idle and self._workers < self.max_threads
            if start:
                self._workers += 1
        self._connections.put((request, client_address))
        if start:
            try:
                threading.Thread(target=self._work, name="gatewayscope-exporter-conn", daemon=True).start()
            except RuntimeError:  # no thread to be had: the live workers take the connection in turn
                log.warning("could not start an exporter worker thread; %d serve the queue", self._workers - 1)
                with self._pool_lock:
                    self._workers -= 1

    def _work(self) -> None:
        """A worker: serve queued connections one after another until the server closes."""
        while True:
            with self._pool_lock:
                self._idle += 1
            item = self._connections.get()
            with self._pool_lock:
                self._idle -= 1
                if item is None:
                    self._workers -= 1
                    return
                self._waiting -= 1
            request, client_address = item
            try:
                self.finish_request(request, client_address)
            except Exception:
                self.handle_error(request, client_address)
            finally:
                self.shutdown_request(request)
                self._places.release()

    def shutdown(self) -> None:
        """Stop the accept loop (one waiting for a place in the queue gives up and closes its connection)."""
        self._closing.set()
        super().shutdown()

    def server_close(self) -> None:
        """Close the socket, drop the connections still waiting, and let every worker end after its own."""
        self._closing.set()
        super().server_close()
        while True:
            try:
                item = self._connections.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                with self._pool_lock:
                    self._waiting -= 1
                self.shutdown_request(item[0])
                self._places.release()
        with self._pool_lock:
            workers = self._workers
        for _ in range(workers):
            self._connections.put(None)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        """The base URL to reach it (``127.0.0.1`` when it listens on every interface)."""
        host = str(self.server_address[0])
        if host in ("", "0.0.0.0"):
            host = "127.0.0.1"
        elif host in ("::",):
            host = "::1"
        if ":" in host:
            host = f"[{host}]"
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://{host}:{self.port}"

    def finish_request(self, request: Any, client_address: Any) -> None:
        """Serve one connection, after the TLS handshake (in this connection's thread) when TLS is on."""
        if self.ssl_context is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(CONNECTION_TIMEOUT_SECONDS)
        try:
            tls = self.ssl_context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as err:
            log.debug("TLS handshake with %s failed: %s", client_address, err)
            return
        try:
            self.RequestHandlerClass(tls, client_address, self)  # type: ignore[arg-type]
        finally:
            tls.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-answer is routine: log it quietly instead of printing a traceback."""
        log.debug("connection from %s ended with an error", client_address, exc_info=True)

    def start(self) -> ExporterServer:
        """Serve in a daemon thread; returns self."""
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="gatewayscope-exporter", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket; safe to call twice."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join(timeout=10)
            self._thread = None
        self.server_close()

    def __enter__(self) -> ExporterServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def make_server(config: Config, settings: ExporterSettings, *, listen: str | None = None,
                reader: Reader | None = None, transports: dict[str, Any] | None = None,
                heal: HealLoop | None = None) -> ExporterServer:
    """An exporter server for ``config``: resolves the password and loads TLS now (ConfigError if they fail).

    ``listen`` (``HOST:PORT``) overrides ``settings.listen``; port 0 picks a free port (see ``.port``).
    """
    from gatewayscope.errors import ConfigError

    address = listen or settings.listen
    try:
        host, port = parse_listen(address)
    except ValueError as err:
        raise ConfigError(f"listen: {err}") from None
    basic_auth = (settings.resolve_username(), settings.resolve_password()) if settings.basic_auth else None
    context = settings.ssl_context()
    exporter = Exporter(config, settings, reader=reader, transports=transports, heal=heal)
    if heal is not None and heal.shares_reads:
        heal.read = exporter.read_for_heal
    try:
        return ExporterServer(exporter, host, port, ssl_context=context, basic_auth=basic_auth)
    except OSError as err:
        raise ConfigError(f"listen: cannot listen on {address}: {err.strerror or err}") from None


def wait_forever(server: ExporterServer, stop: threading.Event) -> None:
    """Serve until ``stop`` is set (the CLI sets it from SIGINT/SIGTERM), then stop the server."""
    server.start()
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
