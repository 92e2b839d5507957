"""HTTP servers that misbehave on purpose, on a free loopback port, for the tests of the clients' limits.

Import as ``from tests.hostile import HostileServer, drip_body`` (pytest puts the project root on ``sys.path``).
A :class:`HostileServer` reads each request's head and hands the connection to a behaviour, which writes
whatever it likes until the server is stopped or the client goes away. Every loop here checks the stop
event at least every ``POLL`` seconds, and :meth:`HostileServer.stop` joins every thread it started.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

#: seconds between checks of the stop event in every blocking loop
POLL = 0.1
#: most connections served at once; more are closed on arrival
MAX_CONNECTIONS = 32

Behaviour = Callable[[socket.socket, threading.Event], None]


def send(conn: socket.socket, data: bytes, stop: threading.Event) -> bool:
    """Send all of ``data`` unless the server stops or the client goes away first; True when all was sent."""
    view = memoryview(data)
    while view:
        if stop.is_set():
            return False
        try:
            sent = conn.send(view)
        except TimeoutError:
            continue
        except OSError:
            return False
        view = view[sent:]
    return True


def drip_body(interval: float = 0.5) -> Behaviour:
    """Headers at once (a JSON body of a million bytes announced), then one byte of it every ``interval``."""
    def behave(conn: socket.socket, stop: threading.Event) -> None:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n["
        if not send(conn, head, stop):
            return
        while not stop.wait(interval) and send(conn, b" ", stop):
            pass
    return behave


def drip_head(interval: float = 0.5) -> Behaviour:
    """The status line and headers themselves, one byte every ``interval`` (they never end)."""
    def behave(conn: socket.socket, stop: threading.Event) -> None:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + b"X-Pad: " + b"a" * 100_000
        for index in range(len(head)):
            if stop.wait(interval) or not send(conn, head[index:index + 1], stop):
                return
    return behave


def huge_length(length: int = 300 * 10**9) -> Behaviour:
    """A ``Content-Length`` of ``length`` bytes, then bytes of it (spaces) as fast as the client takes them."""
    def behave(conn: socket.socket, stop: threading.Event) -> None:
        head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n".encode()
        if not send(conn, head, stop):
            return
        chunk = b" " * 65536
        while send(conn, chunk, stop):
            pass
    return behave


def endless_chunked() -> Behaviour:
    """A chunked JSON body that never ends (``[`` then spaces), as fast as the client takes it."""
    def behave(conn: socket.socket, stop: threading.Event) -> None:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n[\r\n"
        if not send(conn, head, stop):
            return
        chunk = b"10000\r\n" + b" " * 65536 + b"\r\n"
        while send(conn, chunk, stop):
            pass
    return behave


def redirect(location: str, status: int = 302) -> Behaviour:
    """A redirect to ``location`` with an empty body."""
    def behave(conn: socket.socket, stop: threading.Event) -> None:
        send(conn, f"HTTP/1.1 {status} Found\r\nLocation: {location}\r\nContent-Length: 0\r\n"
                   "Connection: close\r\n\r\n".encode(), stop)
    return behave


class HostileServer:
    """A raw-socket HTTP server on a free loopback port answering every request with ``behaviour``."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.stop_event = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.listener.settimeout(POLL)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._acceptor = threading.Thread(target=self._accept, name="hostile-accept", daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while not self.stop_event.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self._threads = [t for t in self._threads if t.is_alive()]
                if len(self._threads) >= MAX_CONNECTIONS:
                    conn.close()
                    continue
                thread = threading.Thread(target=self._serve, args=(conn,), name="hostile-conn", daemon=True)
                self._threads.append(thread)
            thread.start()

    def _read_head(self, conn: socket.socket) -> bool:
        """Read the request up to the end of its headers (any body is left unread)."""
        data = b""
        while b"\r\n\r\n" not in data and len(data) < 65536:
            if self.stop_event.is_set():
                return False
            try:
                part = conn.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return False
            if not part:
                return False
            data += part
        return True

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(POLL)
        try:
            if self._read_head(conn):
                self.behaviour(conn, self.stop_event)
        finally:
            conn.close()

    def stop(self) -> None:
        self.stop_event.set()
        self.listener.close()
        self._acceptor.join(timeout=5)
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=5)


@contextmanager
def hostile(behaviour: Behaviour) -> Iterator[HostileServer]:
    """A :class:`HostileServer`, stopped (every thread joined) on the way out."""
    server = HostileServer(behaviour)
    try:
        yield server
    finally:
        server.stop()


def answer(body: bytes, *, status: str = "200 OK", content_type: str = "application/json") -> Behaviour:
    """One whole answer of ``body`` (Content-Length set, connection closed after it)."""
    def behave(conn: socket.socket, stop: threading.Event) -> None:
        send(conn, f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
                   "Connection: close\r\n\r\n".encode() + body, stop)
    return behave


def deep_json(levels: int = 200_000) -> Behaviour:
    """A JSON body nested ``levels`` arrays deep (Python's json recurses once per level)."""
    return answer(b"[" * levels + b"]" * levels)


def not_json() -> Behaviour:
    """A 200 answer that claims JSON and is not (bytes that decode as no text either)."""
    return answer(b"\xff\xfe<html>\x00\x1b[2J not json")
