"""What the chart tests share: the chart rendered by Helm's own SDK, and the schemas every object must meet.

Helm is ``helm-python-sdk`` (the dev extra, pinned): Helm v4's Go SDK as a library, rendering and linting the
chart offline, with no cluster and no ``helm`` binary. The Kubernetes schemas are ``kubernetes-validate``'s
strict ones (an unknown field fails); the ServiceMonitor and PrometheusRule schemas are the Prometheus
Operator's CRD schemas vendored in ``crds/`` (their source and license: ``crds/README.md``), made strict here.

Import as ``from tests.deploy.chart_files import ...``.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gatewayscope"
CI_VALUES = sorted(path.name for path in (CHART / "ci").glob("*-values.yaml"))
#: every values set the chart is rendered with: its defaults, then each ci/*-values.yaml
VALUE_SETS = ("default", *CI_VALUES)
CRDS = Path(__file__).resolve().parent / "crds"
CRD_SCHEMAS = {"ServiceMonitor": CRDS / "servicemonitor.schema.yaml",
               "PrometheusRule": CRDS / "prometheusrule.schema.yaml"}
#: the Kubernetes versions the chart supports (Chart.yaml's kubeVersion and docs/deploy.md say the same)
OLDEST_KUBERNETES = "1.25"
NEWEST_KUBERNETES = "1.37"
RELEASE, NAMESPACE = "gs", "monitoring"


def helm() -> Any:
    """The helm_python module (Helm's SDK); a missing one fails: it is a pinned dev dependency."""
    try:
        import helm_python
    except ImportError as err:  # pragma: no cover - only without the dev extra
        pytest.fail(f"helm-python-sdk is not installed ({err}): pip install -e '.[dev]' (it is pinned there)")
    return helm_python


def values_of(name: str) -> dict[str, Any]:
    """The values a set overrides: {} for the defaults, else ci/NAME parsed the way Helm parses -f files."""
    if name == "default":
        return {}
    values: dict[str, Any] = helm().values_from_yaml((CHART / "ci" / name).read_text())
    return values


def render(values: dict[str, Any] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Template path -> the objects it renders (empty documents left out), as ``helm template`` would."""
    with helm().Chart.load(CHART) as chart:
        manifests = chart.render(values=copy.deepcopy(values or {}), name=RELEASE, namespace=NAMESPACE)
    out = {}
    for path, text in manifests.items():
        if path.endswith("NOTES.txt"):
            continue
        out[path] = [doc for doc in yaml.safe_load_all(text) if doc]
    return out


@functools.cache
def rendered(name: str) -> tuple[dict[str, Any], ...]:
    """Every object the chart renders for the values set ``name`` (cached: the objects are read-only)."""
    return tuple(obj for objects in render(values_of(name)).values() for obj in objects)


def notes(values: dict[str, Any] | None = None) -> str:
    with helm().Chart.load(CHART) as chart:
        manifests = chart.render(values=copy.deepcopy(values or {}), name=RELEASE, namespace=NAMESPACE)
    return next(text for path, text in manifests.items() if path.endswith("NOTES.txt"))


def of_kind(objects: tuple[dict[str, Any], ...] | list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def one(objects: tuple[dict[str, Any], ...] | list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = of_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def pod_specs(objects: tuple[dict[str, Any], ...]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(object name, pod spec) of the Deployment and the test Pod."""
    for obj in objects:
        if obj["kind"] == "Deployment":
            yield obj["metadata"]["name"], obj["spec"]["template"]["spec"]
        elif obj["kind"] == "Pod":
            yield obj["metadata"]["name"], obj["spec"]


# -- the CRD schemas, strict --------------------------------------------------------------------------

def strict(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object schema that lists properties and says
    nothing of additional ones (what a structural CRD schema means: the API server prunes unknown fields)."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    if "properties" in out and "additionalProperties" not in out \
            and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@functools.cache
def kubernetes_definitions() -> dict[str, Any]:
    """kubernetes-validate's strict definitions of the oldest supported version (ObjectMeta for the CRDs)."""
    import importlib.resources

    folder = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"
    text = (folder / f"v{OLDEST_KUBERNETES}.0-local-strict" / "_definitions.json").read_text()
    return dict(json.loads(text))


@functools.cache
def crd_validator(kind: str) -> Any:
    """A jsonschema validator for ``kind``'s CRD schema, strict, its metadata held to Kubernetes' ObjectMeta."""
    import jsonschema
    from referencing import Registry, Resource

    schema = strict(yaml.safe_load(CRD_SCHEMAS[kind].read_text()))
    definitions = kubernetes_definitions()
    schema["properties"]["metadata"] = {
        "$ref": f"{definitions['$id']}#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
    schema["properties"]["apiVersion"] = {"const": "monitoring.coreos.com/v1"}
    schema["properties"]["kind"] = {"const": kind}
    registry = Registry().with_resource(definitions["$id"], Resource.from_contents(definitions))
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    return validator_class(schema, registry=registry)


def validate(obj: dict[str, Any], kubernetes_version: str) -> None:
    """Validate one rendered object strictly: a CRD object against its CRD schema, any other against
    Kubernetes' own schema of that version. Fails the test with the object, the path and the reason."""
    import kubernetes_validate

    where = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
    if obj.get("apiVersion") == "monitoring.coreos.com/v1":
        errors = sorted(crd_validator(obj["kind"]).iter_errors(obj), key=lambda e: list(e.path))
        if errors:
            pytest.fail(f"{where}: " + "; ".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors))
        return
    try:
        kubernetes_validate.validate(obj, kubernetes_version, strict=True)
    except kubernetes_validate.ValidationError as err:
        pytest.fail(f"{where} against Kubernetes {err.version}: {'.'.join(map(str, err.path))}: {err.message}")
    except kubernetes_validate.SchemaNotFoundError as err:
        pytest.fail(f"{where}: {err.message}")


def job_selector_regex() -> re.Pattern[str]:
    """The mixin's default job selector (``job=~"gatewayscope|gatewayscope-.*"``) as the anchored regex
    Prometheus matches."""
    from tests.mixin.mixin_files import DEFAULT_JOB_SELECTOR

    match = re.fullmatch(r'job=~"(.*)"', DEFAULT_JOB_SELECTOR)
    assert match, DEFAULT_JOB_SELECTOR
    return re.compile(f"^(?:{match.group(1)})$")
