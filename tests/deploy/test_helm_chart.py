"""The Helm chart (deploy/helm/gatewayscope), rendered and linted by Helm's own SDK, offline.

Rendered with its default values and with each ci/*-values.yaml; every object must validate strictly against
the Kubernetes schemas of the oldest and newest supported Kubernetes (kubernetes-validate) and the
ServiceMonitor and PrometheusRule against the Prometheus Operator's CRD schemas (tests/deploy/crds/). The
ConfigMap's TOML must be what the exporter itself accepts, with every file it names mounted from the Secret
it comes from; the PrometheusRule must be the mixin's rules (promtool checks them and runs the alert tests);
the helm test script must pass against a real exporter and fail when a target is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

from gatewayscope import __version__
from gatewayscope.config import Config, Policy, Target, parse_config
from gatewayscope.exporter.server import ExporterServer, make_server
from gatewayscope.exporter.settings import ExporterSettings, parse_exporter_settings
from gatewayscope.sandbox.processes import free_port
from tests.deploy.chart_files import (
    CHART,
    NAMESPACE,
    NEWEST_KUBERNETES,
    OLDEST_KUBERNETES,
    RELEASE,
    VALUE_SETS,
    helm,
    job_selector_regex,
    notes,
    of_kind,
    one,
    pod_specs,
    render,
    rendered,
    validate,
    values_of,
)
from tests.mixin.mixin_files import DASHBOARDS, PROMETHEUS_DIR, build_module, run_promtool

FULLNAME = f"{RELEASE}-gatewayscope"
OPTIONAL_KINDS = {"ServiceMonitor", "PrometheusRule", "PodDisruptionBudget", "NetworkPolicy"}


def config_toml(objects: tuple[dict[str, Any], ...]) -> str:
    return str(one(objects, "ConfigMap")["data"]["gatewayscope.toml"])


def exporter_container(objects: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    spec = one(objects, "Deployment")["spec"]["template"]["spec"]
    return dict(next(c for c in spec["containers"] if c["name"] == "exporter"))


# -- Helm: lint and render -----------------------------------------------------------------------------

def test_helm_sdk_is_helm_4() -> None:
    assert helm().helm_sdk_version().startswith("v4."), helm().helm_sdk_version()


@pytest.mark.parametrize("kubernetes", [OLDEST_KUBERNETES, NEWEST_KUBERNETES])
@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_helm_lint_is_clean(value_set: str, kubernetes: str) -> None:
    report = helm().lint(str(CHART), values_of(value_set), strict=True, namespace=NAMESPACE,
                         kube_version=f"v{kubernetes}.0")
    assert report["errors"] == [], report
    # only the informational "icon is recommended" (a chart of this repository has no icon to point at)
    findings = [m for m in report["messages"] if not (m["severity"] == 1 and "icon is recommended" in m["error"])]
    assert findings == [], findings


def test_the_supported_kubernetes_range_is_stated_where_users_read_it() -> None:
    """Chart.yaml's kubeVersion (Helm refuses to install below it) and docs/deploy.md name the range the
    objects are validated against here."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={OLDEST_KUBERNETES}.0-0"
    deploy = (CHART.parents[2] / "docs" / "deploy.md").read_text()
    assert f"Kubernetes {OLDEST_KUBERNETES} to {NEWEST_KUBERNETES}" in deploy
    import kubernetes_validate

    assert kubernetes_validate.latest_version().startswith(NEWEST_KUBERNETES)


@pytest.mark.parametrize("kubernetes", [OLDEST_KUBERNETES, NEWEST_KUBERNETES])
@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_rendered_object_validates_strictly(value_set: str, kubernetes: str) -> None:
    objects = rendered(value_set)
    assert objects
    for obj in objects:
        validate(obj, f"{kubernetes}.0")


