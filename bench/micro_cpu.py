"""CPU micro-benchmarks of single pieces, each a subcommand; interleaved rounds of process CPU time, medians [min-max].

- `ssd`: one SSD layer, forward (`--grad`: + backward): the token loop `ssd_naive`, the plain chunked `ssd.ssd_chunked`
  and the fast `ssd_fast.ssd_chunked` (what the block runs), at T = 256, 1,024, 4,096 (b=1, H=4, P=16, N=32).
  `--mamba2`: the Mamba-2 case (no rotation, λ = 1, no D), forward + backward, of the fast `ssd_chunked` beside the
  official `ssd_minimal_discrete` (https://github.com/state-spaces/mamba, mamba_ssm/modules/ssd_minimal.py; needs
  einops and mamba_ssm on sys.path or under --mamba-ssm DIR, its CUDA-only __init__ not run).
- `loss`: the chunked LM loss's two choices at the quickstart batch (2,048 tokens, V = 50,257, d = 64): its two V-wide
  products against transposed views and in the row-major layouts it uses, and its forward + backward at several chunk
  sizes (its default among them).
- `memory`: what one Triton SSD layer saves for its backward at the 434M shape (b16 T2048 H32 P64 N128 S32, bf16,
  shared B/C with per-head biases), per tensor, through `saved_tensors_hooks` with every kernel launch stubbed out.

`--baseline REV` (ssd, loss) adds the same function as it was at git revision REV (bench/baseline.py) to the rounds,
so a change is measured before and after in one run. `--out FILE` writes the rows as JSON.

    python bench/micro_cpu.py ssd [--grad] [--T 256 1024 4096] [--rounds 7] [--baseline REV] [--out FILE]
    python bench/micro_cpu.py ssd --mamba2 [--mamba-ssm DIR]
    python bench/micro_cpu.py loss [--chunks 32,64,166,512] [--baseline REV] [--out FILE]
    python bench/micro_cpu.py memory [--out FILE]
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import baseline
from cpu_env import cpu_machine


def interleaved(fns: dict, rounds: int) -> dict:
    "Process CPU seconds per call of each function, one call of each per round in turn, after one untimed call each."
    for f in fns.values(): f()
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            t0 = time.process_time(); f(); times[k].append(time.process_time() - t0)
    return {k: {"median": statistics.median(v), "min": min(v), "max": max(v)} for k, v in times.items()}


def table(title: str, rows: dict, ref: str):
    "Print `rows` ({name: timing}) in ms, with each median over the median of `ref`."
    print(title)
    for k, r in rows.items():
        print(f"  {k:<34}{r['median'] * 1e3:>10.2f} ms [{r['min'] * 1e3:.2f}-{r['max'] * 1e3:.2f}]"
              f"{r['median'] / rows[ref]['median']:>8.2f}x")


def ssd_fns(a, kw, base):
    "{name: call} of the SSD functions to time on `kw`; a backward is driven by a fixed random cotangent."
    from mamba3_lite import ssd, ssd_fast
    L = {"chunk_size": a.chunk_size}
    fns = {"ssd_fast.ssd_chunked": lambda: ssd_fast.ssd_chunked(**kw, **L)}
    if a.mamba2:
        from official import official_or_reason
        if a.mamba_ssm: sys.path.insert(0, a.mamba_ssm)
        minimal = official_or_reason("modules.ssd_minimal", "ssd_minimal_discrete", "not found (pass --mamba-ssm DIR)")
        if callable(minimal):   # its X·Δ and A·Δ formed inside the timed call, as ssd_chunked forms them inside its own
            fns["ssd_minimal_discrete"] = lambda: minimal(kw["x"] * kw["dt"][..., None], kw["A"] * kw["dt"], kw["B"], kw["C"], a.chunk_size)
        else: print(minimal)
    else:
        fns.update({"ssd.ssd_chunked": lambda: ssd.ssd_chunked(**kw, **L), "ssd_naive": lambda: ssd.ssd_naive(**kw)})
    if base: fns[f"ssd_chunked@{a.baseline}"] = lambda: base(**kw, **L)
    grad = a.grad or a.mamba2
    cot = torch.randn(kw["x"].shape, generator=torch.Generator().manual_seed(1))   # (y.sum()'s stride-0 gradient is not
                                                                                   # what training sees)
    def timed(f):
        def run():
            with torch.set_grad_enabled(grad):
                y = f()[0]
                if grad: torch.autograd.backward(y, cot)
        return run
    return {k: timed(f) for k, f in fns.items()}


def base_ssd(base_dir):
    "The fast `ssd_chunked` at the baseline revision: `ssd_fast`'s, or before that module existed, `ssd`'s."
    try: return baseline.module(base_dir, "ssd_fast").ssd_chunked
    except ModuleNotFoundError: return baseline.module(base_dir, "ssd").ssd_chunked


def bench_ssd(a, base_dir):
    from mamba3_lite.ssd import ssd_random_inputs
    base = base_ssd(base_dir) if base_dir else None
    rows = {}
    for T in a.T:
        kw = ssd_random_inputs(b=a.b, T=T, H=a.H, P=a.P, N=a.N, S=0 if a.mamba2 else a.S, dtype=torch.float32, seed=T)
        if a.mamba2: kw = {k: kw[k] for k in ("x", "dt", "A", "B", "C")}
        kw = {k: v.requires_grad_(a.grad or a.mamba2) for k, v in kw.items()}
        if a.mamba2: kw["lam"] = torch.ones_like(kw["dt"]).detach()
        rows[T] = interleaved(ssd_fns(a, kw, base), a.rounds)
        table(f"T = {T}, b={a.b} H={a.H} P={a.P} N={a.N}, {'fwd + bwd' if a.grad or a.mamba2 else 'fwd'}, "
              f"{a.threads} thread(s), median over ssd_fast.ssd_chunked's:", rows[T], "ssd_fast.ssd_chunked")
    return {"case": "mamba2" if a.mamba2 else "mamba3", "shape": dict(b=a.b, H=a.H, P=a.P, N=a.N, chunk=a.chunk_size),
            "cpu_s": {str(T): r for T, r in rows.items()}}


def bench_loss(a, base_dir):
    from mamba3_lite.loss import chunked_lm_loss, loss_chunk_tokens
    g = torch.Generator().manual_seed(0)
    n, d, V, c = a.tokens, a.d, a.vocab, loss_chunk_tokens(a.vocab)
    h, w, targets = torch.randn(n, d, generator=g), 0.02 * torch.randn(V, d, generator=g), torch.randint(0, V, (n,), generator=g)
    hc, wt, G = h[:c].clone(), w.T.contiguous(), torch.randn(c, V, generator=g) / (c * V)
    z, gw, gwt = torch.empty(c, V), torch.zeros(V, d), torch.zeros(d, V)
    layout = interleaved({"logits, W^T as a view of W": lambda: torch.mm(hc, w.T, out=z),
                          "logits, W^T row-major": lambda: torch.mm(hc, wt, out=z),
                          "dW += G^T H (view of G)": lambda: gw.addmm_(G.T, hc),
                          "dW^T += H^T G": lambda: gwt.addmm_(hc.T, G)}, a.rounds)
    hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
    step = lambda chunk, fn=chunked_lm_loss: torch.autograd.grad(fn(hh, ww, targets, chunk_tokens=chunk), (hh, ww))
    chunks = [int(x) for x in a.chunks.split(",")]
    variants = {str(ch): (lambda ch=ch: step(ch)) for ch in chunks}
    if base_dir:
        old = baseline.module(base_dir, "loss").chunked_lm_loss
        variants[f"{c}@{a.baseline}"] = lambda: step(c, old)
    sweep = interleaved(variants, a.rounds)
    med = lambda r, k: r[k]["median"]
    ratios = {"logits: view / row-major": med(layout, "logits, W^T as a view of W") / med(layout, "logits, W^T row-major"),
              "weight gradient: G^T H / H^T G": med(layout, "dW += G^T H (view of G)") / med(layout, "dW^T += H^T G")}
    ratios.update({f"loss chunk {ch} / chunk {c}": med(sweep, str(ch)) / med(sweep, str(c)) for ch in chunks if ch != c})
    if base_dir: ratios[f"loss chunk {c}: this tree / {a.baseline}"] = med(sweep, str(c)) / med(sweep, f"{c}@{a.baseline}")
    table(f"one chunk of {c} tokens, d = {d}, V = {V:,}, over the row-major logits:", layout, "logits, W^T row-major")
    table(f"loss forward + backward of {n} tokens by chunk size, over the default {c}:", sweep, str(c))
    for k, v in ratios.items(): print(f"  {k:<44}{v:6.2f}")
    return {"tokens": n, "d": d, "vocab": V, "default_chunk": c, "layout_cpu_s": layout, "chunks_cpu_s": sweep, "ratios": ratios}


def bench_memory(a, _):
    "What autograd saves for one `ssd_triton` call at the 434M layer shape, no kernel run."
    import mamba3_lite.ssd_triton as st
    b, T, H, P, N, S, L, dtype = 16, 2048, 32, 64, 128, 32, 64, torch.bfloat16
    g = torch.Generator().manual_seed(0)
    rn = lambda *s: torch.randn(*s, generator=g)
    x = rn(b, T, (H + 1) * P).to(dtype)[..., :H * P].view(b, T, H, P)        # a view of the in-projection
    kw = dict(x=x, dt=torch.rand(b, T, H, generator=g) * 0.1 + 1e-3, A=-1 - 15 * torch.rand(b, T, H, generator=g),
              B=rn(b, T, 1, N).to(dtype), C=rn(b, T, 1, N).to(dtype), lam=torch.rand(b, T, H, generator=g),
              theta=rn(b, T, S), D=rn(H), B_bias=rn(H, N), C_bias=rn(H, N))
    kw, seen = {k: v.requires_grad_(True) for k, v in kw.items()}, {}

    def pack(t):
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)   # each distinct tensor once
        seen.setdefault(key, (tuple(t.shape), str(t.dtype).replace("torch.", ""), t.numel() * t.element_size()))
        return t
    real_launch, real_dot = st._launch, st._dot_dtype
    st._launch, st._dot_dtype = (lambda *_, **__: None), (lambda d: st._TL_DTYPES[d])   # nothing runs; bf16 as on a GPU
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            st.ssd_triton(**kw, chunk_size=L)
    finally:
        st._launch, st._dot_dtype = real_launch, real_dot
    rows = sorted(seen.values(), key=lambda r: -r[2])
    print("saved for the backward, one SSD layer at b16 T2048 H32 P64 N128 S32, bf16, shared B/C + biases:")
    for shape, dt, nbytes in rows: print(f"  {str(shape):28} {dt:9} {nbytes / 2**20:9.1f} MiB")
    print(f"  {'total':38} {sum(r[2] for r in rows) / 2**20:9.1f} MiB")
    return {"rows": [dict(shape=s, dtype=d, bytes=n) for s, d, n in rows], "total_bytes": sum(r[2] for r in rows)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["ssd", "loss", "memory"])
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default: 7)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    p.add_argument("--baseline", default=None, metavar="REV", help="ssd, loss: also the function at git revision REV")
    p.add_argument("--out", default=None, metavar="FILE", help="write the results as JSON")
    p.add_argument("--T", type=int, nargs="+", default=[256, 1024, 4096], help="ssd: sequence lengths")
    for name, default in (("b", 1), ("H", 4), ("P", 16), ("N", 32), ("S", 8), ("chunk-size", 64)):
        p.add_argument(f"--{name}", type=int, default=default, help=f"ssd (default: {default})")
    p.add_argument("--grad", action="store_true", help="ssd: forward + backward")
    p.add_argument("--mamba2", action="store_true", help="ssd: the Mamba-2 case beside the official ssd_minimal_discrete")
    p.add_argument("--mamba-ssm", default=None, metavar="DIR", help="ssd --mamba2: directory holding the mamba_ssm package")
    p.add_argument("--tokens", type=int, default=16 * 128, help="loss: tokens per batch (default: the quickstart's 2,048)")
    p.add_argument("--d", type=int, default=64, help="loss: hidden size (default: the tiny preset's 64)")
    p.add_argument("--vocab", type=int, default=50257, help="loss: vocabulary size (default: GPT-2's)")
    p.add_argument("--chunks", default="32,64,166,512", help="loss: chunk sizes in tokens (166: the default at V = 50,257)")
    a = p.parse_args(argv)
    if a.what == "memory": os.environ["TRITON_INTERPRET"] = "1"   # CPU tensors accepted, before the kernels import
    torch.set_num_threads(a.threads)
    torch.set_flush_denormal(True)
    with tempfile.TemporaryDirectory() as tmp:
        base_dir = baseline.extract(a.baseline, tmp) if a.baseline and a.what != "memory" else None
        result = {"ssd": bench_ssd, "loss": bench_loss, "memory": bench_memory}[a.what](a, base_dir)
    if a.out:
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        Path(a.out).write_text(json.dumps({"date": now, "machine": cpu_machine(), "bench": a.what, "threads": a.threads,
                                           "rounds": a.rounds, "baseline": a.baseline, **result}, indent=1))
        print(f"-> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
