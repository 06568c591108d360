#!/usr/bin/env bash
# The project's GPU check and benchmark command: sections in priority order, each under its own time cap, each
# result gathered the moment its section ends, so a suite stopped at any point keeps what finished.
#
#   bash bench/gpu_suite.sh --budget 390                              # first device command (bench/README.md)
#   bash bench/gpu_suite.sh --budget 200 --section model,e2e_smoke    # a targeted rerun: the line the first printed
#   bash bench/gpu_suite.sh --smoke --cpu                             # no GPU: the whole harness, Triton interpreter
#
# --budget S: seconds for the whole run (default 390; 2400 with --cpu). --section a,b: only these sections (env
# always runs). --smoke: fewer timing reps (with --cpu: tiny shapes through the Triton interpreter, no compile).
#
# Sections, in the order they run (caps in seconds, GPU / --cpu):
#   env           40 /   60  every module the suite needs imports (else exit 4 naming it: the suite stops there),
#                            versions, device and its datasheet row, peers, measured copy bandwidth and bf16 matmul rate
#   kernel_check  90 /  300  ssd_triton vs ssd_chunked at the 434M layer shape, fp32 and bf16, values + gradients, on
#                            the training path (shared B/C + per-head biases) with and without restarts, and per head
#   train_step   150 /  300  the production config (configs/pretrain_a100_400m.yaml: 434M, 16 x 2048 x accum 2,
#                            checkpointing): eager, then compiled in the config's compile mode; tokens/s, MFU, peak GiB
#   kernel_bench  80 /  400  fwd and fwd+bwd at b16 T2048 H32 P64 N128 vs ssd_chunked eager, the official
#                            mamba3_siso_combined and fla chunk_simple_gla; GB/s, TFLOP/s, % of the GPU's roofline
#   model         70 /  300  434M fwd+bwd tokens/s, MFU, peak memory, bf16, Triton SSD, 16 x 2048, with gradient
#                            checkpointing, then without where it fits (bench/model_memory.py), then the PyTorch SSD
#   e2e_smoke    150 /  900  end-to-end smoke: kernel, data, bf16 model, checkpoint, 20-step compiled run, generation
#   doc_reset     40 /  300  tiny model fwd+bwd with and without document restarts (seq_idx), interleaved
#   kernel_sweep 240 /    -  only with --section: T 512 / 8192, chunk 32 / 128, ssd_chunked under torch.compile,
#                            peers with 4 autotune configs per kernel (GPU only)
#   gpu_cells    120 /    -  only with --section: the notebooks' `#| gpu` cells (bench/gpu_cells.py, GPU only)
# A section starts only if the budget leaves it its minimum; its cap is cut to what the budget leaves (minus 15 s:
# the 10 s between SIGINT and SIGKILL, and the report). `timeout -s INT -k 10` stops a command at its cap; the
# section scripts rewrite their JSON after every row they measure and on SIGINT. kernel_bench / kernel_sweep are skipped
# if kernel_check ran and FAILED (an fp32 miss or an exception); a kernel_check cut at its cap, or one whose only misses
# are bf16 (exit 3, status "bf16 miss"), leaves them to run.
#
# $OUT (default bench/results/<UTC date>_<device>) receives exactly three files, rewritten after every section:
# summary.md (status table + every section's tables), results.json (every section's JSON), logs.tgz (all logs and
# raw outputs). Peers: the wheels in bench/peers/ (bench/fetch_peers.sh) are installed with --no-deps --no-index into
# a temporary --target folder put on PYTHONPATH (a compiled wheel, blake3, only where the package is missing); without
# them fla and the official kernel are reported unavailable. bench/peers/gpt2.tiktoken becomes MAMBA3_LITE_GPT2_RANKS.
# Environment: OUT, PYTHON (default .venv/bin/python, else python3), PEERS_DIR (default bench/peers),
# SUITE_CAP_<section> (seconds: replaces that section's cap, e.g. for a longer rerun of one section).
# The last line of stdout and of summary.md names the sections that did not pass (FAILED, cut, skipped for the
# budget or after a failed env or kernel_check) as the --section list of a rerun, with the budget their caps add up to.
# Exit status: 0 if every section that ran passed, 1 otherwise, 2 on a usage error.
set -uo pipefail
cd "$(dirname "$0")/.."

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
die_usage() { echo "gpu_suite.sh: $*" >&2; exit 2; }
ORDER=(env kernel_check train_step kernel_bench model e2e_smoke doc_reset decode kernel_sweep gpu_cells)
ONLY_ON_REQUEST=(kernel_sweep gpu_cells)
declare -A CAP_GPU=([env]=40 [kernel_check]=90 [train_step]=150 [kernel_bench]=80 [model]=70 [e2e_smoke]=150 [doc_reset]=40
                    [decode]=150 [kernel_sweep]=240 [gpu_cells]=120)
