#!/usr/bin/env bash
# The wheels a bare GPU machine needs to run andrea and scripts/gpu_check.py beside its own torch.
#
# Such a machine has Python 3.12 and a CUDA build of torch (with what torch depends on), but not
# this project's other dependencies, and no network. On a machine with package access, from the
# repository root:
#
#   scripts/gpu_wheels.sh [DIR]        # default DIR: wheelhouse/ (PYTHON_VERSION=3.12 by default)
#
# downloads into DIR the manylinux wheels, for that Python, of every dependency in pyproject.toml
# but torch, of what they need in turn, of pytest (the check runs tests) and of setuptools (the
# editable install's build backend), at the versions of constraints.txt; and the source of
# systemd-python, which has no wheel. Copy DIR beside the repository on the GPU machine, then:
#
#   python3 -m venv --system-site-packages .venv && .venv/bin/pip install -q --no-index --no-deps wheelhouse/*.whl && .venv/bin/pip install -q --no-index --no-deps --no-build-isolation -e .
#
# (--system-site-packages: the venv sees the machine's torch; --no-deps: pip never tries to
# replace it.) systemd-python needs a C compiler and libsystemd's headers there; where they are:
#
#   .venv/bin/pip install -q --no-index --no-deps --no-build-isolation wheelhouse/systemd*.tar.gz
#
# Without it the daemons run all the same and say at start that systemd notifications are off.
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-wheelhouse}"
py="${PYTHON_VERSION:-3.12}"
python=".venv/bin/python"
[ -x "$python" ] || python=python3
mkdir -p "$dest"

mapfile -t reqs < <("$python" - <<'PY'
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
for d in deps:
    name = re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0]
    if name not in ("torch", "systemd-python"):
        print(d.split(";")[0].strip())
print("pytest")
print("setuptools>=68")
PY
)
echo "gpu_wheels: ${reqs[*]} for Python $py -> $dest/"
"$python" -m pip download -q --disable-pip-version-check --dest "$dest" -c constraints.txt \
  --only-binary=:all: --implementation cp --python-version "$py" \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform linux_x86_64 "${reqs[@]}"
"$python" -m pip download -q --disable-pip-version-check --dest "$dest" -c constraints.txt \
  --no-binary=:all: --no-deps systemd-python
# What torch brings with it is on the GPU machine already, at the versions its torch wants.
for name in torch triton nvidia_ cuda_ sympy mpmath networkx jinja2 markupsafe fsspec filelock; do
  rm -f "$dest"/"$name"*.whl "$dest"/"${name^}"*.whl
done
ls -1 "$dest"
