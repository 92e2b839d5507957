"""Guarded gateways announce themselves in a directory; the exporter turns the announcements into targets.

A trainer's gateway listens on a port its trainer picks at start, so no config file can name it. Each gateway
that gets the guard (``gatewayscope guard run``, :func:`gatewayscope.guard.attach.attach`, or ``gatewayscope
gateway``) and is given a discovery directory writes one file there while it serves, in Prometheus's
``file_sd`` format (so Prometheus can scrape the guard's own ``/metrics`` from the same directory)::

    [{"targets": ["127.0.0.1:41235"],
      "labels": {"gatewayscope_target": "guarded-41235", "gatewayscope_url": "http://127.0.0.1:41235",
                 "gatewayscope_store": "memory", "gatewayscope_db_path": "", "gatewayscope_pid": "4242",
                 "gatewayscope_pid_start": "889123"}}]

and removes it when it stops. :func:`discover` reads the directory back, bounded in size, and leaves out what
is malformed and every entry whose process is gone (a gateway killed before it could remove its file): its pid
no longer runs, or runs another program (its start time differs). Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gatewayscope._files import read_bytes

#: announcement files are named ``gatewayscope-guard-<pid>-<port>.json``
FILE_PREFIX = "gatewayscope-guard-"
#: the largest announcement file read (one is a few hundred bytes)
MAX_FILE_BYTES = 16_384
#: the most announcement files one read of a directory takes
MAX_FILES = 1_000
_NAME = re.compile(r"^gatewayscope-guard-(\d+)-(\d+)\.json$")


@dataclass(frozen=True)
class Announcement:
    """One guarded gateway that said where it serves."""

    name: str  # the exporter's target name for it: ``guarded-<port>``
    url: str
    store: str
    db_path: str | None
    pid: int
    pid_start: str | None  # the process's start time (``/proc/<pid>/stat``), where the system has one
    path: Path


def process_start(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot (Linux ``/proc``), or None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces: count fields after its closing one
    fields = stat[stat.rfind(")") + 2:].split()
    return fields[19] if len(fields) > 19 else None


def alive(pid: int, started: str | None) -> bool:
    """Whether process ``pid`` runs and, where its start time was recorded, is the same process."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it runs, as another user
    if started is None:
        return True
    now = process_start(pid)
    return now is None or now == started


def local_host(host: str) -> str:
    """The address a local reader uses for a gateway listening on ``host`` (a wildcard means loopback)."""
    return "127.0.0.1" if host in ("", "0.0.0.0", "::", "[::]") else host


def announce(directory: str | os.PathLike[str], *, host: str, port: int, store: str,
             db_path: str | None = None) -> Path:
    """Write this process's announcement for a gateway on ``host:port`` into ``directory`` (created if
    needed), atomically (a reader never sees half a file). Returns its path, for :func:`withdraw`."""
    folder = Path(directory).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    address = f"{local_host(host)}:{port}"
    labels = {"gatewayscope_target": f"guarded-{port}", "gatewayscope_url": f"http://{address}",
              "gatewayscope_store": store, "gatewayscope_db_path": db_path or "", "gatewayscope_pid": str(pid),
              "gatewayscope_pid_start": process_start(pid) or ""}
    path = folder / f"{FILE_PREFIX}{pid}-{port}.json"
    fd, temp = tempfile.mkstemp(prefix=".gatewayscope-guard-", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump([{"targets": [address], "labels": labels}], handle)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    return path


def withdraw(path: str | os.PathLike[str]) -> None:
    """Remove an announcement (nothing when it is gone already)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _parse(path: Path) -> Announcement | None:
    try:  # a FIFO dropped in the folder would block a plain open: read_bytes refuses it, and a large file
        raw = read_bytes(path, limit=MAX_FILE_BYTES)
    except OSError:
        return None
    try:
        body: Any = json.loads(raw)
        labels = body[0]["labels"]
        url, store, pid = labels["gatewayscope_url"], labels["gatewayscope_store"], int(labels["gatewayscope_pid"])
        name, db_path, started = labels["gatewayscope_target"], labels.get("gatewayscope_db_path"), labels.get(
            "gatewayscope_pid_start")
    except (ValueError, TypeError, KeyError, IndexError, RecursionError):
        return None
    if not all(isinstance(v, str) for v in (url, store, name)) or not url.startswith("http://"):
        return None
    return Announcement(name=name, url=url, store=store, db_path=db_path or None, pid=pid,
                        pid_start=started if isinstance(started, str) and started else None, path=path)


def discover(directory: str | os.PathLike[str]) -> list[Announcement]:
    """The guarded gateways announced in ``directory`` whose process still runs, by name (an absent directory:
    none). Malformed or oversized files and entries of processes that are gone are left out."""
    try:
        names = sorted(entry.name for entry in os.scandir(Path(directory).expanduser()) if _NAME.match(entry.name))
    except OSError:
        return []
    found: dict[str, Announcement] = {}
    for name in names[:MAX_FILES]:
        entry = _parse(Path(directory).expanduser() / name)
        if entry is not None and alive(entry.pid, entry.pid_start):
            found.setdefault(entry.name, entry)
    return [found[name] for name in sorted(found)]
