"""Whether the hosts of Bifrost's base URLs resolve from here: bounded, concurrent, cached lookups.

:func:`base_url_host` is the one rule for the host a base URL names: the read picks the hosts it looks up
with it and the analysis matches records to their lookups with it, so the two always agree.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import polars as pl

from gatewayscope.snapshot import REACHABILITY_SCHEMA, frame_from_rows

#: a DNS check of one base URL host gives up after this long
DNS_TIMEOUT_SECONDS = 5.0
#: a DNS answer is reused for this long within one process
DNS_CACHE_TTL_SECONDS = 60.0

# scheme://[userinfo@](host | [ipv6])  -- the host a record's base URL names
_HOST_PATTERN = r"^[A-Za-z][A-Za-z0-9+.\-]*://(?:[^@/?#]*@)?(?:\[([^\]/]+)\]|([^:/?#\[\]]+))"


def base_url_host(base_url: pl.Expr) -> pl.Expr:
    """The host a base URL names (lower case, no brackets, no port), or null when it has none.

    >>> urls = ["https://API.example.com:8443/v1", "http://[::1]:9/x", "", None, "nourl"]
    >>> frame = pl.DataFrame({"u": urls})
    >>> frame.select(base_url_host(pl.col("u")).alias("host"))["host"].to_list()
    ['api.example.com', '::1', None, None, None]
    """
    bracketed = base_url.str.extract(_HOST_PATTERN, 1)
    plain = base_url.str.extract(_HOST_PATTERN, 2)
    host = pl.coalesce(bracketed, plain).str.to_lowercase().str.strip_chars_end(".")
    return pl.when(host.str.len_chars() > 0).then(host).otherwise(None)


def _system_lookup(host: str) -> None:
    socket.getaddrinfo(host, None)


@dataclass
class _Answer:
    resolves: bool
    error: str | None
    at: float


class HostResolver:
    """Checks whether hosts resolve, concurrently, each lookup bounded, answers cached for a short TTL.

    ``lookup(host)`` raises ``OSError`` (or anything) when the host does not resolve; the default is
    ``socket.getaddrinfo``. A lookup still running after ``timeout`` seconds is abandoned (its
    daemon thread finishes on its own) and the host counts as not resolving.
    """

    def __init__(self, lookup: Callable[[str], Any] | None = None, *, timeout: float = DNS_TIMEOUT_SECONDS,
                 ttl: float = DNS_CACHE_TTL_SECONDS) -> None:
        self.lookup = lookup or _system_lookup
        self.timeout = timeout
        self.ttl = ttl
        self._cache: dict[str, _Answer] = {}
        self._lock = threading.Lock()

    def _resolve(self, host: str) -> tuple[bool, str | None]:
        try:
            self.lookup(host)
        except socket.gaierror as err:
            return False, err.strerror or str(err)
        except Exception as err:  # any failure means "does not resolve from here"
            return False, str(err) or type(err).__name__
        return True, None

    def _lookup_all(self, hosts: list[str], concurrency: int) -> list[tuple[bool, str | None]]:
        """Look ``hosts`` up on at most ``concurrency`` daemon threads at a time, each lookup bounded by
        ``timeout``: one still running then is abandoned (its thread finishes on its own and leaves the
        queue to a fresh thread), and its host counts as not resolving. A few threads serve every host,
        instead of one thread per lookup."""
        results: dict[int, tuple[bool, str | None]] = {}
        queue = deque(enumerate(hosts))
        running: dict[int, float] = {}  # index -> when its lookup started (monotonic)
        cond = threading.Condition()

        def worker() -> None:
            while True:
                with cond:
                    if not queue:
                        return
                    index, host = queue.popleft()
                    running[index] = time.monotonic()
                outcome = self._resolve(host)
                with cond:
                    abandoned = running.pop(index, None) is None
                    if not abandoned:
                        results[index] = outcome
                    cond.notify_all()
                if abandoned:
                    return

        def spawn() -> None:
            threading.Thread(target=worker, name="gatewayscope-dns", daemon=True).start()

        for _ in range(max(1, min(concurrency, len(hosts)))):
            spawn()
        with cond:
            while len(results) < len(hosts):
                now = time.monotonic()
                for index, started in list(running.items()):
                    if now - started >= self.timeout:
                        del running[index]
                        results[index] = (False, f"lookup timed out after {self.timeout:g} s")
                        spawn()
                wake = min(running.values(), default=now) + self.timeout
                cond.wait(timeout=max(0.001, wake - now))
        return [results[index] for index in range(len(hosts))]

    def check(self, hosts: Iterable[str], *, concurrency: int = 8, now: float | None = None) -> pl.DataFrame:
        """A REACHABILITY_SCHEMA frame for the distinct ``hosts``, looked up ``concurrency`` at a time.

        ``now`` (epoch seconds, default the wall clock) stamps new answers and ages cached ones.
        """
        stamp = time.time() if now is None else now
        wanted = sorted({h for h in hosts if h})
        answers: dict[str, _Answer] = {}
        missing: list[str] = []
        with self._lock:
            for host in wanted:
                cached = self._cache.get(host)
                if cached is not None and 0 <= stamp - cached.at < self.ttl:
                    answers[host] = cached
                else:
                    missing.append(host)
        if missing:
            results = self._lookup_all(missing, concurrency)
            with self._lock:
                for host, (resolves, error) in zip(missing, results, strict=True):
                    answer = _Answer(resolves, error, stamp)
                    self._cache[host] = answer
                    answers[host] = answer
        rows = [(host, answers[host].resolves, answers[host].error) for host in wanted]
        return frame_from_rows(rows, REACHABILITY_SCHEMA)


#: the process-wide resolver (and cache) read_bifrost uses unless told otherwise
DEFAULT_RESOLVER = HostResolver()
