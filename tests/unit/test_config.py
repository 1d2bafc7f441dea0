import pytest

from proxy import config


def test_env_overrides_yaml_and_cli_overrides_env(tmp_path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("routing:\n  policy: round_robin\nserver:\n  port: 9000\n")
    cfg = config.load(f, env={"RADIXGATE_ROUTING__POLICY": "least_load", "RADIXGATE_SERVER__PORT": "9100"},
                      overrides={"server.port": 9200})
    assert cfg.routing.policy == "least_load"
    assert cfg.server.port == 9200


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"health.interval_s": "soon"}, "health.interval_s"),
        ({"server.port": 70000}, "server.port"),
        ({"health.nope": 1}, "health.nope"),
        ({"workers.static": ["ftp://x"]}, "workers.static[0].url"),
        ({"telemetry.log_prompts": "yes"}, "telemetry.log_prompts"),
        ({"routing.hold_max_s": -1}, "routing.hold_max_s"),
    ],
)
def test_errors_name_the_bad_field(overrides, field) -> None:
    with pytest.raises(config.ConfigError) as e:
        config.load(env={}, overrides=overrides)
    assert str(e.value).startswith(field)


def test_workers_accept_plain_urls() -> None:
    cfg = config.load(env={}, overrides={"workers.static": ["http://127.0.0.1:30000"]})
    assert cfg.workers.static[0].url == "http://127.0.0.1:30000"
