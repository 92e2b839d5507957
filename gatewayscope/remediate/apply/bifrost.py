"""The Bifrost executors, one per action kind: ``pool_shrink``, ``record_delete``, ``posture_fix``. Each re-reads
its subject right before writing, and builds the write from that read."""

from __future__ import annotations

from typing import Any

from gatewayscope.analysis.posture import SAFE_POSTURE
from gatewayscope.errors import (
    GatewayscopeError,
    NotFoundError,
)
from gatewayscope.remediate.apply.protocol import _Context, _Latest, _refusal, _single, _write
from gatewayscope.remediate.apply.results import POOL_WRITE_FIELDS, ActionResult, Settled
from gatewayscope.remediate.plan import (
    Action,
    posture_fingerprint,
)

# -- Bifrost ------------------------------------------------------------------------------------------------

def pool_write_body(record: dict[str, Any], after: dict[str, Any]) -> dict[str, Any] | Settled:
    """The PUT body for a resize, built from a fresh read.

    Sends the record's own network block, custom upstream and raw switches (PUT resets those when
    absent) and the new pool; leaves out what PUT keeps when absent (proxy, openai, prompt cache,
    store_raw_request_response), whose secrets the listing masks; never ``keys``. A record whose network
    block carries a CA certificate cannot be written without sending back a masked secret: ``refused``.
    """
    network = record.get("network_config")
    if isinstance(network, dict) and network.get("ca_cert_pem"):
        return Settled("refused", "not sent: its network_config carries a CA certificate that the listing masks, "
                                  "and a resize would have to send the mask back; resize it where the certificate "
                                  "is managed, or delete it")
    body: dict[str, Any] = {}
    for key in POOL_WRITE_FIELDS:
        if key in record and record[key] is not None:
            body[key] = record[key]
    body.setdefault("network_config", {})
    body["concurrency_and_buffer_size"] = {"concurrency": int(after["concurrency"]),
                                           "buffer_size": int(after["buffer_size"])}
    return body


def _concurrency(record: dict[str, Any]) -> int:
    block = record.get("concurrency_and_buffer_size") or {}
    value = block.get("concurrency") if isinstance(block, dict) else None
    return int(value) if isinstance(value, int) and value > 0 else 1000


def pool_shrink(ctx: _Context, action: Action, result: ActionResult) -> Settled:
    from gatewayscope.sources.bifrost import POOL_FIELDS, record_fingerprint

    client = ctx.bifrost(action.target)
    target_pool = int(action.after["concurrency"])

    def fresh() -> dict[str, Any] | Settled:
        try:
            record = client.get_provider(action.subject)
        except NotFoundError:
            return Settled("gone", "the record no longer exists; not written (a PUT would recreate it)")
        if _concurrency(record) <= target_pool:
            return Settled("already-done" if result.sends == 0 else "done", f"holds {_concurrency(record)} workers")
        if record_fingerprint(record, exclude=POOL_FIELDS) != action.fingerprint:
            return Settled("stale", "changed since the plan was made; skipped (make a new plan)")
        return record

    record = _Latest(fresh)
    settled = record.reread()
    if settled is not None:
        return settled
    if not ctx.options.write:
        return Settled("would-write", f"{_concurrency(record.value)} -> {target_pool} workers")

    def send() -> Settled | str:
        body = pool_write_body(record.value, action.after)
        if isinstance(body, Settled):
            return body
        answer = client.put_provider(action.subject, body, timeout=ctx.options.pool_write_timeout)
        return f"now {_concurrency(answer) if isinstance(answer, dict) else target_pool} workers"

    def read_back(err: Exception) -> Settled:
        """No (good) answer: the write may still be under way there. Read back; never send again."""
        try:
            latest = client.get_provider(action.subject)
        except GatewayscopeError as read_err:
            return Settled("unconfirmed", f"{err}; read-back failed too: {read_err}")
        if _concurrency(latest) == target_pool:
            return Settled("done", f"no clear answer ({err}), but the record holds the new pool")
        return Settled("unconfirmed", f"{err}; the record still holds {_concurrency(latest)} workers")

    what = f"PUT pool {target_pool}/{action.after['buffer_size']}"
    return _write(ctx, begin=_single(ctx, action, result, what), send=send, reread=record.reread,
                  read_back=read_back, refuse=_refusal(action))


def record_delete(ctx: _Context, action: Action, result: ActionResult) -> Settled:
    from gatewayscope.sources.bifrost import POOL_FIELDS, record_fingerprint

    client = ctx.bifrost(action.target)

    def fresh() -> Settled | None:
        try:
            record = client.get_provider(action.subject)
        except NotFoundError:
            return Settled("already-done" if result.sends == 0 else "done", "the record is gone")
        if result.sends == 0 and record_fingerprint(record, exclude=POOL_FIELDS) != action.fingerprint:
            return Settled("stale", "changed since the plan was made; not deleted (make a new plan)")
        return None

    settled = fresh()
    if settled is not None:
        return settled
    if not ctx.options.write:
        return Settled("would-write", "DELETE")

    def send() -> str:
        client.delete_provider(action.subject)
        return "deleted"

    def read_back(err: Exception) -> Settled:
        return fresh() or Settled("unconfirmed", f"{err}; the record is still there")

    # a DELETE is safe to send again after a re-read: it never recreates anything
    return _write(ctx, begin=_single(ctx, action, result, "DELETE record"), send=send, reread=fresh,
                  read_back=read_back, refuse=_refusal(action))


def posture_fix(ctx: _Context, action: Action, result: ActionResult) -> Settled:
    from gatewayscope.analysis.posture import posture_drift
    from gatewayscope.sources.bifrost import safe_client_config

    client = ctx.bifrost(action.target)
    settings = list(action.after)

    def fresh() -> dict[str, Any] | Settled:
        config = client.get_config()
        client_config = config.get("client_config") if isinstance(config, dict) else None
        if not isinstance(client_config, dict):
            return Settled("unconfirmed", "GET /api/config returned no client_config")
        if not [s for s in posture_drift(client_config) if s in settings]:
            return Settled("already-done" if result.sends == 0 else "done", "posture holds")
        if result.sends == 0 and posture_fingerprint(safe_client_config(client_config)) != action.fingerprint:
            return Settled("stale", "the client config changed since the plan was made; not written")
        return client_config

    client_config = _Latest(fresh)
    settled = client_config.reread()
    if settled is not None:
        return settled
    if not ctx.options.write:
        return Settled("would-write", ", ".join(f"{s} -> {action.after[s]}" for s in settings))

    def send() -> str:
        # read-modify-write of the WHOLE client config: PUT copies most fields unconditionally
        client.put_config({"client_config": {**client_config.value, **{s: SAFE_POSTURE[s] for s in settings}}})
        return ", ".join(f"{s} = {SAFE_POSTURE[s]}" for s in settings)

    def read_back(err: Exception) -> Settled:
        return client_config.reread() or Settled("unconfirmed", f"{err}; the posture still drifts")

    return _write(ctx, begin=_single(ctx, action, result, "PUT client_config"), send=send,
                  reread=client_config.reread, read_back=read_back, refuse=_refusal(action))
