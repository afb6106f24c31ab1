#!/usr/bin/env bash
# Install the systemd units for this checkout: ./scripts/install-units.sh [UNIT_DIR]
# (default /etc/systemd/system), then: systemctl start andrea@RUN.target
set -euo pipefail
cd "$(dirname "$0")/.."
home=$(pwd)
dest=${1:-/etc/systemd/system}
for u in units/*; do
  sed "s|@ANDREA_HOME@|$home|g" "$u" > "$dest/$(basename "$u")"
  echo "installed $dest/$(basename "$u")"
done
if [ "$dest" = /etc/systemd/system ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
