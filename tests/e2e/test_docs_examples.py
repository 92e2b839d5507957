"""Every ```python example of README.md and docs/python-api.md runs, as written, against the sandbox.

The docs say to start the sandbox with ``gatewayscope demo --workdir sandbox`` and to run the examples in the
folder it was started from; this test does exactly that (a smaller sandbox, the same layout), then runs the
examples in the order the page gives them, each in a namespace of its own. An example that raises, or one
that names something the package no longer has, fails the test with its file and line.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import DOCS, README, python_examples

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def sandbox_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    pytest.importorskip("rllm_model_gateway", reason="needs the 'gateway' extra (rllm-model-gateway)")
    from gatewayscope.sandbox.demo import Sandbox

    folder = tmp_path_factory.mktemp("docs-examples")
    with Sandbox(folder / "sandbox", rollouts=10, stragglers=4, bifrost_seed="small", say=lambda _s: None) as box:
        box.start()
        box.wait_until_idle()
        yield folder


@pytest.mark.parametrize("page", [README, DOCS / "python-api.md"], ids=["README.md", "docs/python-api.md"])
def test_every_python_example_runs_against_the_sandbox(page: Path, sandbox_folder: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(sandbox_folder)
    examples = python_examples(page)
    assert examples
    for start, code in examples:
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                exec(compile(code, f"{page.name}:{start}", "exec"), {"__name__": "__docs_example__"})
        except Exception as err:  # the example's own failure, reported with where it is
            pytest.fail(f"{page.name}, the example at line {start} raised {type(err).__name__}: {err}\n"
                        f"it printed:\n{printed.getvalue()}")
