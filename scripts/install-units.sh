#!/usr/bin/env bash
# Install ANDREA's systemd units for this checkout, and what they need:
#   sudo ./scripts/install-units.sh [--user NAME] [UNIT_DIR]
#     - the system user NAME (default andrea) the daemons run as, with no login and no home, and
#       added to the groups that own the GPU device nodes when those are not open to everybody;
#     - /etc/andrea/, where the per-run env files go (/etc/andrea/RUN.env);
#     - the units in UNIT_DIR (default /etc/systemd/system), pointing at this checkout's .venv/,
#       then `systemctl daemon-reload`.
#   ./scripts/install-units.sh --files-only DIR    only writes the unit files (no root needed)
# Idempotent. Then: systemctl enable --now andrea@RUN.target (docs/operations.md).
set -euo pipefail
cd "$(dirname "$0")/.."
home=$(pwd)
user=andrea
files_only=0
while [ $# -gt 0 ]; do
  case $1 in
    --user) user=$2; shift 2 ;;
    --files-only) files_only=1; shift ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "install-units.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
dest=${1:-/etc/systemd/system}

render() {
  for u in units/*; do
    sed -e "s|@ANDREA_HOME@|$home|g" -e "s|@ANDREA_USER@|$user|g" "$u" >"$dest/$(basename "$u")"
    echo "installed $dest/$(basename "$u")"
  done
}

if [ "$files_only" -eq 1 ]; then
  mkdir -p "$dest"
  render
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-units.sh: needs root (it creates the system user $user and /etc/andrea); use sudo" >&2
  exit 2
fi
[ -x .venv/bin/andrea-trainer ] || {
  echo "install-units.sh: $home/.venv is missing; run ./scripts/setup.sh first" >&2
  exit 2
}

if ! getent passwd "$user" >/dev/null; then
  useradd --system --user-group --no-create-home --home-dir /nonexistent \
    --shell /usr/sbin/nologin --comment "ANDREA training service" "$user"
  echo "created system user $user"
fi
# CUDA opens /dev/nvidia*; ROCm and others /dev/dri/renderD* and /dev/kfd. Usually world-usable;
# where a node is not, the user joins the node's group.
for node in /dev/nvidia* /dev/dri/renderD* /dev/kfd; do
  [ -c "$node" ] || continue
  if [ "$(( 0$(stat -c %a "$node") & 06 ))" -ne 6 ]; then
    group=$(stat -c %G "$node")
    if ! id -nG "$user" | tr ' ' '\n' | grep -qx "$group"; then
      usermod -a -G "$group" "$user"
      echo "added $user to group $group (for $node)"
    fi
  fi
done
install -d -m 0755 /etc/andrea
# The daemons execute this checkout as $user: every directory on the way must let it in.
if ! runuser -u "$user" -- "$home/.venv/bin/python" -c 'import andrea.daemon.trainer.service.cli' 2>/dev/null
then
  echo "install-units.sh: user $user cannot run $home/.venv (a directory on that path is not" \
    "readable by others?); put the checkout where $user can read it, e.g. /opt/andrea" >&2
  exit 2
fi
mkdir -p "$dest"
render
if [ "$dest" = /etc/systemd/system ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
