#!/usr/bin/env bash
# The wheels a bare GPU machine lacks to run andrea and scripts/gpu_check.py beside its own torch.
#
# The GPU machine's python3 is a venv's interpreter (Python 3.12, torch with CUDA) that already
# holds numpy, matplotlib, tokenizers, prometheus-client, safetensors, tensorboard (with protobuf
# and packaging), pytest, pytest-xdist, hypothesis and setuptools; it has no network. On a
# machine with package access, from the repository root:
#
#   scripts/gpu_wheels.sh [DIR]        # default DIR: wheelhouse/ (PYTHON_VERSION=3.12 by default)
#
# downloads into DIR, at the versions of constraints.txt, the manylinux wheels for that Python of
# what the image lacks (pydantic, pydantic-core, annotated-types, typing-inspection, pyzmq,
# tomli-w, tensorboardX, crc32c, zstandard) and the source of systemd-python, which has no wheel; nothing
# else (a second pytest would shadow the machine's and its plugins). scripts/wheelhouse_check.py
# proves it complete. Copy DIR beside the checkout; scripts/gpu_check.py --wheelhouse DIR installs
# it with `pip install --no-index --no-deps --target` and PYTHONPATH (docs/performance.md).
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-wheelhouse}"
py="${PYTHON_VERSION:-3.12}"
python=".venv/bin/python"
[ -x "$python" ] || python=python3
mkdir -p "$dest"

# What andrea needs and the image lacks; their own dependencies are in the image (torch brings
# typing-extensions; tensorboard brings protobuf, numpy and packaging).
lacking=(pydantic pydantic-core annotated-types typing-inspection pyzmq tomli-w tensorboardX crc32c
  zstandard)
echo "gpu_wheels: ${lacking[*]} for Python $py -> $dest/"
"$python" -m pip download -q --disable-pip-version-check --dest "$dest" -c constraints.txt \
  --no-deps --only-binary=:all: --implementation cp --python-version "$py" \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform linux_x86_64 "${lacking[@]}"
"$python" -m pip download -q --disable-pip-version-check --dest "$dest" -c constraints.txt \
  --no-binary=:all: --no-deps systemd-python
ls -1 "$dest"