def test_the_validation_is_strict_about_unknown_fields() -> None:
    """The check above can fail: a misspelled field, in a Kubernetes object or a CRD object, is caught."""
    deployment = dict(one(rendered("default"), "Deployment"))
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 1}}
    with pytest.raises(pytest.fail.Exception, match="replica"):
        validate(broken, f"{NEWEST_KUBERNETES}.0")
    monitor = of_kind(rendered("all-values.yaml"), "ServiceMonitor")[0]
    endpoint = {**monitor["spec"]["endpoints"][0], "scrape_timeout": "10s"}
    broken = {**monitor, "spec": {**monitor["spec"], "endpoints": [endpoint]}}
    with pytest.raises(pytest.fail.Exception, match="scrape_timeout"):
        validate(broken, f"{NEWEST_KUBERNETES}.0")
    rule = one(rendered("all-values.yaml"), "PrometheusRule")
    broken = {**rule, "metadata": {**rule["metadata"], "label": {"a": "b"}}}
    with pytest.raises(pytest.fail.Exception, match="label"):
        validate(broken, f"{NEWEST_KUBERNETES}.0")


def test_the_defaults_render_only_what_every_install_needs() -> None:
    kinds = sorted(obj["kind"] for obj in rendered("default"))
    assert kinds == ["ConfigMap", "Deployment", "Pod", "Service", "ServiceAccount"]
    assert not OPTIONAL_KINDS & set(kinds)
    test_pod = one(rendered("default"), "Pod")
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"


def test_every_option_on_renders_every_optional_object() -> None:
    objects = rendered("all-values.yaml")
    assert {obj["kind"] for obj in objects} >= OPTIONAL_KINDS
    # one ServiceMonitor for the exporter's own metrics and one per target
    assert len(of_kind(objects, "ServiceMonitor")) == 1 + len(values_of("all-values.yaml")["config"]["targets"])


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_pod_is_hardened(value_set: str) -> None:
    for name, spec in pod_specs(rendered(value_set)):
        assert spec["automountServiceAccountToken"] is False, name
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["runAsUser"] == 65532, name
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, name
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["capabilities"] == {"drop": ["ALL"]}, name
            assert container["resources"]["limits"]["memory"], name
        for volume in spec.get("volumes", []):
            assert "hostPath" not in volume or volume["name"] == "more-stores", (name, volume)
    account = of_kind(rendered(value_set), "ServiceAccount")
    assert all(sa["automountServiceAccountToken"] is False for sa in account)


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_secret_file_is_readable_by_the_exporters_group_alone(value_set: str) -> None:
    """Kubelet makes a Secret volume's files root's, of group fsGroup: the exporter (uid 65532, not their
    owner) reads them through that group, so the mode needs group read and gives the world nothing
    (docs/deploy.md: mode 0440, group 65532)."""
    secrets = 0
    for name, spec in pod_specs(rendered(value_set)):
        context = spec["securityContext"]
        for volume in spec.get("volumes", []):
            if "secret" not in volume:
                continue
            secrets += 1
            mode = volume["secret"]["defaultMode"]
            assert mode == 0o440, (name, volume["name"], oct(mode))
            assert all("mode" not in item for item in volume["secret"]["items"]), (name, volume["name"])
            assert context["fsGroup"] == context["runAsGroup"] == 65532, (name, context)
    if value_set == "all-values.yaml":  # basic auth and TLS in both pods, two targets' auth
        assert secrets == 5


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_probes_ask_the_exporters_probe_paths(value_set: str) -> None:
    container = exporter_container(rendered(value_set))
    assert container["livenessProbe"]["httpGet"]["path"] == "/-/healthy"
    assert container["readinessProbe"]["httpGet"]["path"] == "/-/ready"
    tls = values_of(value_set).get("tls", {}).get("enabled", False)
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["scheme"] == ("HTTPS" if tls else "HTTP")
        assert container[probe]["httpGet"]["port"] == "http"


def test_image_tag_defaults_to_the_app_version_which_is_gatewayscopes() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__
    assert exporter_container(rendered("default"))["image"] == f"ghcr.io/gatewayscope/gatewayscope:{__version__}"
    digest = values_of("all-values.yaml")["image"]["digest"]
    assert exporter_container(rendered("all-values.yaml"))["image"].endswith(f"@{digest}")


