"""Configuration: the documented shape loads; every wrong file gives one clear line per problem."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gatewayscope.cli import main
from gatewayscope.config import (
    CUSTOM_POOL_ENV,
    DEFAULT_MAX_BODY_BYTES,
    STANDARD_POOL_ENV,
    AuthConfig,
    build_config,
    load_config,
    pool_override,
)
from gatewayscope.errors import ConfigError


def write(tmp_path: Path, text: str, name: str = "gatewayscope.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_documented_shape_loads(tmp_path: Path) -> None:
    path = write(tmp_path, """
        [[targets]]
        name = "rl-gateway"
        kind = "rllm"
        url = "http://127.0.0.1:9090"
        timeout_seconds = 10

        [[targets]]
        name = "rl-file"
        kind = "rllm"
        path = "/srv/rllm/gateway_traces.db"

        [[targets]]
        name = "bifrost"
        kind = "bifrost"
        url = "http://127.0.0.1:8080/"
        memory_limit_bytes = 1073741824
        [targets.auth]
        username = "admin"
        password_env = "BIFROST_PW"

        [policy]
        orphan_idle_seconds = 7200
        max_weight_lag = 2
    """)
    config = load_config(path)
    assert [t.name for t in config.targets] == ["rl-gateway", "rl-file", "bifrost"]
    assert config.targets[0].url == "http://127.0.0.1:9090"
    assert config.targets[1].path == "/srv/rllm/gateway_traces.db"
    assert config.targets[2].url == "http://127.0.0.1:8080"
    assert config.targets[2].memory_limit_bytes == 1 << 30
    assert config.targets[2].auth == AuthConfig(username="admin", password_env="BIFROST_PW")
    assert config.policy.orphan_idle_seconds == 7200
    assert (config.policy.standard_pool, config.policy.custom_pool, config.policy.queue_per_worker) == (512, 64, 16)


def test_every_problem_is_one_line_naming_file_and_key(tmp_path: Path) -> None:
    path = write(tmp_path, """
        [[targets]]
        name = "a"
        kind = "rllm"
        url = "ftp://x"
        timeout_seconds = -1

        [[targets]]
        name = "a b"
        kind = "nginx"

        [[targets]]
        name = "c"
        kind = "rllm"
        url = "http://h:1"
        path = "/x.db"

        [[targets]]
        name = "d"
        kind = "bifrost"
        url = "http://h:2"
        [targets.auth]
        username = "admin"
        password = "hunter2"

        [policy]
        orphan_idle_seconds = "soon"
        max_weight_lag = -3
        colour = "red"
    """)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    problems = info.value.problems
    text = "\n".join(problems)
    assert all(line.startswith(f"{path}: ") for line in problems)
    assert "targets[0].url: expected an http:// or https:// URL" in text
    assert "targets[0].timeout_seconds: expected a positive number" in text
    assert "targets[1].name:" in text and "targets[1].kind: expected \"rllm\" or \"bifrost\", got 'nginx'" in text
    assert "targets[2]: an rllm target needs exactly one of url" in text
    assert "targets[3].auth.password: unknown key (a password never goes in the file" in text
    assert "policy.orphan_idle_seconds: expected a positive number of seconds, got 'soon'" in text
    assert "policy.max_weight_lag: expected a whole number >= 0, got -3" in text
    assert "policy.colour: unknown key" in text
    assert "hunter2" not in text


def test_duplicate_names_and_bad_toml(tmp_path: Path) -> None:
    dup = write(tmp_path, """
        [[targets]]
        name = "x"
        kind = "rllm"
        url = "http://a:1"
        [[targets]]
        name = "x"
        kind = "rllm"
        url = "http://a:2"
    """)
    with pytest.raises(ConfigError, match=r"targets\[1\].name: 'x' is used by another target"):
        load_config(dup)
    broken = write(tmp_path, "[[targets]\nname=", name="broken.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(broken)
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "missing.toml")


def test_cli_bad_config_exits_2_with_one_line_per_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, """
        [[targets]]
        name = "x"
        kind = "bifrost"
        [policy]
        custom_pool = 0
    """)
    assert main(["scan", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2
    assert "targets[0]: a bifrost target needs url" in err[0]
    assert "policy.custom_pool: expected a whole number >= 1, got 0" in err[1]


def test_cli_without_targets_says_what_to_do(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan"]) == 2
    assert "No targets: pass --config FILE" in capsys.readouterr().err


def test_cli_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["scan", "--format", "yaml"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_flags_make_targets_and_override_policy() -> None:
    config = build_config(None, trace_stores=["http://127.0.0.1:9/", "/tmp/x.db"], bifrost_urls=["http://b:8080"],
                          timeout_seconds=3, orphan_idle_seconds=60, max_weight_lag=0)
    assert [(t.kind, t.url, t.path) for t in config.targets] == [
        ("rllm", "http://127.0.0.1:9", None), ("rllm", None, "/tmp/x.db"), ("bifrost", "http://b:8080", None)]
    assert all(t.timeout_seconds == 3 for t in config.targets)
    assert config.policy.orphan_idle_seconds == 60 and config.policy.max_weight_lag == 0
    with pytest.raises(ConfigError, match="--bifrost: expected an http"):
        build_config(None, bifrost_urls=["/path"])


@pytest.mark.parametrize(
    ("raw", "expected", "warns"),
    [("64", 64, False), ("+7", 7, False), ("0", 512, True), ("-5", 512, True), ("1.5", 512, True),
     ("lots", 512, True), ("5000", 5000, False), ("5001", 5000, True), (None, 512, False), ("", 512, False)],
)
def test_pool_override_rules(raw: str | None, expected: int, warns: bool) -> None:
    pool, warning = pool_override(raw, 512, STANDARD_POOL_ENV)
    assert pool == expected
    assert (warning is not None) == warns


def test_env_file_overrides_with_one_warning_each(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_text(f"# platform\nexport {STANDARD_POOL_ENV}=\"256\"\n{CUSTOM_POOL_ENV}=many  # typo\nOTHER=1\n")
    path = write(tmp_path, f"""
        [[targets]]
        name = "b"
        kind = "bifrost"
        url = "http://127.0.0.1:8080"
        [policy]
        env_file = "{env}"
    """)
    config = load_config(path)
    assert config.policy.standard_pool == 256
    assert config.policy.custom_pool == 64
    assert len(config.policy.warnings) == 1 and CUSTOM_POOL_ENV in config.policy.warnings[0]


def test_auth_resolves_from_env_or_file_and_never_from_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GS_USER", "admin")
    monkeypatch.setenv("GS_PW", "s3cret-pw")
    assert AuthConfig(username_env="GS_USER", password_env="GS_PW").resolve() == ("admin", "s3cret-pw")
    secret = tmp_path / "pw"
    secret.write_text("from-file\n")
    assert AuthConfig(username="u", password_file=str(secret)).resolve() == ("u", "from-file")
    with pytest.raises(ConfigError, match="GS_MISSING"):
        AuthConfig(username="u", password_env="GS_MISSING").resolve()
    assert "s3cret" not in repr(AuthConfig(username_env="GS_USER", password_env="GS_PW"))


def test_auth_from_files_and_systemd_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Kubernetes basic-auth Secret mounts username and password files; systemd's LoadCredential= puts them
    in $CREDENTIALS_DIRECTORY."""
    (tmp_path / "bifrost-user").write_text("admin\n")
    (tmp_path / "bifrost-password").write_text("s3cret-pw\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    path = write(tmp_path, """
        [[targets]]
        name = "bifrost"
        kind = "bifrost"
        url = "http://127.0.0.1:8080"
        [targets.auth]
        username_file = "$CREDENTIALS_DIRECTORY/bifrost-user"
        password_file = "${CREDENTIALS_DIRECTORY}/bifrost-password"
    """)
    auth = load_config(path).targets[0].auth
    assert auth == AuthConfig(username_file=str(tmp_path / "bifrost-user"),
                              password_file=str(tmp_path / "bifrost-password"))
    assert auth.resolve() == ("admin", "s3cret-pw")
    monkeypatch.delenv("CREDENTIALS_DIRECTORY")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert [line.split(": ", 1)[1] for line in caught.value.problems] == [
        f"targets[0].auth.{key}: names $CREDENTIALS_DIRECTORY, which is not set (systemd sets it for a service "
        "with LoadCredential=); run it under such a unit or give the file's own path"
        for key in ("password_file", "username_file")]


def test_an_unreadable_or_empty_secret_file_names_the_file_never_the_secret(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("hunter2\n")
    (tmp_path / "empty").write_text("")
    for auth, expected in (
        (AuthConfig(username_file=str(tmp_path / "missing"), password_file=str(tmp_path / "pw")),
         f"auth: username_file: cannot read {tmp_path / 'missing'}: No such file or directory"),
        (AuthConfig(username="u", password_file=str(tmp_path)), f"auth: password_file: cannot read {tmp_path}: "),
        (AuthConfig(username="u", password_file=str(tmp_path / "empty")),
         f"auth: password_file: {tmp_path / 'empty'} is empty; put the secret in it."),
    ):
        with pytest.raises(ConfigError) as caught:
            auth.resolve()
        assert str(caught.value).startswith(expected), caught.value
        assert "hunter2" not in str(caught.value)


def test_max_body_bytes_per_target_with_a_default_and_a_flag_override(tmp_path: Path) -> None:
    path = write(tmp_path, """
        [[targets]]
        name = "big"
        kind = "rllm"
        url = "http://127.0.0.1:9090"
        max_body_bytes = 2147483648
        [[targets]]
        name = "plain"
        kind = "bifrost"
        url = "http://127.0.0.1:8080"
    """)
    config = load_config(path)
    assert [t.max_body_bytes for t in config.targets] == [2 * 1024**3, DEFAULT_MAX_BODY_BYTES]
    assert DEFAULT_MAX_BODY_BYTES == 512 * 1024**2
    overridden = build_config(str(path), max_body_bytes=1024)
    assert [t.max_body_bytes for t in overridden.targets] == [1024, 1024]
    with pytest.raises(ConfigError, match="--max-body-bytes: expected a positive whole number"):
        build_config(str(path), max_body_bytes=0)
    bad = write(tmp_path, """
        [[targets]]
        name = "x"
        kind = "rllm"
        url = "http://a:1"
        max_body_bytes = "lots"
    """, name="bad.toml")
    with pytest.raises(ConfigError, match=r"targets\[0\].max_body_bytes: expected a positive whole number of bytes"):
        load_config(bad)


@pytest.mark.parametrize("opener", ["[", "{a = "])
def test_deeply_nested_toml_is_one_config_error(tmp_path: Path, opener: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "deep.toml"
    path.write_text("a = " + opener * 100_000 + "\n")
    with pytest.raises(ConfigError, match="nested too deeply") as caught:
        load_config(path)
    assert len(caught.value.problems) == 1 and str(path) in caught.value.problems[0]
    assert main(["scan", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nested too deeply to read" in err[0] and "Traceback" not in err[0]


def test_the_bifrost_metrics_and_kubernetes_keys(tmp_path: Path) -> None:
    from gatewayscope.config import KubernetesPod

    path = write(tmp_path, """
        [[targets]]
        name = "plain"
        kind = "bifrost"
        url = "http://bifrost:8080/"

        [[targets]]
        name = "elsewhere"
        kind = "bifrost"
        url = "http://bifrost:8080"
        metrics_url = "http://bifrost-metrics:9090/telemetry/"
        [targets.kubernetes]
        namespace = "llm"
        pod = "bifrost-0"
        container = "bifrost"

        [[targets]]
        name = "off"
        kind = "bifrost"
        url = "http://bifrost:8080"
        read_metrics = false
    """)
    plain, elsewhere, off = load_config(path).targets
    assert plain.runtime_metrics_url == "http://bifrost:8080/metrics" and plain.kubernetes is None
    assert elsewhere.runtime_metrics_url == "http://bifrost-metrics:9090/telemetry"
    assert elsewhere.kubernetes == KubernetesPod(namespace="llm", pod="bifrost-0", container="bifrost")
    assert off.runtime_metrics_url is None


def test_the_bifrost_metrics_and_kubernetes_keys_are_checked(tmp_path: Path) -> None:
    path = write(tmp_path, """
        [[targets]]
        name = "a"
        kind = "bifrost"
        url = "http://bifrost:8080"
        metrics_url = "http://user:pw@bifrost:8080/metrics"
        read_metrics = "yes"
        [targets.kubernetes]
        namespace = "LLM"
        pod = "bifrost-0"
        colour = "red"

        [[targets]]
        name = "b"
        kind = "rllm"
        url = "http://rl:9090"
        metrics_url = "http://rl:9090/metrics"
    """)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = "\n".join(info.value.problems)
    assert "targets[0].metrics_url: must not carry credentials" in text
    assert "targets[0].read_metrics: expected true or false, got 'yes'" in text
    assert "targets[0].kubernetes.namespace: expected a Kubernetes name" in text
    assert "targets[0].kubernetes.container: expected a Kubernetes name" in text and "None" in text
    assert "targets[0].kubernetes.colour: unknown key" in text
    assert "targets[1].metrics_url: only a bifrost target has it" in text
    assert "pw@" not in text


#: every number a config file may hold, with the section it sits in ("target" keys in a [[targets]] table)
NUMBER_KEYS = [("policy", "orphan_idle_seconds"), ("target", "timeout_seconds"),
               ("exporter", "min_interval_seconds"), ("exporter", "default_scrape_timeout_seconds"),
               ("exporter", "scrape_timeout_margin_seconds"), ("exporter", "full_read_interval_seconds")]


@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
@pytest.mark.parametrize(("section", "key"), NUMBER_KEYS)
def test_inf_and_nan_in_toml_are_one_config_line_for_every_seconds_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], section: str, key: str, value: str) -> None:
    target = 'name = "s"\nkind = "rllm"\npath = "/nonexistent/traces.db"\n'
    text = {"policy": f"[policy]\n{key} = {value}\n[[targets]]\n{target}",
            "target": f"[[targets]]\n{target}{key} = {value}\n",
            "exporter": f"[exporter]\n{key} = {value}\n[[targets]]\n{target}"}[section]
    path = tmp_path / "gatewayscope.toml"
    path.write_text(text)
    assert main(["export", "--once", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and key in err[0] and f"got {value.lstrip('-')}" in err[0].replace("-inf", "inf"), err
    assert "Traceback" not in "\n".join(err)


@pytest.mark.parametrize("url", ["http://[::1", "http://[::1]:99999", "http://host:port"])
def test_a_url_python_cannot_split_is_one_config_line(capsys: pytest.CaptureFixture[str], url: str) -> None:
    assert main(["scan", "--trace-store", url]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--trace-store: expected an http:// or https:// URL with a host" in err[0], err
