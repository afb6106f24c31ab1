#!/usr/bin/env bash
# PID 1 of a private pid+mount+uts+ipc namespace (started by tests/support/realsystemd.py under unshare):
# hide every directory systemd writes to behind fresh tmpfs mounts, install the units with
# scripts/install-units.sh, and exec a real systemd restricted to one unit directory.
#
# NEVER run this outside `unshare --pid --fork --mount --mount-proc --uts --ipc`: without the
# private mounts systemd's cleanup runs on the host's real /tmp, /run and /var.
#
# usage: boot.sh SCRATCH REPO [KEEP...]
#   SCRATCH holds units-extra/ and andrea/ (env files); KEEP: more paths the service user must
#   reach (the interpreter the venv was made from, say under /root/.pyenv).
set -euo pipefail
scratch=$1 repo=$2
shift 2
[ "$$" -eq 1 ] || { echo "boot.sh: not PID 1 of a new pid namespace; refusing" >&2; exit 3; }

mount --make-rprivate /

# Paths that must stay visible at their own names once the tmpfs mounts cover their parents:
# the checkout (venv, units) and the scratch directory the test shares with the inside.
keep=("$repo" "$scratch" "$@")
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /run/andrea-test
for i in "${!keep[@]}"; do
  mkdir -p "/run/andrea-test/keep$i"
  mount --rbind "${keep[$i]}" "/run/andrea-test/keep$i"
done
for d in /tmp /var/tmp /var/log /var/lib /var/cache; do
  mount -t tmpfs -o mode=0755 tmpfs "$d"
done
chmod 1777 /tmp /var/tmp
# An ancestor of a kept path that an unprivileged service user cannot traverse (a checkout under
# /root) is replaced by a traversable tmpfs holding just that path.
for p in "${keep[@]}"; do
  a=$p
  while [ "$a" != / ]; do
    a=$(dirname "$a")
    if [ "$a" != / ] && [ -d "$a" ] && [ "$(( 0$(stat -c %a "$a") & 01 ))" -eq 0 ]; then
      mount -t tmpfs -o mode=0755 tmpfs "$a"
    fi
  done
done
for i in "${!keep[@]}"; do
  mkdir -p "${keep[$i]}"
  mount --move "/run/andrea-test/keep$i" "${keep[$i]}"
done

# /etc: copy-on-write, so the install script's system user and /etc/andrea stay in here.
mkdir -p /run/andrea-test/etc-upper /run/andrea-test/etc-work
mount -t overlay overlay \
  -o lowerdir=/etc,upperdir=/run/andrea-test/etc-upper,workdir=/run/andrea-test/etc-work /etc
mkdir -p /etc/andrea
mount -t tmpfs -o mode=0755 tmpfs /etc/andrea
hostname andrea-test

units=/run/andrea-test/units
mkdir -p "$units"
"$repo/scripts/install-units.sh" "$units"
for u in systemd-journald.service systemd-journald.socket systemd-journald-dev-log.socket; do
  cp "/lib/systemd/system/$u" "$units/"
done
printf '[Unit]\nDescription=test default\nWants=systemd-journald.service systemd-journald.socket systemd-journald-dev-log.socket\n' \
  >"$units/default.target"
for t in sysinit basic shutdown multi-user sockets timers paths slices local-fs network \
  network-online remote-fs; do
  printf '[Unit]\nDefaultDependencies=no\n' >"$units/$t.target"
done
printf '[Unit]\nDefaultDependencies=no\n' >"$units/system.slice"
# The test's own drop-ins (shorter timeouts) and env files.
if [ -d "$scratch/units-extra" ]; then cp -r "$scratch/units-extra/." "$units/"; fi
if [ -d "$scratch/andrea" ]; then cp -r "$scratch/andrea/." /etc/andrea/; fi

export SYSTEMD_UNIT_PATH=$units
exec /lib/systemd/systemd --system --unit=default.target
