#!/usr/bin/env python3
"""Give a venv the GPU image's packages without reinstalling them: links into this interpreter's
site-packages, for scripts/gpu_rehearsal.sh.

    .venv/bin/python scripts/image_links.py SITE_PACKAGES

Links, into SITE_PACKAGES, every top-level file and directory (the packages and their
.dist-info) of the image's packages (IMAGE: torch, numpy, matplotlib, tokenizers,
prometheus-client, safetensors, tensorboard, pytest, pytest-xdist, hypothesis, setuptools, and pip,
which the install uses) and of what they require in turn, as installed here. Refuses if that
closure would bring in a package the image lacks (LACKING: what the wheelhouse brings), so the
rehearsal cannot pass on a package the GPU machine does not have.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import sys
from pathlib import Path

from packaging.requirements import Requirement

IMAGE = ["torch", "numpy", "matplotlib", "tokenizers", "prometheus-client", "safetensors"]
IMAGE += ["tensorboard", "pytest", "pytest-xdist", "hypothesis", "setuptools", "pip"]
LACKING = {"pydantic", "pydantic-core", "annotated-types", "typing-inspection", "pyzmq"}
LACKING |= {"tomli-w", "systemd-python", "tensorboardx", "crc32c", "andrea"}


def key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(names: list[str]) -> list[md.Distribution]:
    """The distributions of `names` and of their unconditional requirements, as installed here."""
    seen: dict[str, md.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        if key(name) in seen:
            continue
        dist = md.distribution(name)
        seen[key(name)] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def top_levels(dist: md.Distribution) -> set[str]:
    """What the distribution puts at the top of site-packages (not its scripts in ../bin)."""
    tops = {Path(str(f)).parts[0] for f in dist.files or []}
    return {t for t in tops if t not in ("..", "__pycache__")}


def main() -> int:
    site = Path(sys.argv[1])
    dists = closure(IMAGE)
    if wrong := sorted(
        key(d.metadata["Name"]) for d in dists if key(d.metadata["Name"]) in LACKING
    ):
        print(f"image_links: the image's packages would bring {', '.join(wrong)}", file=sys.stderr)
        return 1
    here = Path(dists[0].locate_file(""))
    for dist in dists:
        for top in top_levels(dist):
            target = site / top
            if not target.exists():
                target.symlink_to(here / top)
    names = sorted(f"{d.metadata['Name']} {d.version}" for d in dists)
    print(f"image_links: {len(names)} distributions linked into {site}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
