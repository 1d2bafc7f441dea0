"""API keys: loading from file and environment, constant-time acceptance, presentation forms."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config import ConfigError, SecurityConfig
from proxy.security import ApiKeys, load_api_keys, presented_key, upstream_authorization


def test_keys_are_accepted_exactly() -> None:
    keys = ApiKeys(["alpha-key-1", "beta-key-2"])
    assert keys.accepts("alpha-key-1") and keys.accepts("beta-key-2")
    assert not keys.accepts("alpha-key-") and not keys.accepts("alpha-key-12") and not keys.accepts("")
    assert not keys.accepts(None)


def test_no_keys_means_authentication_is_off_and_nothing_is_accepted() -> None:
    keys = ApiKeys([])
    assert not keys and not keys.accepts("anything")


def test_the_repr_never_shows_a_key() -> None:
    assert "topsecret" not in repr(ApiKeys(["topsecret"])) and "1 keys" in repr(ApiKeys(["topsecret"]))


def test_keys_load_from_a_file_skipping_blanks_and_comments(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# ops team\nkey-one\n\n  key-two  \n")
    keys = load_api_keys(SecurityConfig(api_keys_file=str(path), api_keys_env=""), {})
    assert len(keys) == 2 and keys.accepts("key-two")


def test_keys_load_from_the_named_environment_variable() -> None:
    env = {"MY_KEYS": "k1, k2,,", "RADIXGATE_API_KEYS": "ignored"}
    keys = load_api_keys(SecurityConfig(api_keys_env="MY_KEYS"), env)
    assert len(keys) == 2 and keys.accepts("k1") and not keys.accepts("ignored")


def test_file_and_environment_keys_add_up(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("from-file\n")
    keys = load_api_keys(SecurityConfig(api_keys_file=str(path)), {"RADIXGATE_API_KEYS": "from-env"})
    assert keys.accepts("from-file") and keys.accepts("from-env")


def test_a_named_key_file_that_is_missing_or_empty_fails_closed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"security\.api_keys_file"):
        load_api_keys(SecurityConfig(api_keys_file=str(tmp_path / "nope")), {})
    empty = tmp_path / "empty"
    empty.write_text("# nothing yet\n")
    with pytest.raises(ConfigError, match="no keys"):
        load_api_keys(SecurityConfig(api_keys_file=str(empty)), {})


def test_an_unreadable_key_file_error_does_not_quote_its_content(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_bytes(b"secret-\xff-key\n")
    with pytest.raises(ConfigError) as info:
        load_api_keys(SecurityConfig(api_keys_file=str(path)), {})
    assert "secret" not in str(info.value)


@pytest.mark.parametrize("authorization,x_api_key,expected", [
    ("Bearer abc", None, "abc"),
    ("bearer   abc  ", None, "abc"),
    (None, "abc", "abc"),
    ("Basic dXNlcjpwYXNz", "abc", "abc"),  # not a bearer token: fall back to x-api-key
    ("Bearer ", None, None),
    ("Basic dXNlcjpwYXNz", None, None),
    (None, "   ", None),
    (None, None, None),
])
def test_a_key_is_presented_as_a_bearer_token_or_x_api_key(
        authorization: str | None, x_api_key: str | None, expected: str | None) -> None:
    assert presented_key(authorization, x_api_key) == expected


@pytest.mark.parametrize(
    ("upstream_key", "own_keys_checked", "client", "sent"),
    [
        ("wk", True, "Bearer mine", "Bearer wk"),  # a configured upstream key always wins
        ("wk", False, "Bearer mine", "Bearer wk"),
        ("wk", False, None, "Bearer wk"),
        (None, True, "Bearer mine", None),  # radixgate's own key never reaches a worker
        (None, False, "Bearer theirs", "Bearer theirs"),  # no auth here: pass the caller's through
        (None, False, None, None),
    ],
)
def test_the_worker_gets_the_upstream_key_or_a_pass_through_never_our_own(
        upstream_key: str | None, own_keys_checked: bool, client: str | None, sent: str | None) -> None:
    assert upstream_authorization(client, upstream_key=upstream_key, own_keys_checked=own_keys_checked) == sent
