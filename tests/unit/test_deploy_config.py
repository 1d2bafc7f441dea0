"""deploy/radixgate.example.yaml documents every config field at its default, and every config the
deploy files ship loads."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.config import Config, load

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
EXAMPLE = DEPLOY / "radixgate.example.yaml"


def field_paths(cls: type[Any], prefix: str = "") -> Iterator[str]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]) and hints[f.name].__name__ != "WorkerEntry":
            yield from field_paths(hints[f.name], f"{prefix}{f.name}.")
        else:
            yield prefix + f.name


def yaml_paths(node: Any, prefix: str = "") -> Iterator[str]:
    for key, value in node.items():
        if isinstance(value, dict) and value:
            yield from yaml_paths(value, f"{prefix}{key}.")
        else:
            yield prefix + key


def test_the_example_names_every_config_field_and_nothing_else() -> None:
    documented = set(yaml_paths(yaml.safe_load(EXAMPLE.read_text())))
    assert documented == set(field_paths(Config))


def test_the_example_values_are_the_defaults() -> None:
    assert load(EXAMPLE, env={}) == Config()


def test_every_field_line_of_the_example_carries_a_comment() -> None:
    for number, line in enumerate(EXAMPLE.read_text().splitlines(), 1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and not stripped.endswith(":"):
            assert " # " in line, f"line {number} lacks a comment: {line!r}"


@pytest.mark.parametrize("path", [
    "radixgate.container.yaml", "compose/radixgate.yaml", "k8s/gateway/radixgate.yaml",
    "k8s/sidecar/radixgate.yaml", "k8s/overlays/gateway-dns/radixgate.yaml",
])
def test_every_shipped_config_loads(path: str) -> None:
    cfg = load(DEPLOY / path, env={})
    assert cfg.server.host == "0.0.0.0"  # all of them run in containers
