"""``radixgate demo --set KEY=VALUE``: config fields for every run, typed as YAML."""

from __future__ import annotations

import pytest

from proxy.demo import build_parser


def test_settings_parse_as_yaml_scalars() -> None:
    args = build_parser().parse_args(["--set", "routing.hold_max_s=0", "--set", "routing.params={ttft: {hold_tokens: 64}}"])
    assert args.set == [("routing.hold_max_s", 0), ("routing.params", {"ttft": {"hold_tokens": 64}})]


@pytest.mark.parametrize("bad", ["routing.hold_max_s", "=3"])
def test_a_setting_without_key_and_value_is_refused(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--set", bad])
    assert "expected KEY=VALUE" in capsys.readouterr().err
