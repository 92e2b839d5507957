"""Small Go look-alikes the emulator needs so its error texts read like the real gateway's.

* :func:`path_unescape` behaves like Go's ``url.PathUnescape`` (``+`` stays ``+``, a bad escape is an
  error naming it).
* :func:`parse_duration` / :func:`format_duration` follow Go's ``time.ParseDuration`` and
  ``Duration.String`` for the values the management API handles (retry backoffs).
* :func:`lookup_ip` is a DNS lookup bounded in time whose failures read like Go's ``net.LookupIP``
  errors (``lookup foo.invalid: no such host``).
"""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Callable

NANOSECOND = 1
MICROSECOND = 1_000
MILLISECOND = 1_000_000
SECOND = 1_000_000_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE

_UNITS = {
    "ns": NANOSECOND,
    "us": MICROSECOND,
    "µs": MICROSECOND,  # U+00B5
    "μs": MICROSECOND,  # U+03BC
    "ms": MILLISECOND,
    "s": SECOND,
    "m": MINUTE,
    "h": HOUR,
}
_DURATION_PART = re.compile(r"([0-9]*(?:\.[0-9]*)?)([a-zµμ]+)")

Resolver = Callable[[str], list[str]]


class EscapeError(ValueError):
    """A ``%`` escape that is not two hex digits (Go: ``invalid URL escape "%zz"``)."""


class DurationError(ValueError):
    """A string Go's ``time.ParseDuration`` would refuse."""


class LookupError_(Exception):
    """A failed DNS lookup; ``str(err)`` is Go's text, e.g. ``lookup foo.invalid: no such host``."""


def path_unescape(value: str) -> str:
    """Decode ``%XX`` escapes like Go's ``url.PathUnescape``.

    >>> path_unescape("org__x%2Fy")
    'org__x/y'
    >>> path_unescape("a+b")
    'a+b'
    """
    out = bytearray()
    i = 0
    raw = value.encode("utf-8", errors="surrogateescape")
    while i < len(raw):
        ch = raw[i]
        if ch == 0x25:  # '%'
            chunk = raw[i:i + 3]
            if len(chunk) < 3 or not all(c in b"0123456789abcdefABCDEF" for c in chunk[1:]):
                shown = chunk.decode("utf-8", errors="replace")
                raise EscapeError(f'invalid URL escape "{shown}"')
            out.append(int(chunk[1:].decode("ascii"), 16))
            i += 3
            continue
        out.append(ch)
        i += 1
    return out.decode("utf-8", errors="replace")


def parse_duration(text: str) -> int:
    """Parse a Go duration string (``"500ms"``, ``"1m30s"``, ``"1.5s"``) into nanoseconds.

    >>> parse_duration("500ms")
    500000000
    >>> parse_duration("16m40s") == 1000 * SECOND
    True
    """
    original = text
    if not text:
        raise DurationError('time: invalid duration ""')
    sign = 1
    if text[0] in "+-":
        sign = -1 if text[0] == "-" else 1
        text = text[1:]
    if text == "0":
        return 0
    if not text:
        raise DurationError(f'time: invalid duration "{original}"')
    total = 0.0
    pos = 0
    while pos < len(text):
        match = _DURATION_PART.match(text, pos)
        if not match or match.group(1) in ("", "."):
            raise DurationError(f'time: invalid duration "{original}"')
        unit = _UNITS.get(match.group(2))
        if unit is None:
            raise DurationError(f'time: unknown unit "{match.group(2)}" in duration "{original}"')
        total += float(match.group(1)) * unit
        pos = match.end()
    return sign * round(total)


def format_duration(nanos: int) -> str:
    """Render nanoseconds like Go's ``Duration.String`` (enough for whole ms and above).

    >>> format_duration(100 * MILLISECOND)
    '100ms'
    >>> format_duration(1000 * SECOND)
    '16m40s'
    """
    if nanos == 0:
        return "0s"
    sign = "-" if nanos < 0 else ""
    nanos = abs(nanos)
    if nanos < SECOND:
        for unit, size in (("ms", MILLISECOND), ("µs", MICROSECOND)):
            if nanos >= size:
                return sign + _trim(nanos / size) + unit
        return f"{sign}{nanos}ns"
    hours, rest = divmod(nanos, HOUR)
    minutes, rest = divmod(rest, MINUTE)
    seconds = _trim(rest / SECOND)
    if hours:
        return f"{sign}{hours}h{minutes}m{seconds}s"
    if minutes:
        return f"{sign}{minutes}m{seconds}s"
    return f"{sign}{seconds}s"


def _trim(value: float) -> str:
    text = f"{value:.9f}".rstrip("0").rstrip(".")
    return text or "0"


def system_resolver(host: str) -> list[str]:
    """Every address the system resolver gives for ``host`` (IPv6 zone ids dropped), in order."""
    seen: list[str] = []
    for info in socket.getaddrinfo(host, None):
        address = str(info[4][0]).split("%", 1)[0]
        if address not in seen:
            seen.append(address)
    return seen


def lookup_ip(host: str, *, timeout: float, resolver: Resolver | None = None) -> list[str]:
    """Resolve ``host`` in a worker thread, giving up after ``timeout`` seconds.

    Raises :class:`LookupError_` with Go-like text: ``lookup <host>: no such host`` when the name
    does not exist, ``lookup <host>: i/o timeout`` when the resolver did not answer in time.
    """
    resolve = resolver or system_resolver
    result: dict[str, object] = {}
    done = threading.Event()

    def work() -> None:
        try:
            result["ips"] = resolve(host)
        except BaseException as err:
            result["err"] = err
        finally:
            done.set()

    worker = threading.Thread(target=work, name=f"bifrost-emulator-dns:{host}", daemon=True)
    worker.start()
    if not done.wait(timeout):
        raise LookupError_(f"lookup {host}: i/o timeout")
    err = result.get("err")
    if err is not None:
        raise LookupError_(_go_lookup_text(host, err))
    ips = list(result.get("ips") or [])  # type: ignore[call-overload]
    if not ips:
        raise LookupError_(f"lookup {host}: no such host")
    return [str(ip) for ip in ips]


def _go_lookup_text(host: str, err: object) -> str:
    if isinstance(err, LookupError_):
        return str(err)
    if isinstance(err, socket.gaierror):
        code = err.args[0] if err.args else None
        no_such_host = {getattr(socket, name) for name in ("EAI_NONAME", "EAI_NODATA") if hasattr(socket, name)}
        if code in no_such_host:
            return f"lookup {host}: no such host"
        if code == getattr(socket, "EAI_AGAIN", object()):
            return f"lookup {host}: server misbehaving"
        return f"lookup {host}: {err.args[1] if len(err.args) > 1 else err}"
    if isinstance(err, (TimeoutError, socket.timeout)):
        return f"lookup {host}: i/o timeout"
    return f"lookup {host}: {err}"
