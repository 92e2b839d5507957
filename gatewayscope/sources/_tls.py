"""One TLS context for every gateway client of the process.

httpx builds a new ``SSLContext`` for each ``Client``, loading the whole CA bundle again (milliseconds of
CPU each time, for plain-HTTP gateways too), and the exporter makes a client for every read of every
target. This is the context httpx would build by default (certifi's bundle, or ``SSL_CERT_FILE`` /
``SSL_CERT_DIR``), made once on first use and shared: an ``SSLContext`` is safe to use from many threads
and connections at once.
"""

from __future__ import annotations

import ssl
import threading

import httpx

_lock = threading.Lock()
_context: ssl.SSLContext | None = None


def shared_ssl_context() -> ssl.SSLContext:
    """httpx's default verifying context, built once per process."""
    global _context
    with _lock:
        if _context is None:
            _context = httpx.create_ssl_context()
        return _context
