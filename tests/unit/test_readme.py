"""The README stays a front page: the two commands first, short, and every link resolves."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_the_readme_opens_with_the_demo_and_the_test_commands() -> None:
    block = README.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert [line.split("#")[0].strip() for line in block] == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    assert (ROOT / ".ci" / "run").read_text().strip().endswith("exec bash scripts/test.sh")


def test_the_readme_is_under_250_lines() -> None:
    assert len(README.splitlines()) < 250


def test_every_relative_link_in_the_readme_and_docs_names_a_file_that_exists() -> None:
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name}: {target}"
