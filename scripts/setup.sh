#!/usr/bin/env bash
# Set up the project on a Debian/Ubuntu machine: system packages (when missing), then .venv/.
# Idempotent: a second run only checks. Needs root (or sudo) for the system packages.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v python3 >/dev/null || need+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
command -v cc >/dev/null || need+=(gcc)
command -v pkg-config >/dev/null || need+=(pkg-config)
pkg-config --exists libsystemd 2>/dev/null || need+=(libsystemd-dev)
# systemd itself: the units' test boots a private one (tests/process/test_systemd.py), and it is what
# runs the daemons in production.
[ -x /lib/systemd/systemd ] || need+=(systemd)
command -v unshare >/dev/null || need+=(util-linux)
python3 - <<'PY' 2>/dev/null || need+=(python3-dev)
import os, sysconfig, sys
sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)
PY
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing system packages: ${need[*]}"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
echo "setup: installing the project into .venv/ (torch is the large part; first time only)"
# pyproject.toml gives the ranges the code supports; constraints.txt the exact versions tested.
.venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[test]' 2>&1 \
  | grep -v '^WARNING: Location' || true
.venv/bin/python -c 'import andrea.daemon.trainer, zmq, systemd.daemon' \
  || { echo "setup: the installation is incomplete (see pip's messages above)" >&2; exit 1; }
echo "setup: ready (.venv/bin/andrea-trainer)"
