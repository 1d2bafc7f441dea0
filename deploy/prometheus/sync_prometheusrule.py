"""Write prometheusrule.yaml (Prometheus Operator) from rules/*.yaml, so the two never drift.

    python deploy/prometheus/sync_prometheusrule.py          # rewrite
    python deploy/prometheus/sync_prometheusrule.py --check  # exit 1 if it is out of date
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
RULE_FILES = ("rules/radixgate-recording.yaml", "rules/radixgate-alerts.yaml")
HEADER = (
    "# Prometheus Operator form of rules/*.yaml (the same groups, verbatim; a test keeps them equal).\n"
    "# Regenerate after editing the rule files:  python deploy/prometheus/sync_prometheusrule.py\n"
)


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, data: str) -> Any:
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|" if "\n" in data else None)


_Dumper.add_representer(str, _str)


def render() -> str:
    groups: list[Any] = []
    for name in RULE_FILES:
        groups += yaml.safe_load((HERE / name).read_text())["groups"]
    doc = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "radixgate", "labels": {"app.kubernetes.io/name": "radixgate"}},
        "spec": {"groups": groups},
    }
    return HEADER + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=110)


def main(argv: list[str]) -> int:
    target = HERE / "prometheusrule.yaml"
    text = render()
    if "--check" in argv:
        if target.read_text() != text:
            print(f"{target} is out of date; run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    target.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
