#!/usr/bin/env bash
# Prepare .devcache/ for the GPU check (scripts/device_check.sh), on this machine.
#
# The device machine has Python 3.12 with torch/transformers but reaches no network, and a
# call carries at most 64 MiB. So this packs what the check needs into .devcache/ (ignored
# by git): the embedded default model split in two parts (94 MB GGUF; each call carries one
# part, the first part stays on the warm machine), Python 3.12 wheels of our dependencies
# that the device image lacks, and the task files the speculative benchmark reads from
# ../shared (which does not travel). Then, back to back (the machine stays warm 30 s):
#
#   device run  carry=[".devcache/part1"]              command="bash scripts/device_check.sh stage"
#   device run  carry=[".devcache/part2", ".devcache/wheels", ".devcache/data"]
#               command="bash scripts/device_check.sh"       timeout_s=540
#
# Its figures come back under $OUT (speculative_<task>_cuda.json, device_check.log).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
grep -qx '/.devcache/' .git/info/exclude 2>/dev/null || echo '/.devcache/' >> .git/info/exclude
rm -rf .devcache && mkdir -p .devcache/part1 .devcache/part2 .devcache/wheels .devcache/data
gguf="$("$PY" -c 'from structspec.models import embedded_gguf_path; print(embedded_gguf_path())')"
half=$(( ($(stat -c %s "$gguf") + 1) / 2 ))
head -c "$half" "$gguf" > .devcache/part1/model.gguf.0
tail -c +"$((half + 1))" "$gguf" > .devcache/part2/model.gguf.1
sha256sum "$gguf" | cut -d' ' -f1 > .devcache/part2/model.sha256
# Wheels for Python 3.12 of what the device image does not hold (see the device README).
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .devcache/wheels \
  lark jsonschema jsonschema-specifications referencing rpds-py gguf pydantic pydantic-core \
  annotated-types typing-inspection
shared=../shared/data
for f in bfcl/bfcl_dev.jsonl code/HumanEval-SingleLineInfilling.jsonl; do
  [ -f "$shared/$f" ] && cp "$shared/$f" .devcache/data/ || echo "missing $shared/$f (task skipped)"
done
du -sh .devcache/*
