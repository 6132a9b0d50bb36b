#!/usr/bin/env bash
# Prepare .devcache/ for the GPU check (scripts/device_check.sh), on this machine.
#
# The device machine has Python 3.12 with torch/transformers but reaches no network, and a
# call carries at most 64 MiB (the working tree, ~14 MB, included). So this packs what the
# check needs into three loads (ignored by git), one per call: the embedded default model
# split in three (94 MB GGUF), Python 3.12 wheels of our dependencies that the device image
# lacks (xgrammar too, the peer the benchmark runs beside us), and the task files the
# speculative benchmark reads from ../shared (which does not travel). Then, back to back
# (the machine stays warm 30 s after a call; each `stage` keeps its load under /tmp there):
#
#   device run  carry=[".devcache/call1"]  command="bash scripts/device_check.sh stage"
#   device run  carry=[".devcache/call2"]  command="bash scripts/device_check.sh stage"
#   device run  carry=[".devcache/call3"]  command="bash scripts/device_check.sh"  timeout_s=560
#
# Its figures come back under $OUT (speculative_<task>_<dtype>.json, device_check.log).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
grep -qx '/.devcache/' .git/info/exclude 2>/dev/null || echo '/.devcache/' >> .git/info/exclude
rm -rf .devcache && mkdir -p .devcache/call1 .devcache/call2 .devcache/call3
gguf="$("$PY" -c 'from structspec.models import embedded_gguf_path; print(embedded_gguf_path())')"
third=$(( ($(stat -c %s "$gguf") + 2) / 3 ))
split -b "$third" -d -a 1 "$gguf" .devcache/model.gguf.
for i in 0 1 2; do mv ".devcache/model.gguf.$i" ".devcache/call$((i + 1))/"; done
sha256sum "$gguf" | cut -d' ' -f1 > .devcache/call3/model.sha256
# Wheels for Python 3.12 of what the device image does not hold (see the device README).
wheels() {
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$@"
}
wheels .devcache/call1 xgrammar==0.2.9 apache-tvm-ffi
wheels .devcache/call2 lark jsonschema jsonschema-specifications referencing rpds-py gguf \
  pydantic pydantic-core annotated-types typing-inspection
shared=../shared/data
for f in bfcl/bfcl_dev.jsonl code/HumanEval-SingleLineInfilling.jsonl; do
  [ -f "$shared/$f" ] && cp "$shared/$f" .devcache/call3/ || echo "missing $shared/$f (task skipped)"
done
du -sh .devcache/*
