#!/usr/bin/env bash
# Does the project still hold at the oldest torch pyproject.toml admits?
#
#   scripts/torch_floor.sh [PYTHON]
#
# 1. pip's resolver, --dry-run (metadata only, nothing installed): the project's requirements
#    with torch pinned to the range's minimum must resolve.
# 2. Where PYTHON (default: .venv/bin/python) imports a torch of that minimum version — on a bare
#    GPU machine, the venv of scripts/gpu_wheels.sh beside its torch — a smoke test under it: the
#    fast tier (it also reads torchrun's options for the docs' check), and three training steps of
#    andrea-tiny on the CPU.
#    Elsewhere it says that the version is not at hand and stops after 1.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${1:-.venv/bin/python}"
min=$("$python" - <<'PY'
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
spec = next(d for d in deps if re.match(r"torch\b", d))
print(re.search(r">=\s*([\d.]+)", spec).group(1))
PY
)
echo "torch_floor: pip's resolver with torch==$min.* (dry run; a minute or two)"
if ! out=$("$python" -m pip install --dry-run --ignore-installed --quiet \
  --disable-pip-version-check -e . "torch==$min.*" 2>&1); then
  echo "$out" | grep -v "WARNING: Location" >&2
  echo "torch_floor: the project does not resolve with torch==$min.*" >&2
  exit 1
fi
echo "torch_floor: resolves"
have=$("$python" -c 'import torch; print(torch.__version__.split("+")[0])')
if [[ "$have" != "$min".* ]]; then
  echo "torch_floor: torch $min is not at hand here ($python has $have): no smoke test"
  exit 0
fi
echo "torch_floor: smoke test under torch $have"
"$python" -m pytest -q -p no:cacheprovider -m "not process"
run=$(mktemp -d)
"$python" -m andrea.daemon.trainer.service.cli --run-dir "$run" --preset andrea-tiny --device cpu \
  --threads 1 --max-steps 3 --sample-every 0
rm -rf "$run"
echo "torch_floor: torch $have imports, tests and trains"
