"""Reading the benchmarks' committed JSON-lines results: ``X.jsonl`` or, where the per-request
files of older runs are stored compressed to keep the working tree small (a device call carries
it whole, 64 MiB with the wheels), ``X.jsonl.gz``."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any


def resolve(path: Path) -> Path | None:
    """``path`` if it exists, else its ``.gz`` twin if that does, else None."""
    if path.exists():
        return path
    packed = path.with_name(path.name + ".gz")
    return packed if packed.exists() else None


def exists(path: Path) -> bool:
    return resolve(path) is not None


def read_text(path: Path) -> str:
    """The file's text, decompressed if only ``path.gz`` is there (FileNotFoundError if neither)."""
    found = resolve(path)
    if found is None:
        raise FileNotFoundError(path)
    if found.suffix == ".gz":
        return gzip.decompress(found.read_bytes()).decode()
    return found.read_text()


def first_line(path: Path) -> str:
    """The file's first line (decompressing only as far as it), "" for an empty file;
    FileNotFoundError if neither ``path`` nor ``path.gz`` is there."""
    found = resolve(path)
    if found is None:
        raise FileNotFoundError(path)
    opener = gzip.open if found.suffix == ".gz" else open
    with opener(found, "rt") as f:
        return f.readline().rstrip("\n")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in read_text(path).splitlines() if line.strip()]
