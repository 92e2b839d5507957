"""Reading a Bifrost gateway's own Prometheus metrics: what its process holds, for the boot-memory model.

The gateway's telemetry plugin serves ``/metrics`` with the Go runtime and process collectors (on by default
where the plugin is enabled). gatewayscope reads three of their series, ``go_goroutines``,
``go_memstats_stack_inuse_bytes`` and ``process_resident_memory_bytes`` (and keeps
``go_memstats_heap_inuse_bytes`` and ``go_memstats_sys_bytes`` when present), into a
:class:`~gatewayscope.snapshot.RuntimeMetrics`; :mod:`gatewayscope.analysis.memory` turns them into a
prediction.

The answer is hostile input like any other: the read is bounded in time (the target's ``timeout_seconds``
for the whole exchange) and size (:data:`METRICS_MAX_BODY_BYTES`, or the target's ``max_body_bytes`` when
smaller), follows no redirect, and only the lines of the wanted series go through prometheus_client's text
parser (the plugin's own series can run to many thousands of label sets). The metrics are optional: every
failure is a sentence (:func:`read_runtime_metrics` returns it), never an error that fails the read of the
gateway.

The management API's credentials go with the request only when the metrics URL is on the management API's
own origin (scheme, host and port): ``/metrics`` is behind the same auth there, and a password is never sent
to another host.
"""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import urlsplit

import httpx

from gatewayscope.config import Target
from gatewayscope.errors import GatewayscopeError, HTTPStatusError, NotFoundError
from gatewayscope.snapshot import RuntimeMetrics
from gatewayscope.sources._http import HttpClient
from gatewayscope.sources.bifrost.redact import redact_url

#: the largest metrics answer read (the plugin's label sets grow with providers x models x keys)
METRICS_MAX_BODY_BYTES = 64 * 1024 * 1024
#: the series the model needs, and the ones kept when present
REQUIRED_SERIES = ("go_goroutines", "go_memstats_stack_inuse_bytes", "process_resident_memory_bytes")
OPTIONAL_SERIES = ("go_memstats_heap_inuse_bytes", "go_memstats_sys_bytes")
_WANTED = frozenset(REQUIRED_SERIES + OPTIONAL_SERIES)
#: the fallback every sentence ends with
FALLBACK = "the boot estimate uses the 2-8 KiB band"


class MetricsReader(HttpClient):
    """The one request to a Bifrost gateway's metrics URL."""

    server = "Bifrost's metrics"
    timeout_sentence = "{who} did not answer within {seconds:g} s."
    unreachable_sentence = "{who} could not be reached ({reason})."

    def __init__(self, url: str, **kwargs: Any) -> None:
        parts = urlsplit(url)
        self.path = parts.path or "/"
        if parts.query:
            self.path += "?" + parts.query
        super().__init__(f"{parts.scheme}://{parts.netloc}", headers={"Accept": "text/plain"}, **kwargs)
        self.shown = redact_url(url) or url

    @property
    def who(self) -> str:
        return f"{self.server} at {self.shown}"


def _same_origin(a: str, b: str) -> bool:
    pa, pb = urlsplit(a), urlsplit(b)
    ports = {"http": 80, "https": 443}
    return (pa.scheme, pa.hostname, pa.port or ports.get(pa.scheme)) == \
        (pb.scheme, pb.hostname, pb.port or ports.get(pb.scheme))


def _metric_name(line: str) -> str:
    """The series name a sample line (or a ``# HELP``/``# TYPE`` line) is about."""
    if line.startswith("#"):
        parts = line.split(None, 3)
        return parts[2] if len(parts) > 2 and parts[1] in ("HELP", "TYPE") else ""
    head = line.split("{", 1)[0].split(None, 1)
    return head[0] if head else ""