# -- the config, the Secrets it names, the SQLite store ----------------------------------------------------

def mounted_files(objects: tuple[dict[str, Any], ...]) -> dict[str, tuple[str, str, bool]]:
    """Path in the exporter container -> (volume source kind, source name, read-only) for every file a Secret
    or ConfigMap volume puts there, and every folder a PVC or extra volume mounts (with a trailing '/')."""
    spec = one(objects, "Deployment")["spec"]["template"]["spec"]
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    out = {}
    for mount in exporter_container(objects)["volumeMounts"]:
        volume = volumes[mount["name"]]
        read_only = bool(mount.get("readOnly"))
        if "secret" in volume:
            for item in volume["secret"]["items"]:
                out[f"{mount['mountPath']}/{item['path']}"] = ("secret", f"{volume['secret']['secretName']}:"
                                                                          f"{item['key']}", read_only)
        elif "configMap" in volume:
            out[mount["mountPath"]] = ("configMap", f"{volume['configMap']['name']}:{mount['subPath']}", read_only)
        else:
            source = next(key for key in volume if key != "name")
            out[mount["mountPath"].rstrip("/") + "/"] = (source, str(volume[source]), read_only)
    return out


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_the_config_is_what_the_exporter_accepts_and_every_file_it_names_is_mounted(value_set: str,
                                                                                  tmp_path: Path) -> None:
    objects = rendered(value_set)
    text = config_toml(objects)
    values = values_of(value_set)
    wanted = values.get("config", {}).get("targets", [])
    if not wanted:  # the defaults: no target (NOTES say so); the exporter refuses to start without one
        assert "[[targets]]" not in text
        return
    files = mounted_files(objects)
    # the exporter checks that the TLS files exist: lay every mounted file out under tmp_path, as the pod has them
    for path, (source, _, _) in files.items():
        if source == "secret":
            (tmp_path / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path.lstrip("/")).write_text("x\n")
    rooted = text.replace('"/etc/gatewayscope/', f'"{tmp_path}/etc/gatewayscope/')
    config = parse_config(tomllib.loads(rooted), "gatewayscope.toml")
    settings = parse_exporter_settings(config.exporter, "gatewayscope.toml")
    files = {str(tmp_path) + path if path.startswith("/etc/gatewayscope/") else path: found
             for path, found in files.items()}
    container = exporter_container(objects)
    heal = values.get("heal", {}).get("enabled", False)
    assert container["args"] == ["--config", "/etc/gatewayscope/gatewayscope.toml",
                                 "--listen", f"0.0.0.0:{container['ports'][0]['containerPort']}",
                                 *(["--heal"] if heal else [])]
    if heal:  # heal: one replica, never two in a rollout, its journal on the claim, its table what heal accepts
        from gatewayscope.heal.settings import parse_heal_settings

        deployment = next(o for o in objects if o["kind"] == "Deployment")
        assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
        claim = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "heal-state")
        assert claim["persistentVolumeClaim"]["claimName"] == values["heal"]["existingClaim"]
        table = tomllib.loads(rooted)["heal"]
        assert table["state_dir"] == values["heal"].get("mountPath", "/var/lib/gatewayscope-heal")
        parse_heal_settings(table, "gatewayscope.toml")
    assert files[f"{tmp_path}/etc/gatewayscope/gatewayscope.toml"] == ("configMap", f"{FULLNAME}:gatewayscope.toml",
                                                                        True)
    assert [(t.name, t.kind) for t in config.targets] == [(t["name"], t["kind"]) for t in wanted]
    for target, value in zip(config.targets, wanted, strict=True):
        for key in ("timeout_seconds", "max_body_bytes", "concurrency", "memory_limit_bytes"):
            if key in value:
                assert getattr(target, key) == value[key], (target.name, key)
                assert type(getattr(target, key)) is type(value[key]) or key == "timeout_seconds"
        if target.path:
            folder = next(p for p in files if p.endswith("/") and target.path.startswith(p))
            assert files[folder][2], f"{target.path}: the store's volume must be mounted read-only"
        auth = value.get("auth")
        assert (target.auth is None) == (auth is None)
        if auth:
            secret = auth["existingSecret"]
            assert files[target.auth.password_file] == ("secret", f"{secret}:{auth.get('passwordKey', 'password')}",
                                                        True)
            if "username" in auth:
                assert target.auth.username == auth["username"] and target.auth.username_file is None
            else:
                assert files[target.auth.username_file] == (
                    "secret", f"{secret}:{auth.get('usernameKey', 'username')}", True)
    basic, tls = values.get("basicAuth", {}), values.get("tls", {})
    assert settings.basic_auth == bool(basic.get("enabled"))
    if settings.basic_auth:
        assert files[settings.basic_auth_username_file][1] == f"{basic['existingSecret']}:username"
        assert files[settings.basic_auth_password_file][1] == f"{basic['existingSecret']}:password"
    if tls.get("enabled"):
        assert files[settings.tls_cert_file][1] == f"{tls['existingSecret']}:tls.crt"
        assert files[settings.tls_key_file][1] == f"{tls['existingSecret']}:tls.key"
    for key, value in values.get("config", {}).get("exporter", {}).items():
        assert getattr(settings, key) == value, key
    for key, value in values.get("config", {}).get("policy", {}).items():
        assert getattr(config.policy, key) == value, key
    # a secret never goes in the ConfigMap
    assert "password =" not in text and "password_env" not in text


