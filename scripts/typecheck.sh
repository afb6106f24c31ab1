#!/usr/bin/env bash
# The type checker, as CI runs it: mypy over daemon/, control/ and protocol/ under the names they
# are installed as (andrea.daemon, ...), with pyproject.toml's [tool.mypy] settings.
# pyproject.toml maps andrea.* onto top-level folders (package-dir), which mypy cannot follow, so
# it checks a tree of links to them under build/ (ignored by git). Extra arguments go to mypy.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=build/typecheck/andrea
mkdir -p "$tree"
for part in daemon control protocol; do
    ln -sfn "../../../$part" "$tree/$part"
done
exec .venv/bin/mypy "$@"
