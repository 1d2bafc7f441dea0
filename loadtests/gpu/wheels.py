"""The wheels a GPU fleet run carries to the device machine, in ``.wheels/`` (gitignored).

    python3 -m loadtests.gpu.wheels            # download, strip smg's library, print what travels

The device's image has torch, transformers, aiohttp, uvloop, xxhash, prometheus-client, pyyaml,
msgpack and an older grpcio; what radixgate and smg 1.13.0 need beyond it travels as wheels
(``../shared/reference/peer-routers.md``), installed there with
``pip install --no-index --no-deps --target /tmp/site .wheels/*.whl``.

What travels (the working tree: tracked and untracked-not-ignored files, plus the carried
``.wheels``) may not exceed 64 MiB a call. smg's wheel is 37 MB of it, most of that a Rust library
with its symbol table; without the table (``strip -s``: no code changes, only names for
backtraces) it is ~31 MB, and repacked with LZMA instead of deflate (a compression method of the
zip format that pip's ``zipfile`` reads) 21.8 MB, which leaves the results the repository keeps
adding room (on 2026-12-06 the tree's 26 MiB and the deflated wheels passed 64 MiB). The
stripped wheel's RECORD names the new library's hash and size, so it installs as any wheel.

By 2026-12-07 the tree had grown to 34.9 MiB, mostly results, and tree and wheels passed 64 MiB
again: the results' warm-up and diagnosis logs are now committed gzipped too (30.5 MiB, 59.9 with
every wheel), and ``.wheels/lite/`` holds every wheel but smg's (hard links, 8.6 MiB) for a call
that runs no smg (carry ``.wheels/lite``, install ``.wheels/lite/*.whl``). Later that day the tree
(33.5 MiB) and every wheel passed 64 MiB once more: a call that runs smg is two on one warm
machine, smg's wheel alone installed to ``/tmp/site_smg`` first, then ``.wheels/lite`` with that
directory on PYTHONPATH (docs/gpu-fleet.md, "Commands").
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEELS = ("grpcio==1.85.3", "protobuf==7.36.2", "grpcio-health-checking==1.85.1", "grpcio-reflection==1.85.1",
          "pyzmq==27.3.0", "dnspython==2.9.2", "smg==1.13.0", "setproctitle==1.3.8")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "manylinux_2_26_x86_64", "manylinux_2_34_x86_64", "manylinux_2_35_x86_64")
LIMIT = 64 * 2**20


def download(dest: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", "-d", str(dest)]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    subprocess.run(cmd + list(WHEELS), check=True)


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def strip_wheel(wheel: Path, suffix: str = ".so") -> int:
    """Rewrite ``wheel`` LZMA-compressed, with every ``suffix`` library stripped of its symbol table
    (``strip -s``, where there is a ``strip``) and RECORD updated; returns the bytes saved."""
    before = wheel.stat().st_size
    can_strip = shutil.which("strip") is not None
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as src:
        members = {info.filename: src.read(info) for info in src.infolist()}
        changed = {}
        for name, data in members.items():
            if not (can_strip and name.endswith(suffix)):
                continue
            lib = Path(tmp) / "lib"
            lib.write_bytes(data)
            subprocess.run(["strip", "-s", str(lib)], check=True)
            stripped = lib.read_bytes()
            if len(stripped) < len(data):
                changed[name] = stripped
        if changed:
            members.update(changed)
            record = next(n for n in members if n.endswith(".dist-info/RECORD"))
            lines = []
            for line in members[record].decode().splitlines():
                name = line.split(",", 1)[0]
                lines.append(record_line(name, members[name]) if name in changed else line)
            members[record] = ("\n".join(lines) + "\n").encode()
        out = Path(tmp) / wheel.name
        with zipfile.ZipFile(out, "w", zipfile.ZIP_LZMA) as dst:
            for name, data in members.items():
                dst.writestr(name, data)
        shutil.move(out, wheel)
    return before - wheel.stat().st_size


def tree_bytes(root: Path) -> int:
    """Bytes of what git would send: tracked and untracked-not-ignored files."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                           check=True, capture_output=True).stdout.split(b"\0")
    return sum((root / n.decode()).stat().st_size for n in names if n and (root / n.decode()).is_file())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dest", type=Path, default=Path(".wheels"))
    p.add_argument("--keep-symbols", action="store_true", help="leave smg's library as published")
    a = p.parse_args()
    a.dest.mkdir(exist_ok=True)
    download(a.dest)
    if not a.keep_symbols:
        for wheel in a.dest.glob("smg-*.whl"):
            print(f"{wheel.name}: {strip_wheel(wheel) / 1e6:.1f} MB saved by its library's symbol table and LZMA")
    lite = a.dest / "lite"
    lite.mkdir(exist_ok=True)
    for wheel in a.dest.glob("*.whl"):
        if not wheel.name.startswith("smg-"):
            (lite / wheel.name).unlink(missing_ok=True)
            (lite / wheel.name).hardlink_to(wheel)
    tree = tree_bytes(Path.cwd())
    for name, folder in (("wheels", a.dest), ("without smg (carry .wheels/lite)", lite)):
        wheels = sum(w.stat().st_size for w in folder.glob("*.whl"))
        print(f"{name} {wheels / 2**20:.1f} MiB + tree {tree / 2**20:.1f} MiB = {(wheels + tree) / 2**20:.1f} MiB "
              f"of the device's {LIMIT / 2**20:.0f} MiB a call")


if __name__ == "__main__":
    main()
