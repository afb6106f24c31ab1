#!/usr/bin/env bash
# The GPU device run, rehearsed on this CPU machine: what scripts/gpu_check.py's one call does on
# the GPU machine, except for the device (docs/performance.md, "The device run and its rehearsal").
#
#   scripts/gpu_rehearsal.sh [REPORT_DIR]          # default: .cache/gpu-rehearsal/report
#
# 1. the wheelhouses of scripts/gpu_wheels.sh, for Python 3.12 (what the device run carries) and
#    3.11 (what this machine's CPU torch runs on), downloaded once into .cache/ (git-ignored) and
#    again only when gpu_wheels.sh or constraints.txt change;
# 2. their size: the wheelhouse at most 16 MiB, the carried tree (tracked files + wheelhouse) 24;
# 3. the 3.12 wheelhouse complete: pip's resolver, offline, the image's packages given
#    (scripts/wheelhouse_check.py); the 3.12 wheels installed with --target by a Python 3.12 and
#    imported, and the project's sources compiled by it;
# 4. an "image": a venv whose own python3 is an interpreter, holding torch and the image's other
#    packages (links into .venv's site-packages, nothing reinstalled) and nothing else;
# 5. with that python3, the check's single call in --dry-run: the 3.11 wheelhouse and the project
#    installed with --no-deps --target, PYTHONPATH set, then every section.
# The budgets are the device run's, widened for a CPU that may be shared (caps, not durations: on
# an idle 2-core machine the dry run takes about two minutes). Fails (exit 1) if any step does. Needs .venv (scripts/setup.sh) and, for step 1, PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$SECONDS
cache=.cache/gpu-rehearsal
report="${1:-$cache/report}"
key=$(cat scripts/gpu_wheels.sh constraints.txt | sha256sum | cut -c1-12)
wh312="$cache/wheels-cp312-$key" wh311="$cache/wheels-cp311-$key"
step() { echo "gpu_rehearsal [$((SECONDS - t0)) s]: $*"; }

for v in 3.12 3.11; do
  dir="$cache/wheels-cp${v/./}-$key"
  if [ ! -f "$dir/.complete" ]; then
    step "downloading the Python $v wheelhouse into $dir"
    rm -rf "$dir"
    PYTHON_VERSION=$v scripts/gpu_wheels.sh "$dir" 2>&1 | grep -v "^WARNING: Location" >/dev/null
    touch "$dir/.complete"
  fi
done

wh_bytes=$(find "$wh312" -type f ! -name .complete -printf '%s\n' | awk '{s+=$1} END {print s}')
tree_bytes=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s+=$1} END {print s}')
step "wheelhouse $((wh_bytes / 1024)) KiB (limit 16 MiB); carried tree $(((wh_bytes + tree_bytes) / 1024)) KiB (limit 24 MiB)"
[ "$wh_bytes" -le $((16 * 1024 * 1024)) ] || { echo "gpu_rehearsal: the wheelhouse is over 16 MiB" >&2; exit 1; }
[ $((wh_bytes + tree_bytes)) -le $((24 * 1024 * 1024)) ] || { echo "gpu_rehearsal: the carried tree is over 24 MiB" >&2; exit 1; }

step "the 3.12 wheelhouse resolves offline beside the image's packages"
.venv/bin/python scripts/wheelhouse_check.py "$wh312" --python-version 3.12

tmp=$(mktemp -d /tmp/andrea-gpu-rehearsal.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
py312=""
for c in python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 /usr/local/bin/python3.12; do
  if command -v "$c" >/dev/null && "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
    py312=$(command -v "$c"); break
  fi
done
if [ -n "$py312" ]; then
  step "the 3.12 wheels installed with --target by $py312, imported; the sources compiled by it"
  "$py312" -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-index \
    --no-deps --target "$tmp/site312" "$wh312"/*.whl
  # typing-extensions comes with the image's torch: the one of .venv stands in for it.
  mkdir -p "$tmp/image312"
  ln -s "$(.venv/bin/python -c 'import typing_extensions; print(typing_extensions.__file__)')" "$tmp/image312/"
  PYTHONPATH="$tmp/site312:$tmp/image312" "$py312" -c 'import pydantic, zmq, tomli_w, crc32c'
  "$py312" -m compileall -q -d andrea protocol daemon control scripts >/dev/null
else
  echo "gpu_rehearsal: no Python 3.12 here: the 3.12 wheels are checked by the resolver only" >&2
fi

step "an image: a venv of $(.venv/bin/python -c 'import sys; print(sys._base_executable)') holding torch and the image's packages"
"$(.venv/bin/python -c 'import sys; print(sys._base_executable)')" -m venv --without-pip "$tmp/image"
image_site=$("$tmp/image/bin/python3" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
.venv/bin/python scripts/image_links.py "$image_site"

step "the check's single call, --dry-run, by the image's python3"
mkdir -p "$report"
rc=0
env -u INVOCATION_ID -u JOURNAL_STREAM -u PYTHONPATH "$tmp/image/bin/python3" scripts/gpu_check.py \
  --dry-run --wheelhouse "$wh311" --report-dir "$report" --cache "$cache/corpus" --keep "$tmp/work" \
  --budget "${GPU_REHEARSAL_BUDGET:-1200}" --speed-budget 500 --exact-budget 600 \
  >"$tmp/check.log" 2>&1 || rc=$?
step "the check exited $rc; its report: $report/report.md"
if [ "$rc" -ne 0 ]; then
  tail -n 60 "$tmp/check.log" >&2
  exit 1
fi
step "passed in $((SECONDS - t0)) s"
