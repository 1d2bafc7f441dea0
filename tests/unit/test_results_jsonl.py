"""The committed results are read plain or gzipped alike; a run's first line without the rest."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from loadtests.jsonl import first_line, read_jsonl


def test_plain_and_gzipped_files_read_alike(tmp_path: Path) -> None:
    text = '{"a": 1}\n{"a": 2}\n'
    (tmp_path / "plain.jsonl").write_text(text)
    (tmp_path / "packed.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    for name in ("plain.jsonl", "packed.jsonl"):
        assert read_jsonl(tmp_path / name) == [{"a": 1}, {"a": 2}]
        assert first_line(tmp_path / name) == '{"a": 1}'


def test_the_first_line_of_an_empty_or_missing_file(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("")
    assert first_line(tmp_path / "empty.jsonl") == ""
    with pytest.raises(FileNotFoundError):
        first_line(tmp_path / "absent.jsonl")