def test_whole_numbers_stay_whole_and_strings_are_escaped() -> None:
    """Helm reads every YAML number as a float: 1073741824 must not reach the TOML as 1.073741824e+09, and a
    name or URL with TOML's special characters must arrive as written."""
    values = {"config": {"targets": [
        {"name": "b", "kind": "bifrost", "url": 'http://gw:8080/a"b\\c#d', "memory_limit_bytes": 1073741824,
         "timeout_seconds": 2.5},
    ]}}
    objects = [obj for group in render(values).values() for obj in group]
    text = str(one(objects, "ConfigMap")["data"]["gatewayscope.toml"])
    assert "memory_limit_bytes = 1073741824\n" in text
    target = tomllib.loads(text)["targets"][0]
    assert target["url"] == 'http://gw:8080/a"b\\c#d'
    assert target["timeout_seconds"] == 2.5


def test_a_changed_config_rolls_the_pod() -> None:
    checksums = set()
    for value_set in VALUE_SETS:
        deployment = one(rendered(value_set), "Deployment")
        checksums.add(deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"])
    assert len(checksums) == len(VALUE_SETS)


@pytest.mark.parametrize(("values", "message"), [
    ({"config": {"targets": [{"name": "b", "kind": "bifrost", "url": "http://b:8080",
                              "auth": {"existingSecret": "s", "password": "hunter2"}}]}},
     "additional properties 'password' not allowed"),
    ({"config": {"targets": [{"name": "a", "kind": "nginx", "url": "http://a:1"}]}}, "/config/targets/0/kind"),
    ({"config": {"targets": [{"name": "b", "kind": "bifrost", "path": "/var/lib/b.db"}]}}, "/config/targets/0"),
    ({"config": {"targets": [{"name": "a", "kind": "rllm", "url": "http://user:pw@a:9090"}]}},
     "/config/targets/0/url"),
    ({"config": {"targets": [{"name": "a b", "kind": "rllm", "url": "http://a:9090"}]}}, "/config/targets/0/name"),
    ({"config": {"targets": [{"name": "a", "kind": "rllm", "url": "http://a:9090", "auth": {"existingSecret": "s"}}]}},
     "/config/targets/0"),
    ({"config": {"exporter": {"listen": "0.0.0.0:1"}}}, "additional properties 'listen' not allowed"),
    ({"config": {"exporter": {"basic_auth_password": "x"}}}, "additional properties 'basic_auth_password'"),
    ({"serviceMonitor": {"jobName": "exporter"}}, "/serviceMonitor/jobName"),
    ({"servicemonitor": {"enabled": True}}, "additional properties 'servicemonitor' not allowed"),
])
def test_the_values_schema_refuses_what_the_exporter_or_the_rules_would(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm().HelmValuesError) as caught:
        render(values)
    assert message in str(caught.value)
    assert "hunter2" not in str(caught.value)


@pytest.mark.parametrize(("values", "message"), [
    ({"config": {"targets": [{"name": "a", "kind": "rllm", "url": "http://a:1"},
                             {"name": "a", "kind": "rllm", "url": "http://b:1"}]}}, 'the name "a" is used twice'),
    ({"config": {"targets": [{"name": "a", "kind": "rllm", "path": "/var/lib/rllm/t.db"}]}},
     "set sqlite.existingClaim"),
    ({"basicAuth": {"enabled": True}}, "basicAuth.enabled needs basicAuth.existingSecret"),
    ({"tls": {"enabled": True}}, "tls.enabled needs tls.existingSecret"),
    ({"config": {"targets": [{"name": "A_b", "kind": "rllm", "url": "http://a:1"},
                             {"name": "a.b", "kind": "rllm", "url": "http://b:1"}]},
      "serviceMonitor": {"enabled": True, "perTarget": {"enabled": True}}}, "taken by another target"),
])
def test_values_the_exporter_could_not_run_with_fail_with_a_sentence(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm().HelmRenderError) as caught:
        render(values)
    assert message in str(caught.value)


def test_notes_warn_without_targets_and_list_them_with() -> None:
    assert "WARNING: config.targets is empty" in notes()
    text = notes(values_of("multi-target-values.yaml"))
    assert "WARNING" not in text
    for target in values_of("multi-target-values.yaml")["config"]["targets"]:
        assert f"  - {target['name']} ({target['kind']}): {target['url']}" in text
    assert f"helm test {RELEASE} --namespace {NAMESPACE}" in text


# -- ServiceMonitors ----------------------------------------------------------------------------------

def test_one_service_monitor_scrapes_metrics_as_the_rules_job() -> None:
    monitor = one(rendered("sqlite-values.yaml"), "ServiceMonitor")
    service = one(rendered("sqlite-values.yaml"), "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    [endpoint] = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == (service["spec"]["ports"][0]["name"], "/metrics")
    job = next(r["replacement"] for r in endpoint["relabelings"] if r["targetLabel"] == "job")
    assert job == "gatewayscope" and job_selector_regex().match(job)


@pytest.mark.parametrize("value_set", ["multi-target-values.yaml", "all-values.yaml"])
def test_per_target_service_monitors_probe_each_target_the_blackbox_way(value_set: str) -> None:
    monitors = {m["metadata"]["name"]: m for m in of_kind(rendered(value_set), "ServiceMonitor")}
    targets = values_of(value_set)["config"]["targets"]
    own = monitors.pop(FULLNAME)
    [endpoint] = own["spec"]["endpoints"]
    assert endpoint["path"] == "/exporter-metrics"
    jobs = {next(r["replacement"] for r in endpoint["relabelings"] if r["targetLabel"] == "job")}
    probed = []
    for monitor in monitors.values():
        [endpoint] = monitor["spec"]["endpoints"]
        assert endpoint["path"] == "/probe"
        [name] = endpoint["params"]["target"]
        probed.append(name)
        assert {"sourceLabels": ["__param_target"], "targetLabel": "instance"} in endpoint["relabelings"]
        jobs.add(next(r["replacement"] for r in endpoint["relabelings"] if r["targetLabel"] == "job"))
        scrape = next(t for t in targets if t["name"] == name).get("scrape", {})
        assert endpoint["scrapeTimeout"] == scrape.get("scrapeTimeout", values_of(value_set)["serviceMonitor"].get(
            "scrapeTimeout", "20s"))
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", monitor["metadata"]["name"])
    assert sorted(probed) == sorted(t["name"] for t in targets)
    assert jobs == {"gatewayscope-targets", "gatewayscope-exporter"}
    assert all(job_selector_regex().match(job) for job in jobs)


def test_service_monitors_carry_basic_auth_and_tls_when_the_exporter_has_them() -> None:
    values = values_of("all-values.yaml")
    for monitor in of_kind(rendered("all-values.yaml"), "ServiceMonitor"):
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["scheme"] == "https"
            assert endpoint["tlsConfig"] == values["serviceMonitor"]["tlsConfig"]
            secret = values["basicAuth"]["existingSecret"]
            assert endpoint["basicAuth"] == {"username": {"name": secret, "key": "username"},
                                             "password": {"name": secret, "key": "password"}}
            assert endpoint["relabelings"][-1] == values["serviceMonitor"]["relabelings"][0]
            assert endpoint["metricRelabelings"] == values["serviceMonitor"]["metricRelabelings"]


# -- the PrometheusRule: one source of the rules --------------------------------------------------------

def chart_rule_spec() -> dict[str, Any]:
    return dict(one(rendered("all-values.yaml"), "PrometheusRule")["spec"])


def test_the_chart_rules_are_the_mixins_rules() -> None:
    mixin = yaml.safe_load((DASHBOARDS / "kubernetes" / "prometheusrule.yaml").read_text())
    assert chart_rule_spec() == mixin["spec"]
    module = build_module()
    assert (CHART / module.CHART_RULES).read_text() == module.render_chart_rules(module.MixinConfig())
    rule = one(rendered("all-values.yaml"), "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["metadata"]["namespace"] == NAMESPACE


def test_the_alerts_keep_their_own_templates() -> None:
    """Helm must not have evaluated the alerts' {{ $labels }} templates (Files.Get passes the file as it is)."""
    annotations = [rule["annotations"]["summary"] for group in chart_rule_spec()["groups"]
                   for rule in group["rules"] if "alert" in rule]
    assert any("{{ $labels.target }}" in text or "$labels" in text for text in annotations)


@pytest.mark.e2e  # starts a process
def test_promtool_checks_the_chart_rules_and_runs_the_alert_tests_on_them(tmp_path: Path) -> None:
    spec = chart_rule_spec()
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
    done = run_promtool("check", "rules", "alerts.yml", cwd=tmp_path)
    count = sum(len(group["rules"]) for group in spec["groups"])
    assert done.returncode == 0 and f"SUCCESS: {count} rules found" in done.stdout, done.stdout + done.stderr
    shutil.copy(PROMETHEUS_DIR / "alerts_test.yml", tmp_path / "alerts_test.yml")
    done = run_promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


@pytest.mark.e2e  # starts a process
def test_build_check_fails_when_the_chart_rules_are_stale(tmp_path: Path) -> None:
    from tests.mixin.mixin_files import run_build

    chart = tmp_path / "chart"
    (chart / "files").mkdir(parents=True)
    (chart / "files" / "rules.yaml").write_text("groups: []\n")
    done = run_build("--check", "--chart", str(chart))
    assert done.returncode == 1 and "rules.yaml" in done.stderr
    done = run_build("--chart", str(chart), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert (chart / "files" / "rules.yaml").read_text() == (CHART / "files" / "rules.yaml").read_text()


# -- the helm test hook, run against a real exporter ------------------------------------------------------

def helm_test_pod() -> dict[str, Any]:
    return one(rendered("all-values.yaml"), "Pod")


@pytest.fixture
def exporter_with_basic_auth(tmp_path: Path) -> Iterator[tuple[ExporterServer, Path, list[str]]]:
    """A real exporter whose targets have the names of all-values.yaml, at loopback ports where nothing
    listens (the test checks the exporter lists each, up or not), behind basic auth read from files."""
    names = [t["name"] for t in values_of("all-values.yaml")["config"]["targets"]]
    secrets = tmp_path / "basic-auth"
    secrets.mkdir()
    (secrets / "username").write_text("prometheus\n")
    (secrets / "password").write_text("s3cret-pw\n")
    port = free_port()
    targets = [Target(name=name, kind="rllm", url=f"http://127.0.0.1:{port}", timeout_seconds=2) for name in names]
    settings = ExporterSettings(listen="127.0.0.1:0", basic_auth_username_file=str(secrets / "username"),
                                basic_auth_password_file=str(secrets / "password"))
    server = make_server(Config(targets=targets, policy=Policy()), settings).start()
    try:
        yield server, secrets, names
    finally:
        server.stop()


def run_helm_test(pod: dict[str, Any], url: str, secrets: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The test Pod's command as rendered (its Python swapped for this one), with its environment, the
    Service URL swapped for ``url`` and the basic-auth mount for ``secrets``."""
    [container] = pod["spec"]["containers"]
    command = container["command"]
    assert command[:2] == ["/opt/gatewayscope/bin/python", "-c"]
    mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "basic-auth")
    environment = {item["name"]: item["value"].replace(mount, str(secrets)) for item in container["env"]}
    assert environment.pop("GATEWAYSCOPE_URL") == f"https://{FULLNAME}.{NAMESPACE}.svc:9466"
    environment.pop("GATEWAYSCOPE_TLS_INSECURE")
    return subprocess.run([sys.executable, *command[1:]], capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ.get("PATH", ""), **environment, "GATEWAYSCOPE_URL": url, **env})


@pytest.mark.e2e  # starts a process
def test_the_helm_test_passes_against_the_exporter(exporter_with_basic_auth: tuple[ExporterServer, Path,
                                                                                    list[str]]) -> None:
    server, secrets, names = exporter_with_basic_auth
    done = run_helm_test(helm_test_pod(), server.url, secrets)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"helm test: {server.url} is ready and serves {len(names)} target(s)"


@pytest.mark.e2e  # starts a process
def test_the_helm_test_fails_on_a_missing_target_or_a_wrong_password(
        exporter_with_basic_auth: tuple[ExporterServer, Path, list[str]], tmp_path: Path) -> None:
    server, secrets, names = exporter_with_basic_auth
    done = run_helm_test(helm_test_pod(), server.url, secrets, GATEWAYSCOPE_TARGETS=f'["{names[0]}", "elsewhere"]')
    assert done.returncode == 1
    assert done.stderr.strip() == f"helm test: {server.url}/metrics has no gatewayscope_up for elsewhere"
    (secrets / "password").write_text("wrong\n")
    done = run_helm_test(helm_test_pod(), server.url, secrets)
    assert done.returncode == 1 and "did not answer: HTTP Error 401" in done.stderr
    done = run_helm_test(helm_test_pod(), f"http://127.0.0.1:{free_port()}", secrets)
    assert done.returncode == 1 and "did not answer" in done.stderr


# -- the sidecar snippet of docs/deploy.md ---------------------------------------------------------------

def sidecar_snippet() -> dict[str, Any]:
    text = (CHART.parents[2] / "docs" / "deploy.md").read_text()
    blocks = [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)]
    [deployment] = [block for block in blocks if isinstance(block, dict) and block.get("kind") == "Deployment"]
    return dict(deployment)


@pytest.mark.parametrize("kubernetes", [OLDEST_KUBERNETES, NEWEST_KUBERNETES])
def test_the_documented_sidecar_validates_strictly_and_mounts_the_store_read_only(kubernetes: str) -> None:
    deployment = sidecar_snippet()
    validate(deployment, f"{kubernetes}.0")
    spec = deployment["spec"]["template"]["spec"]
    sidecar = next(c for c in spec["containers"] if c["name"] == "gatewayscope")
    gateway = next(c for c in spec["containers"] if c["name"] == "gateway")
    shared = {m["name"] for m in gateway["volumeMounts"]} & {m["name"] for m in sidecar["volumeMounts"]}
    assert shared == {"traces"}
    assert all(m.get("readOnly") for m in sidecar["volumeMounts"] if m["name"] in shared | {"gatewayscope-config"})
    chart_context = exporter_container(rendered("default"))["securityContext"]
    assert {k: v for k, v in sidecar["securityContext"].items() if k in chart_context} == chart_context
    assert sidecar["args"] == ["--config", "/etc/gatewayscope/gatewayscope.toml"]
    assert (sidecar["livenessProbe"]["httpGet"]["path"], sidecar["readinessProbe"]["httpGet"]["path"]) == \
        ("/-/healthy", "/-/ready")
