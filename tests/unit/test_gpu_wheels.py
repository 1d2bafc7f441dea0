"""loadtests/gpu/wheels.py: a wheel rewritten without its libraries' symbol tables, LZMA-compressed,
still names each file's hash and size in RECORD, and pip installs it as published."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from loadtests.gpu.wheels import record_line, strip_wheel


def an_unstripped_library(tmp: Path) -> Path:
    """A copy of an extension module of this environment that ``strip -s`` makes smaller."""
    for module in ("uvloop.loop", "yaml._yaml", "markupsafe._speedups"):
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.origin or not spec.origin.endswith(".so"):
            continue
        probe = tmp / "probe.so"
        shutil.copy(spec.origin, probe)
        size = probe.stat().st_size
        subprocess.run(["strip", "-s", str(probe)], check=True)
        if probe.stat().st_size < size:
            return Path(spec.origin)
    pytest.skip("no extension module here carries a symbol table")


def test_a_stripped_wheel_is_smaller_and_its_record_matches_every_file(tmp_path: Path) -> None:
    if shutil.which("strip") is None:
        pytest.skip("binutils' strip is not installed")
    lib = an_unstripped_library(tmp_path).read_bytes()
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    files = {"pkg/__init__.py": b"", "pkg/native.so": lib,
             "pkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n",
             "pkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr("pkg-1.0.dist-info/RECORD", "\n".join(
            [record_line(n, d) for n, d in files.items()] + ["pkg-1.0.dist-info/RECORD,,"]) + "\n")
    saved = strip_wheel(wheel)
    assert saved > 0
    with zipfile.ZipFile(wheel) as zf:
        native = zf.read("pkg/native.so")
        record = zf.read("pkg-1.0.dist-info/RECORD").decode().splitlines()
        assert zf.read("pkg/__init__.py") == b""
    assert len(native) < len(lib)
    assert record_line("pkg/native.so", native) in record
    assert record_line("pkg/__init__.py", b"") in record
    assert "pkg-1.0.dist-info/RECORD,," in record
    with zipfile.ZipFile(wheel) as zf:
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_LZMA}
    assert strip_wheel(wheel) == 0  # nothing left to strip, and LZMA again is the same size
    # pip reads the LZMA members: the library lands as the RECORD says
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--target", str(site), str(wheel)], check=True, capture_output=True)
    assert (site / "pkg" / "native.so").read_bytes() == native
