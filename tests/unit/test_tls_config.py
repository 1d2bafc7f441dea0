"""The tls config section: files set together, present, and mutual TLS only on top of TLS."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config import ConfigError, load
from proxy.frontends.tls import ServingTls, http_ssl_context


def test_tls_is_off_by_default_and_both_fronts_then_serve_plaintext() -> None:
    cfg = load(env={})
    assert not cfg.tls.enabled
    assert http_ssl_context(cfg.tls) is None
    assert ServingTls(cfg.tls).grpc_credentials() is None and ServingTls(cfg.tls).files == ()


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"tls.cert_file": "CERT"}, "tls.key_file"),
        ({"tls.key_file": "KEY"}, "tls.key_file"),
        ({"tls.client_ca_file": "CERT"}, "tls.client_ca_file"),
        ({"tls.cert_file": "CERT", "tls.key_file": "MISSING"}, "tls.key_file"),
        ({"tls.cert_file": "MISSING", "tls.key_file": "KEY"}, "tls.cert_file"),
        ({"tls.cert_file": "CERT", "tls.key_file": "KEY", "tls.client_ca_file": "MISSING"}, "tls.client_ca_file"),
    ],
)
def test_an_incomplete_or_missing_tls_setting_names_the_field(
    tmp_path: Path, overrides: dict[str, str], field: str
) -> None:
    files = {"CERT": tmp_path / "c.pem", "KEY": tmp_path / "k.pem", "MISSING": tmp_path / "absent.pem"}
    files["CERT"].write_text("x")
    files["KEY"].write_text("x")
    with pytest.raises(ConfigError) as info:
        load(env={}, overrides={k: str(files[v]) for k, v in overrides.items()})
    assert str(info.value).startswith(f"{field}:")


def test_tls_files_can_come_from_the_environment(tmp_path: Path) -> None:
    (tmp_path / "c.pem").write_text("x")
    (tmp_path / "k.pem").write_text("x")
    cfg = load(env={"RADIXGATE_TLS__CERT_FILE": str(tmp_path / "c.pem"),
                    "RADIXGATE_TLS__KEY_FILE": str(tmp_path / "k.pem")})
    assert cfg.tls.enabled and cfg.tls.key_file.endswith("k.pem")
