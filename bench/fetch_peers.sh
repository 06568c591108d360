#!/usr/bin/env bash
# Put the GPU suite's peers into bench/peers/ (git-ignored), for a GPU machine that has no network: run it here,
# then carry bench/peers with the device command (bench/README.md gives the call).
#
#   bash bench/fetch_peers.sh          # fla-core + einops wheels, a pure-Python mamba_ssm wheel, fastcore, blake3
#
# - fla-core and einops: pure-Python wheels from PyPI (fla's chunk_simple_gla is a timing peer).
# - mamba_ssm: built here from the mamba-ssm sdist with MAMBA_SKIP_CUDA_BUILD=TRUE and MAMBA_FORCE_BUILD=TRUE
#   (no CUDA extension is compiled and no prebuilt wheel is looked for): the wheel holds the official Mamba-3 Triton
#   kernels (mamba_ssm/ops/triton/mamba3/). bench/ssd_kernel.py imports them without running mamba_ssm/__init__.py,
#   which needs the CUDA extensions.
# - fastcore and blake3: package requirements the GPU image lacks (fastcore is pure Python; blake3 is the one
#   compiled wheel here, for the image's CPython 3.12 on manylinux x86_64); fastcore also serves the notebooks'
#   test cells (bench/gpu_cells.py). The image has the rest of what the suite imports (IMAGE_HAS below, import
#   names: its package list holds tqdm, pyyaml, safetensors, tiktoken, tokenizers, matplotlib, einops, pytest).
#   The last step checks that: every module the suite's scripts import (bench/gpu_env.py --lacking, the list the env
#   section imports) is in IMAGE_HAS or in a wheel here, else it fails naming the module to add.
# - gpt2.tiktoken: the GPT-2 BPE ranks (sha256 checked), copied from $MAMBA3_LITE_GPT2_RANKS or
#   ~/.cache/mamba3-lite/gpt2.tiktoken, so that the e2e smoke tokenizes real text there (the suite points
#   MAMBA3_LITE_GPT2_RANKS at it); without it the smoke says so and uses synthetic token shards.
# The build needs torch, setuptools and wheel in $PYTHON (default .venv/bin/python, else python3). The wheels are
# checked to be pure Python and the folder to stay far under the device tool's 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-}
if [[ -z "$PYTHON" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
FLA_VERSION=0.6.0
EINOPS_VERSION=0.8.2
MAMBA_VERSION=2.3.2.post1
FASTCORE_VERSION=1.14.5
BLAKE3_VERSION=1.0.11
DEVICE_PY=3.12   # the GPU image's python3
# the GPU image's packages the suite may import, as import names (bench/README.md, "running the suite on a remote device")
IMAGE_HAS="torch triton numpy einops tqdm safetensors tiktoken tiktoken_ext tokenizers yaml matplotlib pytest"
PEERS=bench/peers
die() { echo "fetch_peers.sh: $*" >&2; exit 1; }

"$PYTHON" -c "import torch, setuptools, wheel" 2>/dev/null \
  || die "$PYTHON needs torch, setuptools and wheel to build the mamba_ssm wheel (set PYTHON=...)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$PEERS"
rm -f "$PEERS"/*.whl

echo "== wheels: fla-core $FLA_VERSION, einops $EINOPS_VERSION, fastcore $FASTCORE_VERSION"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: -d "$PEERS" \
  "fla-core==$FLA_VERSION" "einops==$EINOPS_VERSION" "fastcore==$FASTCORE_VERSION" \
  || die "pip download of the fla-core / einops / fastcore wheels failed"

echo "== blake3 $BLAKE3_VERSION for CPython $DEVICE_PY, manylinux x86_64"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$DEVICE_PY" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$PEERS" \
  "blake3==$BLAKE3_VERSION" || die "pip download of the blake3 wheel for CPython $DEVICE_PY failed"

echo "== mamba-ssm $MAMBA_VERSION sdist -> pure-Python wheel (no CUDA build)"
export MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE
"$PYTHON" -m pip download --quiet --no-deps --no-build-isolation --no-binary=:all: -d "$tmp" "mamba-ssm==$MAMBA_VERSION" \
  || die "pip download of the mamba-ssm $MAMBA_VERSION sdist failed"
"$PYTHON" -m pip wheel --quiet --no-deps --no-build-isolation -w "$tmp/wheel" "$tmp"/mamba_ssm-*.tar.gz \
  > "$tmp/build.log" 2>&1 || { tail -20 "$tmp/build.log" >&2; die "building the mamba_ssm wheel failed"; }
whl=$(ls "$tmp"/wheel/mamba_ssm-*.whl)
[[ "$whl" == *-py3-none-any.whl ]] || die "the mamba_ssm wheel is not pure Python: $(basename "$whl")"
unzip -l "$whl" | grep -q "mamba_ssm/ops/triton/mamba3/mamba3_siso_combined.py" \
  || die "$(basename "$whl") lacks mamba_ssm/ops/triton/mamba3/mamba3_siso_combined.py"
cp "$whl" "$PEERS/"

RANKS_SHA=306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930
RANKS=${MAMBA3_LITE_GPT2_RANKS:-$HOME/.cache/mamba3-lite/gpt2.tiktoken}
rm -f "$PEERS/gpt2.tiktoken"
if echo "$RANKS_SHA  $RANKS" | sha256sum -c --status 2>/dev/null; then
  cp "$RANKS" "$PEERS/gpt2.tiktoken"
  echo "== GPT-2 ranks: $RANKS"
else
  echo "== GPT-2 ranks: none at $RANKS with sha256 $RANKS_SHA (mamba3-lite install-tokenizer --from-pypi fetches them);"
  echo "   the device's e2e smoke will use synthetic token shards"
fi

for w in "$PEERS"/*.whl; do
  [[ "$w" == *-none-any.whl || "$w" == */blake3-* ]] || die "$w is not a pure-Python wheel"
done
echo "== what the suite imports: the image's packages ($IMAGE_HAS) + these wheels"
"$PYTHON" bench/gpu_env.py --lacking "$IMAGE_HAS" "$PEERS" || die "add a wheel for the module named above"
total=$(du -sk "$PEERS" | cut -f1)
(( total < 16384 )) || die "$PEERS holds ${total} KiB; the device tool carries 64 MiB in all with the tree"
ls -l "$PEERS"
echo "bench/peers: $(ls "$PEERS" | wc -l) files, ${total} KiB (carry it: see bench/README.md)"
