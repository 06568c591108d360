"""What one Triton SSD layer keeps for its backward, measured on CPU without running a kernel.

`ssd_triton` runs at the 434M layer shape (b16 T2048 H32 P64 N128 S32, chunk 64, bf16 x and shared B/C with
per-head biases) with every kernel launch stubbed out (the tensors it would fill are allocated, nothing is
computed), and the operand dtype a GPU launch uses (bf16). Every tensor autograd saves for the backward passes
through `torch.autograd.graph.saved_tensors_hooks`; each distinct one (same storage, offset and shape) counts once.

    python bench/ssd_memory.py                  # a table of the saved tensors and their total
    python bench/ssd_memory.py --json PATH      # rows {"shape", "dtype", "bytes"} and {"total_bytes"}
"""
import argparse
import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"      # CPU tensors are accepted; no kernel runs (the launches are stubbed)

import torch  # noqa: E402

import mamba3_lite.ssd_triton as st  # noqa: E402


def saved_tensors(b=16, T=2048, H=32, P=64, N=128, S=32, L=64, dtype=torch.bfloat16):
    "[(shape, dtype, bytes)] of the distinct tensors autograd saves for one `ssd_triton` call at this shape."
    g = torch.Generator().manual_seed(0)
    rn = lambda *s: torch.randn(*s, generator=g)
    x = rn(b, T, (H + 1) * P).to(dtype)[..., :H * P].view(b, T, H, P)        # a view of the in-projection
    kw = dict(x=x, dt=torch.rand(b, T, H, generator=g) * 0.1 + 1e-3, A=-1 - 15 * torch.rand(b, T, H, generator=g),
              B=rn(b, T, 1, N).to(dtype), C=rn(b, T, 1, N).to(dtype), lam=torch.rand(b, T, H, generator=g),
              theta=rn(b, T, S), D=rn(H), B_bias=rn(H, N), C_bias=rn(H, N))
    kw = {k: v.requires_grad_(True) for k, v in kw.items()}
    seen = {}

    def pack(t):
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
        seen.setdefault(key, (tuple(t.shape), str(t.dtype).replace("torch.", ""), t.numel() * t.element_size()))
        return t

    real_launch, real_dot = st._launch, st._dot_dtype
    st._launch = lambda *a, **k: None                        # nothing is computed
    st._dot_dtype = lambda d: st._TL_DTYPES[d]               # bf16 operands and states, as on a GPU
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            st.ssd_triton(**kw, chunk_size=L)
    finally:
        st._launch, st._dot_dtype = real_launch, real_dot
    return sorted(seen.values(), key=lambda r: -r[2])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=None, metavar="PATH")
    a = p.parse_args(argv)
    rows = saved_tensors()
    total = sum(r[2] for r in rows)
    print("saved for the backward, one SSD layer at b16 T2048 H32 P64 N128 S32, bf16, shared B/C + biases:")
    print(f"{'shape':28} {'dtype':9} {'MiB':>9}")
    for shape, dtype, nbytes in rows:
        print(f"{str(shape):28} {dtype:9} {nbytes / 2**20:9.1f}")
    print(f"{'total':28} {'':9} {total / 2**20:9.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(rows=[dict(shape=s, dtype=d, bytes=n) for s, d, n in rows], total_bytes=total), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