def parse_runtime_metrics(text: str, url: str) -> RuntimeMetrics | str:
    """The runtime figures of a text exposition, or the sentence saying why it has none that can be used.

    >>> text = "go_goroutines 9640\\ngo_memstats_stack_inuse_bytes 7.897e+07\\nprocess_resident_memory_bytes 1.5e8\\n"
    >>> parse_runtime_metrics(text, "http://b/metrics").goroutines
    9640.0
    >>> print(parse_runtime_metrics("go_goroutines NaN\\n", "http://b/metrics"))
    the metrics at http://b/metrics give go_goroutines as nan, not a count of zero or more
    """
    from prometheus_client.parser import text_string_to_metric_families

    wanted = "\n".join(line for line in text.splitlines() if _metric_name(line) in _WANTED) + "\n"
    values: dict[str, list[float]] = {}
    try:
        for family in text_string_to_metric_families(wanted):
            for sample in family.samples:
                if sample.name in _WANTED:
                    values.setdefault(sample.name, []).append(float(sample.value))
    except (ValueError, TypeError, IndexError) as err:
        reason = " ".join(str(err).split())[:120]
        return f"the metrics at {url} are not Prometheus text ({reason})"
    figures: dict[str, float | None] = {}
    for name in REQUIRED_SERIES + OPTIONAL_SERIES:
        found = values.get(name, [])
        if not found:
            if name in REQUIRED_SERIES:
                return (f"the metrics at {url} have no {name} sample (is that the gateway's telemetry endpoint, "
                        "with the Go runtime and process collectors?)")
            figures[name] = None
            continue
        if len(found) > 1:
            return f"the metrics at {url} give {len(found)} samples of {name}, where one process has one"
        value = found[0]
        if not math.isfinite(value) or value < 0:
            return f"the metrics at {url} give {name} as {value}, not a count of zero or more"
        figures[name] = value
    if not figures["go_goroutines"]:
        return f"the metrics at {url} give go_goroutines as 0: no Go process reports that"
    return RuntimeMetrics(url=url, goroutines=float(figures["go_goroutines"] or 0),
                          stack_inuse_bytes=float(figures["go_memstats_stack_inuse_bytes"] or 0),
                          resident_memory_bytes=float(figures["process_resident_memory_bytes"] or 0),
                          heap_inuse_bytes=figures["go_memstats_heap_inuse_bytes"],
                          sys_bytes=figures["go_memstats_sys_bytes"])


def read_runtime_metrics(target: Target, *, transport: httpx.BaseTransport | None = None,
                         auth: tuple[str, str] | None = None) -> tuple[RuntimeMetrics | None, str | None]:
    """Read ``target``'s metrics: ``(figures, None)``, or ``(None, why not)`` (a sentence ending in the fallback).

    ``auth`` is the management API's credentials, already resolved; they are sent only to its own origin.
    """
    url = target.runtime_metrics_url
    if url is None:
        return None, f"{target.name}: its metrics are not read (read_metrics = false); {FALLBACK}."
    shown = redact_url(url) or url
    send_auth = auth if target.url and _same_origin(url, target.url) else None
    limit = min(METRICS_MAX_BODY_BYTES, target.max_body_bytes)
    failure: str | None = None
    text = ""
    try:
        with MetricsReader(url, timeout=target.timeout_seconds, transport=transport, auth=send_auth,
                           max_body_bytes=limit) as reader:
            response = reader.send("GET", reader.path)
            text = response.content.decode("utf-8")
    except NotFoundError:
        failure = (f"{shown} answered 404: the gateway's telemetry plugin is off (or its metrics are switched "
                   "off), or metrics_url names the wrong place")
    except HTTPStatusError as err:
        if err.status in (401, 403):
            sent = "the management API's credentials" if send_auth else "a request without credentials"
            failure = f"{shown} refused {sent} (HTTP {err.status})"
        else:
            failure = f"{shown} answered HTTP {err.status}"
    except GatewayscopeError as err:
        failure = str(err).rstrip(".")
    except UnicodeDecodeError:
        failure = f"{shown} answered something that is not UTF-8 text"
    if failure is not None:
        return None, f"{failure}; {FALLBACK}."
    parsed = parse_runtime_metrics(text, shown)
    if isinstance(parsed, str):
        return None, f"{parsed}; {FALLBACK}."
    return parsed, None