declare -A CAP_CPU=([env]=60 [kernel_check]=300 [train_step]=300 [kernel_bench]=400 [model]=300 [e2e_smoke]=900 [doc_reset]=300
                    [decode]=300 [kernel_sweep]=0 [gpu_cells]=0)
declare -A MIN_S=([env]=10 [kernel_check]=30 [kernel_bench]=40 [model]=30 [train_step]=60 [e2e_smoke]=60
                  [kernel_sweep]=60 [gpu_cells]=30 [doc_reset]=20 [decode]=60)
GRACE=15

SMOKE=0; CPU=0; BUDGET=""; SECTIONS=""
while (( $# )); do
  case "$1" in
    --smoke) SMOKE=1 ;;
    --cpu) CPU=1 ;;
    --budget) [[ $# -ge 2 ]] || die_usage "--budget needs a number of seconds"; BUDGET=$2; shift ;;
    --budget=*) BUDGET=${1#--budget=} ;;
    --section) [[ $# -ge 2 ]] || die_usage "--section needs a comma-separated list of sections"; SECTIONS=$2; shift ;;
    --section=*) SECTIONS=${1#--section=} ;;
    -h|--help) usage; exit 0 ;;
    *) die_usage "unknown argument '$1' (expected --budget S, --section LIST, --smoke, --cpu)" ;;
  esac
  shift
done
[[ $CPU == 1 && $SMOKE == 0 ]] && die_usage "--cpu is a harness check and needs --smoke"
BUDGET=${BUDGET:-$([[ $CPU == 1 ]] && echo 2400 || echo 390)}
[[ "$BUDGET" =~ ^[0-9]+$ ]] && (( BUDGET >= 60 )) || die_usage "--budget: expected whole seconds >= 60, got '$BUDGET'"
for s in "${ORDER[@]}"; do
  v="SUITE_CAP_$s"
  [[ -z "${!v:-}" || "${!v}" =~ ^[1-9][0-9]*$ ]] || die_usage "$v: expected whole seconds > 0, got '${!v}'"
done
declare -A WANT=()
if [[ -n "$SECTIONS" ]]; then
  IFS=, read -ra req <<< "$SECTIONS"
  for s in "${req[@]}"; do
    [[ -n "${CAP_GPU[$s]+x}" ]] || die_usage "--section: unknown section '$s' (expected some of: ${ORDER[*]})"
    WANT[$s]=1
  done
  WANT[env]=1   # always: it records what the numbers ran on
else
  for s in "${ORDER[@]}"; do [[ " ${ONLY_ON_REQUEST[*]} " == *" $s "* ]] || WANT[$s]=1; done
fi

PYTHON=${PYTHON:-}
if [[ -z "$PYTHON" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
SMOKE_ARG=(); CPU_ARG=()
[[ $SMOKE == 1 ]] && SMOKE_ARG=(--smoke)
[[ $CPU == 1 ]] && CPU_ARG=(--cpu)
if [[ $CPU == 1 ]]; then
  export TRITON_INTERPRET=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  DEVICE=cpu
else
  DEVICE=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr ' ' '-')
  [[ -n "$DEVICE" ]] || DEVICE=$("$PYTHON" -c "import torch; print(torch.cuda.get_device_name().replace(' ', '-') if torch.cuda.is_available() else '')" 2>/dev/null)
  [[ -n "$DEVICE" ]] || die_usage "no CUDA device visible; use --smoke --cpu for the interpreter harness check"
fi
START=$(date +%s)
END=$(( START + BUDGET ))
export OUT=${OUT:-bench/results/$(date -u +%Y%m%d_%H%M)_${DEVICE}}
mkdir -p "$OUT" || die_usage "cannot create OUT=$OUT"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/m3l_suite.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
TITLE="GPU suite $(date -u '+%Y-%m-%d %H:%M UTC') on $DEVICE, budget ${BUDGET}s (args: --budget $BUDGET${SECTIONS:+ --section $SECTIONS}${SMOKE_ARG[*]:+ ${SMOKE_ARG[*]}}${CPU_ARG[*]:+ ${CPU_ARG[*]}})"
export PYTHONUNBUFFERED=1 ENABLE_TRITON_KERNELS=1 TRITON_CACHE_AUTOTUNING=1
: > "$WORK/status.tsv"

# Peers: pure-Python wheels, installed into a folder of their own (the image's packages are left alone).
PEERS_DIR=${PEERS_DIR:-bench/peers}
SITE="$WORK/site"
PEERS_NOTE="no $PEERS_DIR/*.whl: fla and the official kernel are reported unavailable (run bench/fetch_peers.sh, carry $PEERS_DIR)"
if compgen -G "$PEERS_DIR/*.whl" > /dev/null; then
  if "$PYTHON" -m pip install --quiet --no-deps --no-index --no-compile --target "$SITE" "$PEERS_DIR"/*-none-any.whl > "$WORK/peers_install.log" 2>&1; then
    PEERS_NOTE="peers from $PEERS_DIR: $(cd "$PEERS_DIR" && ls *-none-any.whl | tr '\n' ' ')"
  else
    PEERS_NOTE="pip could not install $PEERS_DIR/*-none-any.whl (see logs.tgz: peers_install.log); peers reported unavailable"
  fi
  # compiled wheels (blake3, for the GPU image's python): installed only where the package is missing and the wheel fits
  for w in "$PEERS_DIR"/*.whl; do
    [[ "$w" == *-none-any.whl ]] && continue
    pkg=$(basename "$w"); pkg=${pkg%%-*}
    "$PYTHON" -c "import $pkg" 2>/dev/null && continue
    if "$PYTHON" -m pip install --quiet --no-deps --no-index --no-compile --target "$SITE" "$w" >> "$WORK/peers_install.log" 2>&1; then
      PEERS_NOTE="$PEERS_NOTE $(basename "$w")"
    else
      PEERS_NOTE="$PEERS_NOTE; $pkg missing and $(basename "$w") does not fit this python"
    fi
  done
fi
export PYTHONPATH="$PWD${SITE:+:$SITE}${PYTHONPATH:+:$PYTHONPATH}"
if [[ -z "${MAMBA3_LITE_GPT2_RANKS:-}" && -f "$PEERS_DIR/gpt2.tiktoken" ]]; then   # carried GPT-2 ranks (fetch_peers.sh)
  MAMBA3_LITE_GPT2_RANKS="$(cd "$PEERS_DIR" && pwd)/gpt2.tiktoken"; export MAMBA3_LITE_GPT2_RANKS
  PEERS_NOTE="$PEERS_NOTE; GPT-2 ranks from $PEERS_DIR/gpt2.tiktoken"
fi
echo "$TITLE"
echo "$PEERS_NOTE"

# ---------------------------------------------------------------- bookkeeping
report() {
  "$PYTHON" bench/suite_report.py "$WORK" "$OUT" "$TITLE; $PEERS_NOTE" || echo "gpu_suite.sh: suite_report.py failed" >&2
  tar czf "$OUT/logs.tgz" -C "$WORK" --exclude=./site . 2>/dev/null
  if [[ -f "$OUT/logs.tgz" ]] && (( $(stat -c %s "$OUT/logs.tgz") > 15 * 2**20 )); then
    tar czf "$OUT/logs.tgz" -C "$WORK" --exclude=./site --exclude='*.log' .   # the device tool returns <= 16 MiB a file
  fi
}

status_line() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> "$WORK/status.tsv"; }

# run_capped SECONDS CMD...: CMD under `timeout -s INT -k 10`, never past the section's end.
run_capped() {
  local cap=$1 left=$(( SECTION_END - $(date +%s) )); shift
  (( cap > left )) && cap=$left
  if (( cap < 5 )); then echo "not run (section time used up): $*"; return 124; fi
  timeout -s INT -k 10 "$cap" "$@"
}
section_left() { echo $(( SECTION_END - $(date +%s) )); }

FAILED=0
ENV_MISSING=""   # gpu_env.py's line when a module the suite needs is missing: every later section is skipped
section_cap() {
  local override="SUITE_CAP_$1"
  if [[ -n "${!override:-}" ]]; then echo "${!override}"
  elif [[ $CPU == 1 ]]; then echo "${CAP_CPU[$1]}"
  else echo "${CAP_GPU[$1]}"; fi
}
run_section() {
  local name=$1 cap min left start rc took status note=""
  [[ -n "${WANT[$name]+x}" ]] || return 0
  cap=$(section_cap "$name")
  if [[ -n "$ENV_MISSING" ]]; then
    status_line "$name" skipped "" 0 "$cap" "env: a module the suite needs is missing"; echo "=== $name: skipped (env failed)"
    report; return 0
  fi
  min=${MIN_S[$name]}
  (( cap > 0 && min > cap )) && min=$cap
  left=$(( END - $(date +%s) - GRACE ))
  if (( cap == 0 )); then
    status_line "$name" skipped "" 0 0 "GPU only"; echo "=== $name: skipped (GPU only)"; report; return 0
  fi
  if [[ $name == kernel_bench || $name == kernel_sweep ]] && awk -F'\t' '$1 == "kernel_check" && $2 == "FAILED" { found = 1 } END { exit !found }' "$WORK/status.tsv"; then
    status_line "$name" skipped "" 0 0 "kernel_check failed"; echo "=== $name: skipped (kernel_check failed)"
    report; return 0
  fi
  (( cap > left )) && cap=$left
  if (( cap < min )); then
    status_line "$name" skipped "" 0 "$cap" "budget: $(( left > 0 ? left : 0 ))s left, needs >= ${min}s"
    echo "=== $name: skipped (budget)"; report; return 0
  fi
  echo "=== section $name (cap ${cap}s, $(( END - $(date +%s) ))s of the budget left)"
  mkdir -p "$WORK/$name"
  SECTION_DIR="$WORK/$name"
  start=$(date +%s)
  SECTION_END=$(( start + cap ))
  "section_$name" 2>&1 | tee "$WORK/$name.log"
  rc=${PIPESTATUS[0]}
  took=$(( $(date +%s) - start ))
  case $rc in
    0) status=ok ;;
    124|137) status=cut; note="stopped at its cap; what finished is kept"; FAILED=1 ;;
    3) if [[ $name == kernel_check ]]; then   # ssd_kernel.py's gate: only bf16 checks missed their bounds
         status="bf16 miss"; note="bf16 outside its stated tolerance (see its table); fp32 within, so the timings run"
       else status=FAILED; note="see $name.log in logs.tgz"; fi
       FAILED=1 ;;
    4) if [[ $name == env ]]; then   # gpu_env.py: a module the suite needs does not import
         ENV_MISSING=$(grep -m1 '^gpu_env.py: missing module' "$WORK/env.log" | tr '\t' ' ' | cut -c1-400)
         status=FAILED; note=${ENV_MISSING:-a module the suite needs is missing}
       else status=FAILED; note="see $name.log in logs.tgz"; fi
       FAILED=1 ;;
    *) status=FAILED; note="see $name.log in logs.tgz"; FAILED=1 ;;
  esac
  status_line "$name" "$status" "$rc" "$took" "$cap" "$note"
  echo "=== $name: $status (rc $rc, ${took}s)"
  report
}

# ---------------------------------------------------------------- sections
section_env() {
  [[ $CPU == 0 ]] && nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm,clocks.max.sm --format=csv
  run_capped "$(section_left)" "$PYTHON" bench/gpu_env.py "${CPU_ARG[@]}" --out "$SECTION_DIR"
}

section_kernel_check() {
  run_capped "$(section_left)" "$PYTHON" bench/ssd_kernel.py --part gate "${SMOKE_ARG[@]}" "${CPU_ARG[@]}" --out "$SECTION_DIR"
}

section_kernel_bench() {
  local args=(--part time --shapes main --no-compile --sweep-warps "" --peer-configs 2 --budget-s 2)
  if [[ $SMOKE == 1 ]]; then args+=(--reps 20 --warmup 3); else args+=(--reps 50 --warmup 5); fi
  [[ $CPU == 1 ]] && args=(--part time --smoke --cpu --sweep-warps "")
  # peers start only while a minute of the section is left; ours always runs
  run_capped "$(section_left)" "$PYTHON" bench/ssd_kernel.py "${args[@]}" --deadline-s $(( $(section_left) - 60 )) \
    --out "$SECTION_DIR"
}

section_model() {
  local rc=0 r common=(--ssd-dispatch triton --steps 5 --warmup 2 --json "$SECTION_DIR/model_gpu.jsonl")
  [[ $CPU == 1 ]] && common=(--device cpu --preset tiny --batch 2 --seq-len 32 --steps 1 --warmup 0 --peak-tflops 1 --dtype fp32
                             --ssd-dispatch triton --json "$SECTION_DIR/model_gpu.jsonl")
  # the production setting first; without checkpointing only where bench/model_memory.py finds that it fits (the
  # 434M at 16 x 2048 needs ~77 GiB without it: run on an H200, one line and no run on an 80 GB card)
  run_capped $(( $(section_left) * 3 / 5 )) "$PYTHON" bench/model_gpu.py "${common[@]}" --grad-checkpoint
  r=$?; (( r && !rc )) && rc=$r   # the first non-zero status (124: cut) is the section's
  run_capped "$(section_left)" "$PYTHON" bench/model_gpu.py "${common[@]}" --no-grad-checkpoint
  r=$?; (( r && !rc )) && rc=$r
  if (( $(section_left) >= 25 )); then   # the same step with the PyTorch SSD, for the ratio
    run_capped "$(section_left)" "$PYTHON" bench/model_gpu.py "${common[@]/triton/pytorch}" --grad-checkpoint
    r=$?; (( r && !rc )) && rc=$r
  else
    echo "model: PyTorch-SSD comparison not run ($(section_left)s of the section left, needs 25s)"
  fi
  return $rc
}

section_train_step() {
  run_capped "$(section_left)" "$PYTHON" bench/train_gpu.py --smoke "${CPU_ARG[@]}" --out "$SECTION_DIR"
}

section_e2e_smoke() {
  run_capped "$(section_left)" "$PYTHON" bench/e2e_gpu_smoke.py "${CPU_ARG[@]}" --out "$SECTION_DIR/e2e_gpu_smoke.json"
}

# Document restarts (seq_idx): forward+backward time of the tiny model with and without them.
section_doc_reset() {
  run_capped "$(section_left)" "$PYTHON" bench/doc_reset_cpu.py --throughput-only --device cuda "${SMOKE_ARG[@]}" \
    "${CPU_ARG[@]}" --json "$SECTION_DIR/doc_reset.json"
}

# The fused decode step against the official mamba3_siso_step, graphs on and off, and the 434M model's generate.
section_decode() {
  run_capped "$(section_left)" "$PYTHON" bench/decode_gpu.py "${SMOKE_ARG[@]}" "${CPU_ARG[@]}" --out "$SECTION_DIR"
}

section_kernel_sweep() {
  run_capped "$(section_left)" "$PYTHON" bench/ssd_kernel.py --part time --shapes main,T512,T8192,L32,L128 \
    --peer-configs 4 --reps 50 --warmup 5 --budget-s 2 --deadline-s $(( $(section_left) - 60 )) --out "$SECTION_DIR"
}

section_gpu_cells() {
  run_capped "$(section_left)" "$PYTHON" bench/gpu_cells.py --flags gpu --timeout $(( $(section_left) / 2 )) --out "$SECTION_DIR"
}

for s in "${ORDER[@]}"; do run_section "$s"; done
echo "total: $(( $(date +%s) - START ))s of a ${BUDGET}s budget" | tee -a "$WORK/total.txt"
# the sections to run again: FAILED, cut, or skipped for the budget, a failed env or a failed kernel_check (which the
# rerun runs first); not those skipped as "GPU only"
RERUN=$(awk -F'\t' '$1 != "env" && ($2 == "FAILED" || $2 == "cut" || ($2 == "skipped" && $6 ~ /^(budget|env|kernel_check)/)) { print $1 }' \
        "$WORK/status.tsv" | paste -sd, -)
if [[ -n "$RERUN" ]]; then
  need=$GRACE; IFS=, read -ra again <<< "$RERUN"
  for s in "${again[@]}"; do need=$(( need + $(section_cap "$s") )); done
  (( need < 60 )) && need=60
  echo "rerun what did not pass: bash bench/gpu_suite.sh --budget $need --section $RERUN$([[ $CPU == 1 ]] && echo ' --smoke --cpu')" \
    | tee -a "$WORK/total.txt"
else
  echo "rerun: nothing (every section that ran passed)" | tee -a "$WORK/total.txt"
fi
report
echo "" >> "$OUT/summary.md"; cat "$WORK/total.txt" >> "$OUT/summary.md"
cat "$OUT/summary.md"
echo "gpu_suite.sh: wrote $(ls "$OUT" | wc -l) files to $OUT: $(ls "$OUT" | tr '\n' ' ')"
exit $FAILED
