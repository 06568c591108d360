#!/usr/bin/env bash
# The one GPU command of the project: every GPU check and benchmark, in sections, results to $OUT.
#
#   bash bench/gpu_suite.sh                 # full suite on one GPU (budget: under 8 minutes on an H200)
#   bash bench/gpu_suite.sh --smoke         # quick rerun: one shape per section, fewer reps
#   bash bench/gpu_suite.sh --smoke --cpu   # no GPU: exercise the harness with the Triton interpreter, tiny shapes
#
# Environment: OUT (default bench/results/<UTC date>_<device>), PYTHON (default .venv/bin/python, else python3),
# WHEEL_DIR (default bench/wheels: pure-Python wheels installed with --no-deps when a peer does not import).
#
# Adding a section: write a function `section_<name>` that runs its script with "${PASS_ARGS[@]}" and writes
# under "$OUT", then add `run_section <name>` at the bottom. A failing section is recorded in $OUT/summary.md and
# the suite goes on; the exit status is non-zero if any section failed.
set -uo pipefail
cd "$(dirname "$0")/.."

SMOKE=0; CPU=0
for arg in "$@"; do
  case "$arg" in
    --smoke) SMOKE=1 ;;
    --cpu) CPU=1 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "gpu_suite.sh: unknown argument '$arg' (expected --smoke and/or --cpu)" >&2; exit 2 ;;
  esac
done
if [[ $CPU == 1 && $SMOKE == 0 ]]; then
  echo "gpu_suite.sh: --cpu is a harness check and needs --smoke" >&2; exit 2
fi

PYTHON=${PYTHON:-}
if [[ -z "$PYTHON" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
PASS_ARGS=()
[[ $SMOKE == 1 ]] && PASS_ARGS+=(--smoke)
[[ $CPU == 1 ]] && PASS_ARGS+=(--cpu)
if [[ $CPU == 1 ]]; then
  export TRITON_INTERPRET=1
  DEVICE=cpu
else
  DEVICE=$("$PYTHON" -c "import torch; print(torch.cuda.get_device_name().replace(' ', '-') if torch.cuda.is_available() else 'none')")
  if [[ "$DEVICE" == none ]]; then
    echo "gpu_suite.sh: no CUDA device visible; use --smoke --cpu for the interpreter harness check" >&2; exit 2
  fi
fi
export OUT=${OUT:-bench/results/$(date -u +%Y%m%d_%H%M)_${DEVICE}}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
SUMMARY="$OUT/summary.md"
echo "# GPU suite $(date -u '+%Y-%m-%d %H:%M UTC') on $DEVICE (args: ${*:-none})" > "$SUMMARY"
echo "" >> "$SUMMARY"
FAILED=0
SUITE_START=$(date +%s)

# Peers that ship as pure-Python wheels (fla-core needs einops): install them if they do not import yet.
ensure_wheels() {
  local dir=${WHEEL_DIR:-bench/wheels}
  if ! "$PYTHON" -c "import fla.ops.simple_gla" 2>/dev/null && ls "$dir"/fla_core-*.whl >/dev/null 2>&1; then
    "$PYTHON" -m pip install --quiet --no-deps --no-index "$dir"/einops-*.whl "$dir"/fla_core-*.whl \
      || echo "gpu_suite.sh: could not install the fla wheels from $dir (fla is then reported as unavailable)"
  fi
}

run_section() {
  local name=$1 start rc
  start=$(date +%s)
  echo "=== section $name ==="
  "section_$name" 2>&1 | tee "$OUT/$name.log"
  rc=${PIPESTATUS[0]}
  local took=$(( $(date +%s) - start ))
  if [[ $rc == 0 ]]; then
    echo "- $name: ok (${took}s)" >> "$SUMMARY"
  else
    echo "- $name: **FAILED** rc=$rc (${took}s), see $name.log" >> "$SUMMARY"; FAILED=1
  fi
}

# ---------------------------------------------------------------- sections
# Issue 3: fused Triton SSD kernel (correctness gate + fwd / fwd+bwd timings vs ssd_chunked, fla, official).
section_ssd_kernel() {
  [[ $CPU == 0 ]] && ensure_wheels
  "$PYTHON" bench/ssd_kernel.py "${PASS_ARGS[@]}" --out "$OUT"
}

# Issue 3: the same kernels compiled ahead of time for sm_90 (no GPU needed): compile errors the interpreter cannot
# see, and ptxas registers / spills / shared memory of the default launch config.
section_ssd_compile() {
  "$PYTHON" bench/ssd_compile_check.py --chunk 64 --warps 8 --dtype bf16 --out "$OUT"
}

# Issue 8: end-to-end smoke (kernel vs reference, data -> device batches, bf16 model with the Triton dispatch,
# checkpoint round trip, 20-step compiled Pretrainer run + resume, generation).
section_e2e_smoke() {
  "$PYTHON" bench/e2e_gpu_smoke.py "${PASS_ARGS[@]}" --out "$OUT/e2e_gpu_smoke.json"
}

# Issue 4: forward+backward throughput and MFU of the 434M preset at micro-batch 16 x 2048, bf16 (GPU only).
section_model() {
  if [[ $CPU == 1 ]]; then echo "model: GPU only, skipped under --cpu"; return 0; fi
  ENABLE_TRITON_KERNELS=1 "$PYTHON" bench/model_gpu.py --ssd-dispatch triton --json "$OUT/model_gpu.jsonl" || return 1
  [[ $SMOKE == 1 ]] || "$PYTHON" bench/model_gpu.py --ssd-dispatch pytorch --json "$OUT/model_gpu.jsonl"
}

# Issue 7: 434M training step (bf16, torch.compile, micro-batch 16 x 2048): tokens/s and MFU; target >= 100k tok/s on one H200.
section_train_step() {
  ENABLE_TRITON_KERNELS=1 "$PYTHON" bench/train_gpu.py "${PASS_ARGS[@]}" --out "$OUT"
}

# Document restarts (seq_idx): forward+backward time of the tiny model with and without them.
section_doc_reset() {
  "$PYTHON" bench/doc_reset_cpu.py --throughput-only --device cuda "${PASS_ARGS[@]}" | tee "$OUT/doc_reset.txt"
}

run_section ssd_compile
run_section ssd_kernel
run_section e2e_smoke
run_section model
run_section train_step
run_section doc_reset

echo "" >> "$SUMMARY"
echo "total: $(( $(date +%s) - SUITE_START ))s" >> "$SUMMARY"
cat "$SUMMARY"
exit $FAILED
