"""The ``[exporter]`` table: defaults, one clear line per problem, where the password comes from."""

from __future__ import annotations

from pathlib import Path

import pytest

from gatewayscope.errors import ConfigError
from gatewayscope.exporter.server import read_budget
from gatewayscope.exporter.settings import ExporterSettings, parse_exporter_settings, parse_listen


def problems(raw: dict) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_exporter_settings(raw, "g.toml")
    return caught.value.problems


def test_defaults() -> None:
    settings = parse_exporter_settings({})
    assert settings == ExporterSettings()
    assert (settings.listen, settings.min_interval_seconds, settings.max_record_series) == ("127.0.0.1:9465", 15.0, 50)
    assert not settings.tls and not settings.basic_auth


def test_a_full_table(tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("x")
    key.write_text("y")
    settings = parse_exporter_settings({
        "listen": "[::1]:9999", "min_interval_seconds": 0, "max_record_series": 0,
        "default_scrape_timeout_seconds": 3, "scrape_timeout_margin_seconds": 0.25,
        "tls_cert_file": str(cert), "tls_key_file": str(key),
        "basic_auth_username": "prom", "basic_auth_password_file": str(tmp_path / "pw"),
    })
    assert settings.tls and settings.basic_auth
    assert settings.min_interval_seconds == 0.0 and settings.max_record_series == 0
    (tmp_path / "pw").write_text("from-a-file\n")
    assert settings.resolve_password() == "from-a-file"


def test_every_problem_is_one_line() -> None:
    lines = problems({
        "listen": "9465", "min_interval_seconds": "15", "max_record_series": 2.5,
        "default_scrape_timeout_seconds": 0, "scrape_timeout_margin_seconds": True, "tls_key_file": "",
        "basic_auth_password_env": "PW", "colour": "blue", "full_read_interval_seconds": -1,
    })
    assert lines == [
        "g.toml: exporter.colour: unknown key; expected one of listen, min_interval_seconds, max_record_series, "
        "default_scrape_timeout_seconds, scrape_timeout_margin_seconds, full_read_interval_seconds, tls_cert_file, "
        "tls_key_file, "
        "basic_auth_username, basic_auth_username_file, basic_auth_password_env, basic_auth_password_file, "
        "discovery_dir",
        "g.toml: exporter.listen: expected HOST:PORT like '127.0.0.1:9465', got '9465'",
        "g.toml: exporter.min_interval_seconds: expected a number of seconds >= 0, got '15'",
        "g.toml: exporter.default_scrape_timeout_seconds: expected a positive number of seconds, got 0",
        "g.toml: exporter.scrape_timeout_margin_seconds: expected a number of seconds >= 0, got True",
        "g.toml: exporter.full_read_interval_seconds: expected a number of seconds >= 0, got -1",
        "g.toml: exporter.max_record_series: expected a whole number >= 0, got 2.5",
        "g.toml: exporter.tls_key_file: expected a non-empty string, got ''",
        "g.toml: exporter.tls_cert_file: TLS needs both tls_cert_file and tls_key_file",
        "g.toml: exporter.basic_auth_password_env: needs basic_auth_username (or basic_auth_username_file) as well",
    ]
    assert all("\n" not in line for line in lines)


def test_a_password_in_the_file_is_refused_with_a_hint() -> None:
    lines = problems({"basic_auth_username": "prom", "basic_auth_password": "hunter2"})
    assert any("a password never goes in the file" in line for line in lines)
    assert any("needs exactly one of basic_auth_password_env or basic_auth_password_file" in line for line in lines)
    assert not any("hunter2" in line for line in lines)


def test_password_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = parse_exporter_settings({"basic_auth_username": "prom", "basic_auth_password_env": "GS_PW_T"})
    monkeypatch.delenv("GS_PW_T", raising=False)
    with pytest.raises(ConfigError, match="GS_PW_T is not set"):
        settings.resolve_password()
    monkeypatch.setenv("GS_PW_T", "pw")
    assert settings.resolve_password() == "pw"


@pytest.mark.parametrize(("text", "expected"), [
    ("127.0.0.1:9465", ("127.0.0.1", 9465)), ("0.0.0.0:0", ("0.0.0.0", 0)), (":80", ("", 80)),
    ("[::]:9465", ("::", 9465)), ("exporter.local:9465", ("exporter.local", 9465)),
])
def test_parse_listen(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["9465", "host:", "host:99999", "::1:9465", "[::1]9465", "host:port"])
def test_parse_listen_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_listen(text)


def test_read_budget() -> None:
    settings = ExporterSettings(default_scrape_timeout_seconds=10, scrape_timeout_margin_seconds=0.5)
    assert read_budget("10", settings) == 9.5
    assert read_budget("2.5", settings) == 2.0
    assert read_budget("0.6", settings) == 0.3  # the margin would take half or more: half the timeout
    assert read_budget(None, settings) == 9.5
    for junk in ("", "abc", "-3", "0", "nan", "inf"):
        assert read_budget(junk, settings) == 9.5


def test_file_keys_name_systemd_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``$CREDENTIALS_DIRECTORY/NAME`` is NAME in the folder systemd's LoadCredential= fills."""
    (tmp_path / "exporter-user").write_text("prom\n")
    (tmp_path / "exporter-password").write_text("from-systemd\n")
    (tmp_path / "tls.crt").write_text("x")
    (tmp_path / "tls.key").write_text("y")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    settings = parse_exporter_settings({
        "basic_auth_username_file": "$CREDENTIALS_DIRECTORY/exporter-user",
        "basic_auth_password_file": "${CREDENTIALS_DIRECTORY}/exporter-password",
        "tls_cert_file": "$CREDENTIALS_DIRECTORY/tls.crt", "tls_key_file": "$CREDENTIALS_DIRECTORY/tls.key",
    })
    assert settings.basic_auth and settings.basic_auth_username is None
    assert settings.basic_auth_password_file == str(tmp_path / "exporter-password")
    assert settings.tls_key_file == str(tmp_path / "tls.key")
    assert (settings.resolve_username(), settings.resolve_password()) == ("prom", "from-systemd")
    # only that variable is expanded, and only at the start of the path
    other = parse_exporter_settings({"basic_auth_username": "p", "basic_auth_password_file": "/x/$HOME/pw"})
    assert other.basic_auth_password_file == "/x/$HOME/pw"


def test_a_credential_without_the_credentials_folder_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    lines = problems({"basic_auth_username": "p", "basic_auth_password_file": "$CREDENTIALS_DIRECTORY/pw"})
    assert lines == ["g.toml: exporter.basic_auth_password_file: names $CREDENTIALS_DIRECTORY, which is not set "
                     "(systemd sets it for a service with LoadCredential=); run it under such a unit or give the "
                     "file's own path"]


def test_one_username_source_only() -> None:
    lines = problems({"basic_auth_username": "p", "basic_auth_username_file": "/run/u",
                      "basic_auth_password_env": "PW"})
    assert lines == ["g.toml: exporter.basic_auth_username_file: give basic_auth_username or "
                     "basic_auth_username_file, not both"]
    lines = problems({"basic_auth_username_file": "/run/u"})
    assert lines == ["g.toml: exporter.basic_auth_username_file: needs exactly one of basic_auth_password_env or "
                     "basic_auth_password_file"]
