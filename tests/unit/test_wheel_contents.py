"""The wheel ships one top-level package, ``proxy`` (with its generated stubs), and nothing of
the benchmarks or tests beside it. Built offline from a copy of the tree, so a stale ``build/``
in the checkout can neither leak into the wheel nor hide a leak."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__",
                                    ".mypy_cache", ".ruff_cache", ".pytest_cache", "results")


def build_wheel(tmp: Path) -> Path:
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=NOT_SOURCE)
    out = tmp / "wheels"
    # No build isolation: the venv's setuptools builds it, so no index is needed.
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                    "--quiet", "-w", str(out)], check=True, timeout=300)
    (wheel,) = out.glob("radixgate-*.whl")
    return wheel


def test_the_wheel_holds_the_proxy_package_alone(tmp_path: Path) -> None:
    with zipfile.ZipFile(build_wheel(tmp_path)) as whl:
        names = whl.namelist()
        metadata = next(whl.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
        top_level = next(whl.read(n).decode() for n in names if n.endswith(".dist-info/top_level.txt"))
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"proxy"}, sorted(tops)
    assert top_level.split() == ["proxy"]
    for module in ("proxy/sim/__main__.py", "proxy/loadgen/client.py", "proxy/demo.py",
                   "proxy/_proto/radixgate/v1/generate_pb2.py", "proxy/_proto/radixgate/v1/generate_pb2.pyi"):
        assert module in names, module
    runtime = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert runtime and not any("grpcio-tools" in line for line in runtime), runtime
