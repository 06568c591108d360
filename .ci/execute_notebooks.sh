#!/usr/bin/env bash
# Execute the notebooks top to bottom on CPU and save their outputs (plots as PNG, printed tables) in place, so that
# they read as documentation on GitHub without being run. Usage: .ci/execute_notebooks.sh [nbs/XX_name.ipynb ...]
# (default: every notebook in nbs/). JOBS notebooks run at once (default 2). Needs MAMBA3_LITE_GPT2_RANKS for the
# notebooks that tokenize (see .ci/run for how CI fetches the file). Afterwards nbdev_clean normalises the notebooks
# (outputs kept: settings.ini has clear_all = False), and each notebook's size is checked against MAX_MB (1.5).
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
JOBS=${JOBS:-2}
MAX_MB=${MAX_MB:-1.5}
export TRITON_INTERPRET=1 OMP_NUM_THREADS=1 PYTHONHASHSEED=0 MPLBACKEND=module://matplotlib_inline.backend_inline
[ -n "${MAMBA3_LITE_GPT2_RANKS:-}" ] || echo "execute_notebooks: MAMBA3_LITE_GPT2_RANKS is not set; notebooks that tokenize will fail" >&2
if [ $# -gt 0 ]; then nbs=("$@"); else nbs=(nbs/*.ipynb); fi
start=$(date +%s)
printf '%s\n' "${nbs[@]}" | xargs -P "$JOBS" -I{} "$VENV/bin/python" .ci/execute_notebooks.py {}
rc=$?
"$VENV/bin/nbdev_clean" || rc=1
for nb in "${nbs[@]}"; do
  mb=$(awk -v b="$(stat -c %s "$nb")" 'BEGIN { printf "%.2f", b / 1e6 }')
  awk -v m="$mb" -v x="$MAX_MB" 'BEGIN { exit !(m > x) }' && { echo "execute_notebooks: $nb is $mb MB (> $MAX_MB MB)" >&2; rc=1; }
done
if grep -lE '/work/|/root/|/home/' "${nbs[@]}" >/dev/null; then
  echo "execute_notebooks: absolute paths left in: $(grep -lE '/work/|/root/|/home/' "${nbs[@]}" | tr '\n' ' ')" >&2; rc=1
fi
echo "execute_notebooks: ${#nbs[@]} notebooks in $(( $(date +%s) - start )) s (rc=$rc)"
exit $rc
