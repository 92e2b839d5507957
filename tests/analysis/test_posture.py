"""Posture drift, the Bifrost summary and its one sentence, against numbers worked out by hand."""

from __future__ import annotations

import json

import pytest

from gatewayscope.analysis.pools import bifrost_sentence, bifrost_summary
from gatewayscope.analysis.posture import posture_drift
from gatewayscope.config import Policy
from gatewayscope.snapshot import REACHABILITY_SCHEMA, RECORDS_SCHEMA, BifrostData, frame_from_rows

MIB = 1024 * 1024
SAFE = {"drop_excess_requests": False, "enforce_auth_on_inference": True, "disable_content_logging": True}


@pytest.mark.parametrize(("config", "drift"), [
    (SAFE, []),
    ({}, ["enforce_auth_on_inference", "disable_content_logging"]),  # missing = Bifrost default false
    ({k: None for k in SAFE}, ["enforce_auth_on_inference", "disable_content_logging"]),
    ({"drop_excess_requests": True, "enforce_auth_on_inference": False, "disable_content_logging": False},
     ["drop_excess_requests", "enforce_auth_on_inference", "disable_content_logging"]),
    ({**SAFE, "drop_excess_requests": True}, ["drop_excess_requests"]),
    ({**SAFE, "disable_content_logging": False}, ["disable_content_logging"]),
    ({"drop_excess_requests": False, "disable_content_logging": True, "enforce_governance_header": True}, []),
    ({**SAFE, "enforce_auth_on_inference": False, "enforce_governance_header": True},
     ["enforce_auth_on_inference"]),  # the newer setting wins
    ({**SAFE, "drop_excess_requests": "true"}, ["drop_excess_requests"]),
])
def test_posture_drift(config: dict[str, object], drift: list[str]) -> None:
    assert posture_drift(config) == drift


def rec(name: str, custom: bool, concurrency: int, buffer: int, base_url: str | None = None,
        status: str = "active") -> tuple[object, ...]:
    return (name, custom, "openai" if custom else None, concurrency, buffer, base_url, status, f"fp-{name}")


def data() -> BifrostData:
    records = frame_from_rows([
        rec("openai", False, 1000, 5000),
        rec("anthropic", False, 512, 8192),
        *[rec(f"org{i}__vllm__m", True, 1000, 5000, "http://gone.invalid/v1") for i in range(3)],
        *[rec(f"org{i}__openrouter__claude__anthropic", False, 64, 1024, None, "error") for i in range(2)],
    ], RECORDS_SCHEMA)
    reach = frame_from_rows([("gone.invalid", False, "no such host")], REACHABILITY_SCHEMA)
    return BifrostData(records=records, client_config={"drop_excess_requests": True,
                                                       "enforce_auth_on_inference": True},
                       reachability=reach)


def test_bifrost_summary_shape_and_numbers() -> None:
    summary = bifrost_summary(data(), Policy(), 512 * MIB)
    # the two __anthropic lanes are in provider_status "error": no pool, so no parked workers or slots
    workers = 1000 + 512 + 3 * 1000  # 4,512
    assert summary == {
        "records": {"standard": 2, "custom": 5},
        "parked_workers": {"standard": 1512, "custom": 3000},
        "queue_slots": {"standard": 5000 + 8192, "custom": 3 * 5000},
        "records_over_pool": {"standard": 1, "custom": 3},
        "worker_stack_bytes": {"low": workers * 2048, "high": workers * 8192},  # 9,240,576 / 36,962,304
        "memory_limit_bytes": 536_870_912,
        "survives_restart": "yes",
        # average over all 7 records: 536,870,912 x 7 // 9,240,576 + 1 = 406 + 1,
        # 536,870,912 x 7 // 36,962,304 + 1 = 101 + 1
        "records_to_limit": {"low": 407, "high": 102},
        "posture_drift": ["drop_excess_requests", "disable_content_logging"],
        "unreachable_records": 5,  # three dead base URLs + two records in status error
        "pool_policy": {"standard": 512, "custom": 64, "queue_per_worker": 16},
        # no runtime metrics were read: the band's high bound and verdict, without a reason
        "boot_memory": {"model": "band", "predicted_bytes": workers * 8192, "memory_limit_bytes": 536_870_912,
                        "survives_restart": "yes", "records_to_limit": 102, "measured": None, "reason": None},
    }
    assert json.loads(json.dumps(summary)) == summary


def test_bifrost_summary_follows_policy_and_limit() -> None:
    summary = bifrost_summary(data(), Policy(standard_pool=2000, custom_pool=1000, queue_per_worker=4), 20 * MIB)
    assert summary["records_over_pool"] == {"standard": 0, "custom": 0}
    assert summary["pool_policy"] == {"standard": 2000, "custom": 1000, "queue_per_worker": 4}
    # low 9,240,576 <= 20,971,520 < high 36,962,304
    assert summary["survives_restart"] == "at risk"


def test_bifrost_summary_of_an_empty_gateway() -> None:
    empty = BifrostData(records=frame_from_rows([], RECORDS_SCHEMA), client_config=dict(SAFE),
                        reachability=frame_from_rows([], REACHABILITY_SCHEMA))
    summary = bifrost_summary(empty, Policy(), 512 * MIB)
    assert summary["records"] == {"standard": 0, "custom": 0}
    assert summary["worker_stack_bytes"] == {"low": 0, "high": 0}
    assert summary["records_to_limit"] == {"low": None, "high": None}
    assert summary["survives_restart"] == "yes"
    assert summary["posture_drift"] == [] and summary["unreachable_records"] == 0


def one_sentence(text: str) -> bool:
    return text.endswith(".") and ". " not in text and "\n" not in text


def test_sentence_when_it_survives() -> None:
    text = bifrost_sentence(bifrost_summary(data(), Policy(), 512 * MIB))
    assert one_sentence(text)
    assert text == ("This gateway would survive a restart within its 512.0 MiB memory limit: its 7 provider "
                    "records park 4,512 workers whose stacks alone need 8.8 to 35.2 MiB at boot, and at 8 KiB "
                    "per worker the limit is crossed at 102 records of this average size.")


def test_sentence_when_it_would_not() -> None:
    text = bifrost_sentence(bifrost_summary(data(), Policy(), 8 * MIB))
    assert one_sentence(text)
    assert text.startswith("This gateway would not survive a restart within its 8.0 MiB memory limit:")
    assert "8.8 to 35.2 MiB" in text and "even at 2 KiB per worker" in text


def test_sentence_when_at_risk() -> None:
    text = bifrost_sentence(bifrost_summary(data(), Policy(), 20 * MIB))
    assert one_sentence(text)
    assert text.startswith("This gateway may not survive a restart within its 20.0 MiB memory limit:")
    # 20,971,520 x 7 records // 36,962,304 bytes = 3 -> crossed at the 4th record
    assert text.endswith("the limit is crossed at 4 records of this average size.")


def test_sentence_of_an_empty_gateway() -> None:
    empty = BifrostData(records=frame_from_rows([], RECORDS_SCHEMA), client_config={},
                        reachability=frame_from_rows([], REACHABILITY_SCHEMA))
    text = bifrost_sentence(bifrost_summary(empty, Policy(), 512 * MIB))
    assert one_sentence(text)
    assert "its 0 provider records park 0 workers" in text
