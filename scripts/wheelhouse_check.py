#!/usr/bin/env python3
"""Is a GPU wheelhouse complete? pip's resolver decides, offline, for the GPU machine's Python.

    python3 scripts/wheelhouse_check.py WHEELHOUSE [--python-version 3.12]

The image's packages are given as they are there (torch, numpy, ... at the image's versions:
IMAGE): each becomes a metadata-only wheel in a temporary directory, and the project one whose
requirements are pyproject.toml's (with the tensorboard extra). Then
`pip install --dry-run --no-index --only-binary=:all: --python-version V --target T` resolves
the project from those and the wheelhouse alone: a dependency missing from the wheelhouse, or one
at a version that does not fit, fails the resolution. systemd-python (a source, built on the
machine when it can be) must be in the wheelhouse but is left out of the resolution. Exit 0 when
complete, 1 with pip's message when not.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: The GPU image's packages (its description) and those they bring that andrea's dependencies
#: also need (torch: typing-extensions; tensorboard: protobuf, packaging).
IMAGE = {
    "torch": "2.11.0",
    "numpy": "2.5.0",
    "matplotlib": "3.11.2",
    "tokenizers": "0.23.0",
    "prometheus-client": "0.26.0",
    "safetensors": "0.8.0",
    "tensorboard": "2.21.0",
    "protobuf": "7.36.2",
    "packaging": "26.4",
    "typing-extensions": "4.16.0",
    "pytest": "9.2.0",
    "pytest-xdist": "3.8.0",
    "hypothesis": "6.170.17",
    "setuptools": "80.9.0",
}

NOT_RESOLVED = "systemd-python"


def stub_wheel(directory: Path, name: str, version: str, requires: list[str]) -> Path:
    """A wheel holding only metadata: what pip's resolver reads."""
    dist = f"{re.sub(r'[-_.]+', '_', name)}-{version}"
    files = {
        f"{dist}.dist-info/METADATA": "Metadata-Version: 2.1\n"
        f"Name: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: stub\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    files[f"{dist}.dist-info/RECORD"] = "\n".join([*record, f"{dist}.dist-info/RECORD,,"]) + "\n"
    out = directory / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return out


def project_requirements() -> tuple[str, list[str]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    deps = [*project["dependencies"], *project["optional-dependencies"]["tensorboard"]]
    return project["version"], [d for d in deps if not d.startswith(NOT_RESOLVED)]


def resolve(wheelhouse: Path, python_version: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="wheelhouse-check-") as tmp:
        stubs = Path(tmp) / "image"
        stubs.mkdir()
        for name, version in IMAGE.items():
            stub_wheel(stubs, name, version, [])
        version, requires = project_requirements()
        stub_wheel(stubs, "andrea", version, requires)
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q"]
        cmd += ["--disable-pip-version-check", "--no-index", "--only-binary=:all:"]
        cmd += ["--find-links", str(wheelhouse), "--find-links", str(stubs)]
        cmd += ["--python-version", python_version, "--implementation", "cp"]
        cmd += ["--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64"]
        cmd += ["--target", str(Path(tmp) / "target"), "--report", "-", "andrea"]
        return subprocess.run(cmd, capture_output=True, text=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("wheelhouse", type=Path)
    p.add_argument("--python-version", default="3.12")
    a = p.parse_args()
    if not any(a.wheelhouse.glob("systemd*python*.tar.gz")):
        print(f"wheelhouse_check: no systemd-python source in {a.wheelhouse}", file=sys.stderr)
        return 1
    r = resolve(a.wheelhouse, a.python_version)
    if r.returncode != 0:
        print(f"wheelhouse_check: INCOMPLETE for Python {a.python_version}:", file=sys.stderr)
        print(r.stderr.strip(), file=sys.stderr)
        return 1
    chosen = json.loads(r.stdout)["install"]
    from_wheelhouse = sorted(
        f"{x['metadata']['name']} {x['metadata']['version']}"
        for x in chosen
        if Path(x["download_info"]["url"].removeprefix("file://")).parent == a.wheelhouse.resolve()
    )
    print(f"wheelhouse_check: complete for Python {a.python_version}: {', '.join(from_wheelhouse)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
