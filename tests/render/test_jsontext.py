"""dumps_indented writes exactly what json.dumps(indent=2, sort_keys=True) writes."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from gatewayscope.render.jsontext import dumps_indented

GOLDEN = Path(__file__).parents[1] / "golden"


def same(value: Any) -> None:
    assert dumps_indented(value) == json.dumps(value, indent=2, sort_keys=True)


@pytest.mark.parametrize("name", sorted(p.name for p in GOLDEN.glob("*.json")))
def test_every_golden_json_file_comes_out_the_same(name: str) -> None:
    same(json.loads((GOLDEN / name).read_text()))


@pytest.mark.parametrize("value", [
    {}, [], {"a": {}}, {"a": []}, [[]], [{}], "x", 1, -0.0, 1e300, 1.5, float("nan"), float("inf"), -float("inf"),
    None, True, False, {"é\u2028\x00<script>": "\U0001f9f5 \"quoted\" \\ \t"}, (1, (2, 3)),
    {"k": (1, {"z": 1, "a": 2})}, {1: "int key", 2: "int key"}, {None: 1}, [1, [2, [3, [4, {"deep": [5]}]]]],
])
def test_edge_values_come_out_the_same(value: Any) -> None:
    same(value)


@pytest.mark.parametrize("value", [{1: "int key", "2": "str key"}, {True: 1, "a": 0}, {"a": object()}])
def test_what_json_refuses_is_refused_the_same_way(value: Any) -> None:
    with pytest.raises(TypeError):
        json.dumps(value, indent=2, sort_keys=True)
    with pytest.raises(TypeError):
        dumps_indented(value)


def test_random_nested_values_come_out_the_same() -> None:
    rng = random.Random(7)

    def make(depth: int) -> Any:
        choice = rng.randrange(9 if depth < 4 else 5)
        if choice == 0:
            return rng.choice(["", "a", "ü", "tab\t", "<b>", "\x1b[31m", "\ud7ff"])
        if choice == 1:
            return rng.randrange(-10**20, 10**20)
        if choice == 2:
            return rng.uniform(-1e9, 1e9)
        if choice == 3:
            return rng.choice([None, True, False])
        if choice == 4:
            return rng.random() * 10 ** rng.randrange(-30, 30)
        if choice in (5, 6):
            return {rng.choice("abcdefgh") + str(rng.randrange(99)): make(depth + 1) for _ in range(rng.randrange(6))}
        return [make(depth + 1) for _ in range(rng.randrange(6))]

    for _ in range(500):
        same(make(0))
