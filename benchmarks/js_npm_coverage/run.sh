#!/bin/bash
# Held-out coverage of structspec's javascript.lark on the main files of 31 npm packages
# (packages.txt), split into top-level statements with acorn. Needs node, npm and the npm
# registry. Usage (from the repository root): bash benchmarks/js_npm_coverage/run.sh [WORKDIR]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
W=${1:-${TMPDIR:-/tmp}/structspec-npmcov}
mkdir -p "$W"
cp "$HERE/split.js" "$HERE/packages.txt" "$W/"
cd "$W"
if [ ! -d node_modules/acorn ] || [ ! -d node_modules/media-typer ]; then
  [ -f package.json ] || npm init -y >/dev/null
  npm install --no-save --ignore-scripts acorn@8.11.3 $(cat packages.txt) >&2
fi
node split.js packages.txt > statements.json
(cd "$ROOT" && .venv/bin/python "$HERE/check.py" "$W/statements.json" "$W/results.json")
python3 "$HERE/report.py" results.json statements.json
