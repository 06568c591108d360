"""GPU benchmark of the fused Triton SSD (`mamba3_lite.ssd_triton.ssd_triton`) against its peers.

1. Correctness gate at the 434M layer shape (H 32, P 64, N 128, S 32, chunk 64) with T 2048, batch 2, on the three
   paths of `GATE_PATHS`: the one the model trains with (B, C shared by the heads plus per-head biases added in the
   kernel, θ shared), the same with document restarts (`seq_idx`, as `data.reset_at_eos` trains), and per-head B/C
   (the `ssd_chunked` contract, what the timings call "ours"). Each in bf16 (x, B, C; vs an fp32 `ssd_chunked` fed
   the same bf16-rounded inputs) and fp32 (vs `ssd_chunked`): y, final state, every gradient (the biases' included);
   bounds in TOL. An fp32 miss or an exception stops everything (exit 1); a bf16 miss is reported and the timings
   still run (exit 3, see `gate_verdict`).
2. Forward and forward+backward timings: median over >= 100 reps after warm-up, L2 flushed before each rep, CUDA
   events around the call only; peak memory above the inputs; achieved TFLOP/s on the nominal SSD FLOP count; %
   of the roofline lower bound; every peer's time divided by ours (> 1: we are faster). Ours (and the eager
   `ssd_chunked`) at every shape first; then fla / the official kernel against ours on the cases they can express
   (information: their conventions may differ); then the peers' timings (`time_all`).

Ours runs with per-head B/C (the `ssd_chunked` contract) and with shared B/C plus per-head biases (the extension
the block can use). Peers: `ssd_chunked` eager and under `torch.compile`; fla's `chunk_simple_gla` on the
Mamba-2-reducible case (λ ≡ 1, no rotation: q=C, k=B per head, v=x·Δ, g=A·Δ, scale 1; our kernel runs the same case
for the ratio) if `fla` imports; the official `mamba3_siso_combined` if it imports (shared B/C plus per-head biases,
compared with ours on the same interface).

    python bench/ssd_kernel.py                    # full run (GPU), writes $OUT or bench/results/
    python bench/ssd_kernel.py --part gate        # correctness only (three paths, fp32 and bf16, 434M layer shape)
    python bench/ssd_kernel.py --part time --shapes main --no-compile   # timings at b16 T2048 only, no gate
    python bench/ssd_kernel.py --smoke            # one shape, fewer reps, no torch.compile
    python bench/ssd_kernel.py --smoke --cpu      # tiny shapes through the Triton interpreter (harness check only)

Peers come from bench/peers/ (bench/fetch_peers.sh): fla-core, einops and a pure-Python mamba_ssm wheel.
`mamba_ssm/__init__.py` imports its CUDA extensions, so the official kernel is imported with the package's
`__init__` bypassed (`load_official`). Their `triton.autotune` lists (27 to 81 configs per kernel for the
official kernel, up to 48 for fla) are cut to `--peer-configs` configs per kernel (the ones nearest to 4 warps,
2 stages, no register cap, in the library's own order) so that their compile time fits one device command;
`--peer-configs 0` keeps every config. The JSON and markdown are rewritten after each precision of the gate and
after each timed row, and on SIGINT (`timeout -s INT`, marked `interrupted`), so a cut run keeps what finished. Exit status: 0, 1 (fp32 miss), 3 (bf16 miss only).
"""
import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

# The interpreter must be chosen before mamba3_lite.ssd_triton (and triton) are imported.
if "--cpu" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from mamba3_lite.ssd import SSDState, nmax, ssd_chunked, ssd_random_inputs, ssd_random_state  # noqa: E402
from mamba3_lite.ssd_triton import ssd_triton  # noqa: E402
from gpu_env import datasheet  # noqa: E402
from official import official_or_reason  # noqa: E402


# ---------------------------------------------------------------- shapes, FLOPs, bytes
def ssd_flops(b, T, H, P, N, L):
    "Nominal SSD FLOPs (fwd, bwd): per (chunk, head) 2L²N + 2L²P + 4LNP forward, 6L²N + 4L²P + 8LNP backward."
    chunks = b * H * math.ceil(T / L)
    return chunks * (2 * L * L * (N + P) + 4 * L * N * P), chunks * (6 * L * L * N + 4 * L * L * P + 8 * L * N * P)


def min_bytes(b, T, H, P, N, S):
    """Fewest HBM bytes (fwd, fwd+bwd) for the minimal interface: bf16 x, y, B and C shared by the heads (G = 1),
    bf16 angle logits, three bf16 per-token-head scalars. fwd moves inputs I + output O; fwd+bwd moves 3I + 2O
    (backward reads I and dO, writes dI)."""
    th = b * T * H
    inp = th * (2 * P + 6) + b * T * (2 * 2 * N + 2 * S)
    out = th * 2 * P
    return inp + out, 3 * inp + 2 * out


def roofline_us(b, T, H, P, N, S, peak_tflops, peak_tbps):
    """Lower bounds (fwd, fwd+bwd) in µs at L = 64: max(nominal FLOPs / peak, `min_bytes` / bandwidth); (None, None)
    without a peak (a device bench/gpu_model.py's GPUS does not hold, or the CPU)."""
    if peak_tflops is None or peak_tbps is None:
        return None, None
    f_fwd, f_bwd = ssd_flops(b, T, H, P, N, 64)
    by_fwd, by_all = min_bytes(b, T, H, P, N, S)
    bound = lambda flops, nbytes: 1e6 * max(flops / (peak_tflops * 1e12), nbytes / (peak_tbps * 1e12))
    return bound(f_fwd, by_fwd), bound(f_fwd + f_bwd, by_all)


def roofline_peaks(device_name, tflops=None, tbps=None):
    """(GPUS key, peak TFLOP/s, TB/s, where they come from) for the roofline: the values given, else the datasheet row
    of the GPU called `device_name` (None on CPU) in bench/gpu_model.py's GPUS; a GPU the table does not hold (one
    line says so) and the CPU get no peaks, so no roofline, rather than another card's."""
    if tflops is not None and tbps is not None:
        return None, tflops, tbps, "given"
    if device_name is None:
        return None, None, None, "a CPU has no datasheet row"
    gpu, row = datasheet(device_name, say=lambda line: print(f"ssd_kernel.py: {line}"))
    if row is None:
        return None, None, None, f"{device_name!r} is not in bench/gpu_model.py's GPUS"
    return (gpu, tflops if tflops is not None else row["tensor"] / 1e12,
            tbps if tbps is not None else row["bandwidth"] / 1e12, "datasheet")


# ---------------------------------------------------------------- timing
class Timer:
    "Median time of fn() in ms: CUDA events with an L2 flush before each rep on GPU, perf_counter on CPU."

    def __init__(self, device, flush_mb=512):
        self.cuda = device.type == "cuda"
        self.flush = torch.empty(flush_mb * 2**20 // 4, device=device, dtype=torch.float32) if self.cuda else None

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def __call__(self, fn, reps, warmup, budget_s):
        for _ in range(warmup):
            fn()
        self.sync()
        times, t_start = [], time.perf_counter()
        for i in range(reps):
            if self.cuda:
                self.flush.zero_()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(); fn(); end.record()
                times.append((start, end))
            else:
                t0 = time.perf_counter(); fn(); times.append(1e3 * (time.perf_counter() - t0))
            if time.perf_counter() - t_start > budget_s:
                self.sync()
                break
        self.sync()
        ms = [s.elapsed_time(e) for s, e in times] if self.cuda else times
        return statistics.median(ms), len(ms)

    def peak_mb(self, fn):
        "Peak allocated memory above what was allocated before fn() (None on CPU)."
        if not self.cuda:
            return None
        self.sync()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        self.sync()
        return (torch.cuda.max_memory_allocated() - base) / 2**20


# ---------------------------------------------------------------- inputs and candidates
def make_inputs(b, T, H, P, N, S, device, dtype, seed=0, mamba2=False):
    "`ssd_random_inputs` with x, B, C in `dtype`, the per-token scalars fp32. mamba2=True: λ ≡ 1, no theta, no D."
    kw = ssd_random_inputs(b=b, T=T, H=H, P=P, N=N, S=S, dtype=torch.float32, seed=seed, device=device)
    for k in ("x", "B", "C"):
        kw[k] = kw[k].to(dtype)
    if mamba2:
        kw["lam"] = torch.ones_like(kw["lam"]); kw["theta"] = None; kw["D"] = None
    return kw


def limit_autotune(modules, keep):
    """Cut every `triton.autotune` config list found in `modules` (through `heuristics` / `jit` wrappers) to the `keep`
    configs nearest to 4 warps, 2 stages and no register cap, ties in the library's order. Returns (kernels, before,
    after) config counts. keep <= 0 leaves them all."""
    import triton
    seen, before, after = set(), 0, 0
    pref = lambda c: (abs(getattr(c, "num_warps", 4) - 4), abs(getattr(c, "num_stages", 2) - 2),
                      getattr(c, "maxnreg", None) is not None)
    for mod in modules:
        for obj in list(vars(mod).values()):
            while obj is not None and id(obj) not in seen:
                seen.add(id(obj))
                cfgs = getattr(obj, "configs", None)
                if isinstance(cfgs, list) and cfgs and all(isinstance(c, triton.Config) for c in cfgs):
                    before += len(cfgs)
                    if keep > 0:
                        obj.configs = sorted(cfgs, key=pref)[:keep]
                    after += len(obj.configs)
                obj = getattr(obj, "fn", None)
    return before, after


def peer_modules(prefix):
    return [m for name, m in list(sys.modules.items()) if m is not None and (name == prefix or name.startswith(prefix + "."))]


def load_fla(keep):
    "fla's chunk_simple_gla with its autotune lists cut to `keep`, or one line saying why it is unavailable."
    try:
        from fla.ops.simple_gla import chunk_simple_gla
    except Exception as e:  # not installed / incompatible: reported, not fatal
        return f"fla unavailable: {type(e).__name__}: {e}"[:200]
    before, after = limit_autotune(peer_modules("fla"), keep)
    return chunk_simple_gla, f"fla: ok, autotune configs {after} of {before}"


def load_official(keep):
    "The official `mamba3_siso_combined` (https://github.com/state-spaces/mamba, mamba_ssm/ops/triton/mamba3/), bench/official.py's way."
    mamba3_siso_combined = official_or_reason("ops.triton.mamba3.mamba3_siso_combined", "mamba3_siso_combined",
                                              "not installed (bench/fetch_peers.sh builds its wheel into bench/peers/)")
    if isinstance(mamba3_siso_combined, str): return mamba3_siso_combined
    before, after = limit_autotune(peer_modules("mamba_ssm"), keep)
    return mamba3_siso_combined, f"official: ok, autotune configs {after} of {before}"


def fla_args(kw):
    "The Mamba-2-reducible case in fla's variables: q=C, k=B, v=x·Δ, g=A·Δ (log decay), scale 1."
    dt = kw["dt"].float()
    v = (kw["x"].float() * dt[..., None]).to(kw["x"].dtype)
    return dict(q=kw["C"], k=kw["B"], v=v, g=(kw["A"].float() * dt), scale=1.0)


def official_args(b, T, H, P, N, S, device, dtype, seed=0):
    """Official SISO inputs for the same model: shared B/C (G = 1) plus per-head biases, raw λ logits and raw angle
    logits (the kernel applies sigmoid and π·tanh itself), ADT/DT as (b, H, T)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    rn = lambda *s: torch.randn(*s, generator=g)
    rms = lambda v: v * torch.rsqrt(v.square().mean(-1, keepdim=True))
    dt = torch.exp(torch.empty(b, H, T).uniform_(math.log(1e-3), math.log(1e-1), generator=g))
    A = -torch.empty(b, H, T).uniform_(1, 16, generator=g)
    args = dict(Q=rms(rn(b, T, 1, N)), K=rms(rn(b, T, 1, N)), V=rn(b, T, H, P), ADT=A * dt, DT=dt,
                Trap=rn(b, H, T), Q_bias=rn(H, N), K_bias=rn(H, N), Angles=rn(b, T, 1, S).expand(b, T, H, S).contiguous(),
                D=rn(H))
    half = ("Q", "K", "V")
    return {k: v.to(device=device, dtype=dtype if k in half else torch.float32) for k, v in args.items()}


def official_as_ours(a):
    "The same model in ssd_triton's shared-B/C interface (biases in the kernel; sigmoid and (b, T, H) layout applied)."
    tr = lambda t: t.transpose(1, 2).contiguous()
    dt = tr(a["DT"])
    return dict(x=a["V"], dt=dt, A=tr(a["ADT"]) / dt, B=a["K"], C=a["Q"], B_bias=a["K_bias"], C_bias=a["Q_bias"],
                lam=torch.sigmoid(tr(a["Trap"])), theta=a["Angles"][:, :, 0].float(), D=a["D"])


def shared_inputs(kw, seed=0):
    "kw with B, C shared by the heads (G = 1) plus N(0, 1) per-head biases: the interface the block can use."
    H, N = kw["x"].shape[2], kw["B"].shape[-1]
    g = torch.Generator(device="cpu").manual_seed(seed)
    bias = lambda: torch.randn(H, N, generator=g).to(kw["x"].device)
    return dict(kw, B=kw["B"][:, :, :1].contiguous(), C=kw["C"][:, :, :1].contiguous(), B_bias=bias(), C_bias=bias())


# ---------------------------------------------------------------- correctness gate
GATE_GPU = dict(b=2, T=2048, H=32, P=64, N=128, S=32)   # the 434M layer (H, P, N, S) at T 2048, batch 2
GATE_CPU = dict(b=2, T=40, H=2, P=16, N=32, S=4)
TOL = {"fp32 y": 1e-4, "fp32 h": 1e-4, "fp32 grad": 1e-3, "bf16 y": 2e-2, "bf16 h": 2e-2, "bf16 grad": 5e-2}


def document_ids(b, T, L, seed=0):
    """(b, T) int64 document indices that never decrease: a restart at a chunk boundary, one a token after it, and one
    at a random token of every other chunk, different per row."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.zeros(b, T, dtype=torch.int64)
    for row in range(b):
        for c in range(0, T, 2 * L):
            starts[row, min(T - 1, c + int(torch.randint(1, L, (1,), generator=g)))] = 1
    starts[:, L] = 1
    starts[:, min(T - 1, L + 1)] = 1
    return starts.cumsum(1)


def per_head_reference(x, dt, A, B, C, lam, theta=None, D=None, B_bias=None, C_bias=None, **kw):
    """`ssd_chunked` on ssd_triton's shared-B/C interface: each head's B (C) row is the shared row plus that head's bias,
    in fp32, as the kernel adds it; gradients reach the shared rows and the biases through the sum."""
    if B_bias is not None:
        H = x.shape[2]
        B = B.float().expand(-1, -1, H, -1) + B_bias.float()
        C = C.float().expand(-1, -1, H, -1) + C_bias.float()
    return ssd_chunked(x, dt, A, B, C, lam, theta, D, **kw)


GATE_PATHS = ("shared B/C + bias", "shared B/C + bias, resets", "per-head B/C")   # the training path first


def gate(device, interp, rows, on_rows):
    """Equivalence checks at the 434M layer shape (GATE_GPU, chunk 64; tiny through the interpreter) on each path of
    GATE_PATHS, appended to `rows` as (check, value, bound, ok), on_rows() after each path and precision. nmax = max
    |a - b| / max |b|. fp32: ours vs `ssd_chunked` on the same inputs (shared B/C through `per_head_reference`); bf16:
    ours on bf16 x, B, C vs `ssd_chunked` in fp32 on the same bf16-rounded values. Every gradient (x, dt, A, B, C,
    lam, theta, D, the biases, and the initial state on CPU) enters the worst-gradient number. On the GPU the initial
    state is left out so that the gate compiles the kernels that training runs (bench/e2e_gpu_smoke.py checks it)."""
    shape = GATE_CPU if interp else GATE_GPU
    L = 16 if interp else 64
    per_head = make_inputs(**shape, device=device, dtype=torch.float32, seed=1)
    shared = shared_inputs(per_head, seed=3)
    seq_idx = document_ids(shape["b"], shape["T"], L, seed=4).to(device)
    inputs = {GATE_PATHS[0]: shared, GATE_PATHS[1]: dict(shared, seq_idx=seq_idx), GATE_PATHS[2]: per_head}
    st = ssd_random_state(b=shape["b"], H=shape["H"], P=shape["P"], N=shape["N"], S=shape["S"], dtype=torch.float32,
                          device=device) if interp else None
    leaf = lambda v: v.detach().clone().requires_grad_(True) if torch.is_tensor(v) and v.is_floating_point() else v

    def run(fn, d, s):
        d = {k: leaf(v) for k, v in d.items()}
        s = SSDState(*(leaf(t) for t in s)) if s is not None else None
        y, out = fn(**d, initial_state=s, chunk_size=L)
        gen = torch.Generator(device="cpu").manual_seed(0)
        loss = sum((o.float() * torch.randn(o.shape, generator=gen).to(device)).sum() for o in (y, *out) if o.numel())
        loss.backward()
        named = {**d, **({f"state.{k}": v for k, v in s._asdict().items()} if s is not None else {})}
        return y, out, {k: v.grad for k, v in named.items() if torch.is_tensor(v) and v.requires_grad and v.numel()}

    def max_grad_err(ga, gr):
        "(worst gradient nmax, its input); a gradient present on one path only counts as a failure."
        errs = {k: nmax(ga[k], gr[k]) if ga[k] is not None and gr[k] is not None else
                (0.0 if ga[k] is None and gr[k] is None else float("inf")) for k in gr}
        worst = max(errs, key=errs.get)
        return errs[worst], worst

    where = "b{b} T{T} H{H} P{P} N{N} S{S}".format(**shape) + f" L{L}"
    check = lambda name, val, bound: rows.append((name, val, bound, bool(val <= bound)))

    def compare(prec, path, ours_kw, ref_kw, ref):
        "Ours on `ours_kw` vs `ssd_chunked` on `ref_kw`: output, final state and worst gradient, bounded by TOL[prec ...]."
        y_t, s_t, g_t = run(ssd_triton, ours_kw, st)
        y_r, s_r, g_r = run(per_head_reference, ref_kw, st)
        err, worst = max_grad_err(g_t, g_r)
        check(f"{prec} {path}: y vs {ref} ({where})", nmax(y_t, y_r), TOL[f"{prec} y"])
        check(f"{prec} {path}: final h", nmax(s_t.h, s_r.h), TOL[f"{prec} h"])
        check(f"{prec} {path}: worst grad ({worst})", err, TOL[f"{prec} grad"])
        on_rows()

    for path in GATE_PATHS:
        kw = inputs[path]
        if not interp:   # bf16 first: the precision the model trains in (the interpreter's bf16 tl.dot is wrong)
            kw16 = {k: (v.to(torch.bfloat16) if k in ("x", "B", "C") else v) for k, v in kw.items()}
            kw32 = {k: (v.float() if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in kw16.items()}
            compare("bf16", path, kw16, kw32, "fp32 ssd_chunked on the rounded inputs")
        compare("fp32", path, kw, kw, "ssd_chunked")


def peer_gate(device, interp, has_fla, has_official):
    """Agreement of fla (Mamba-2 case) and the official kernel (shared B/C + biases) with ours at the gate shape, bf16.
    Information, not a gate: a peer's conventions may differ; an exception counts as inf with its line printed."""
    shape, L, rows = (GATE_CPU if interp else GATE_GPU), (16 if interp else 64), []

    def peer_check(name, bound, compute):
        if time.perf_counter() > DEADLINE:
            print(f"  gate {name}: not started (past --deadline-s)")
            return
        try:
            rows.append((name, compute(), bound))
        except Exception as e:
            print(f"  gate {name}: {type(e).__name__}: {e}"[:300])
            rows.append((name, float("inf"), bound))

    if has_official:
        oa = official_args(shape["b"], shape["T"], shape["H"], shape["P"], shape["N"], shape["S"], device, torch.bfloat16)
        peer_check("official mamba3_siso_combined vs ours (bf16)", 5e-2,
                   lambda: nmax(OFFICIAL(**oa, chunk_size=L), ssd_triton(**official_as_ours(oa), chunk_size=L)[0]))
    if has_fla:
        m2 = make_inputs(**shape, device=device, dtype=torch.bfloat16, seed=2, mamba2=True)
        peer_check("fla chunk_simple_gla vs ours (Mamba-2 case, bf16)", 2e-2,
                   lambda: nmax(FLA(**fla_args(m2))[0], ssd_triton(**m2, chunk_size=L)[0]))
    return [(name, val, bound, bool(val <= bound)) for name, val, bound in rows]


VERDICTS = {0: "every check within its tolerance", 1: "fp32 outside its tolerance: nothing timed",
            3: "bf16 outside its tolerance (fp32 within): reported, the timings still run"}


def gate_verdict(rows):
    """The gate's exit status from its (check, value, bound, ok) rows: 1 if an fp32 check misses its bound (the
    kernel is wrong: nothing is timed), 3 if only bf16 checks miss theirs (reported; bf16 tolerances are a statement
    about rounding, so the timings still run), else 0."""
    missed = [name for name, _, _, ok in rows if not ok]
    return 1 if any(not n.startswith("bf16") for n in missed) else 3 if missed else 0


def time_all(timer, shapes, a, device, dtype, results, gate_rows, write):
    """Our kernel's timings (and the eager `ssd_chunked`'s) at every shape first, then the peers' agreement with ours,
    then the peers' timings, so a budget cut or SIGINT costs peers' numbers before ours. Appends one entry per shape
    to `results` and the peers' checks to `gate_rows`; write() after every row."""
    for sh in shapes:
        print(f"shape {sh['name']}: {sh}", flush=True)
        b, T, H, P, N, S, L = (sh[k] for k in ("b", "T", "H", "P", "N", "S", "L"))
        (f_fwd, f_bwd), (r_fwd, r_all) = ssd_flops(b, T, H, P, N, L), roofline_us(b, T, H, P, N, S, a.peak_tflops, a.peak_tbps)
        results.append(dict(shape=sh, rows=[], roofline_fwd_us=r_fwd, roofline_fwdbwd_us=r_all,
                            fwd_gflop=f_fwd / 1e9, bwd_gflop=f_bwd / 1e9))
        bench_shape(timer, sh, a, device, dtype, "ours", results[-1]["rows"], write)
    if not (callable(FLA) or callable(OFFICIAL) or any(sh.get("compile") for sh in shapes)):
        return
    gate_rows += peer_gate(device, a.cpu, callable(FLA), callable(OFFICIAL))
    write()
    for sh, res in zip(shapes, results):
        print(f"shape {sh['name']}: peers", flush=True)
        bench_shape(timer, sh, a, device, dtype, "peers", res["rows"], write)


# ---------------------------------------------------------------- one shape
def add_ratios(rows):
    "peer / ours time for every timed row: fla vs ours on the Mamba-2 case, the official vs ours with shared B/C."
    best = {r["candidate"]: r for r in rows if "fwd_ms" in r}
    for r in rows:
        name = r["candidate"]
        ref = best.get("ours (Mamba-2 case)" if "Mamba-2" in name else
                       "ours (shared B/C + bias)" if name.startswith("official") else "ours")
        if "fwd_ms" in r and ref:
            r["fwd_ratio_vs_ours"] = r["fwd_ms"] / ref["fwd_ms"]
            r["fwdbwd_ratio_vs_ours"] = r["fwdbwd_ms"] / ref["fwdbwd_ms"]


def bench_shape(timer, sh, a, device, dtype, group, rows, on_row):
    """Time the candidates of `group` at shape `sh`, appending to `rows` and calling on_row() after each (the caller
    rewrites its files). group "ours": our kernel's variants and the eager `ssd_chunked` (nothing to compile; they
    always start); "peers": the official kernel, fla, `ssd_chunked` under torch.compile (not started past DEADLINE)."""
    b, T, H, P, N, S, L = (sh[k] for k in ("b", "T", "H", "P", "N", "S", "L"))
    fla_ok, official_ok = callable(FLA), callable(OFFICIAL)
    f_fwd, f_bwd = ssd_flops(b, T, H, P, N, L)
    r_fwd, r_all = roofline_us(b, T, H, P, N, S, a.peak_tflops, a.peak_tbps)
    by_fwd, by_all = min_bytes(b, T, H, P, N, S)
    kw = make_inputs(b, T, H, P, N, S, device, dtype)
    m2 = make_inputs(b, T, H, P, N, S, device, dtype, mamba2=True)
    ours = lambda **k: ssd_triton(**k, chunk_size=L)[0]
    if group == "ours":   # priority order: what a budget cut leaves out comes last
        cands = {"ours": (ours, kw), "ours (shared B/C + bias)": (ours, shared_inputs(kw)),
                 "ours (default configs, not autotuned)": (ours, kw, {"MAMBA3_LITE_SSD_AUTOTUNE": "0"}),
                 "ours (Mamba-2 case)": (ours, m2) if fla_ok else None}
        for w in sh.get("sweep_warps", ()):   # launch-config sweep of our kernels (both fwd and bwd get `w` warps)
            cands[f"ours (num_warps={w})"] = (ours, kw, {"TRITON_PER_CHUNK_NUM_WARPS": str(w)})
        cands["ssd_chunked eager"] = (lambda **k: ssd_chunked(**k, chunk_size=L)[0], kw)
    else:
        cands = {"official mamba3_siso_combined": ((lambda **k: OFFICIAL(**k, chunk_size=L)),
                                                   official_args(b, T, H, P, N, S, device, dtype)) if official_ok else None,
                 "fla chunk_simple_gla (Mamba-2 case)": (lambda **k: FLA(**k)[0], fla_args(m2)) if fla_ok else None,
                 "ssd_chunked compiled": (lambda **k: COMPILED(**k, chunk_size=L)[0], kw) if sh.get("compile") else None}
    for name, c in cands.items():
        if c is None:
            continue
        fn, inputs, env = c if len(c) == 3 else (*c, {})
        row = dict(shape=sh["name"], candidate=name, b=b, T=T, H=H, P=P, N=N, S=S, L=L)
        if group == "peers" and time.perf_counter() > DEADLINE:
            row.update(error=f"not started: past --deadline-s {a.deadline_s:.0f} (time budget)")
            rows.append(row); on_row(); print(f"  {name:38s} {row['error']}"); continue
        saved_env = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            with torch.no_grad():
                ms_f, n_f = timer(lambda: fn(**inputs), a.reps, a.warmup, a.budget_s)
                mem_f = timer.peak_mb(lambda: fn(**inputs))
            grad_in = {k: (v.detach().requires_grad_(True) if torch.is_tensor(v) and v.is_floating_point() else v)
                       for k, v in inputs.items()}
            diff = [v for v in grad_in.values() if torch.is_tensor(v) and v.requires_grad]
            y0 = fn(**grad_in)
            dy = torch.randn_like(y0)
            del y0
            step = lambda: torch.autograd.grad(fn(**grad_in), diff, dy, allow_unused=True)
            ms_a, n_a = timer(step, a.reps, a.warmup, a.budget_s)
            mem_a = timer.peak_mb(step)
            row.update(fwd_ms=ms_f, fwd_reps=n_f, fwd_peak_mb=mem_f, fwdbwd_ms=ms_a, fwdbwd_reps=n_a, fwdbwd_peak_mb=mem_a,
                       fwd_tflops=f_fwd / (ms_f * 1e9), fwdbwd_tflops=(f_fwd + f_bwd) / (ms_a * 1e9),
                       fwd_gbps=by_fwd / (ms_f * 1e6), fwdbwd_gbps=by_all / (ms_a * 1e6),
                       fwd_pct_roofline=None if r_fwd is None else 100 * r_fwd / (1e3 * ms_f),
                       fwdbwd_pct_roofline=None if r_all is None else 100 * r_all / (1e3 * ms_a))
        except Exception as e:  # a peer failing (OOM, compile error) is a result, not a crash
            row.update(error=f"{type(e).__name__}: {e}"[:300])
        finally:
            for k, v in saved_env.items():
                if v is None: os.environ.pop(k, None)
                else: os.environ[k] = v
        rows.append(row)
        add_ratios(rows)
        on_row()
        print(f"  {name:38s} " + (f"fwd {row['fwd_ms']:9.3f} ms  fwd+bwd {row['fwdbwd_ms']:9.3f} ms"
                                    if "fwd_ms" in row else row["error"]), flush=True)


def markdown(meta, gate_rows, results):
    out = [f"# SSD kernel benchmark — {meta['date']} — {meta['device']}", "",
           f"torch {meta['torch']}, triton {meta['triton']}, dtype {meta['dtype']}, mode {meta['mode']}, "
           f"part {meta['part']}" + (" (stopped early: SIGINT)" if meta.get("interrupted") else ""), ""]
    if gate_rows:
        out += ["## Correctness (nmax = max |ours - ref| / max |ref|)", "", "| check | value | bound | ok |",
                "|---|---|---|---|"]
        out += [f"| {n} | {v:.2e} | {b:.0e} | {'yes' if ok else '**NO**'} |" for n, v, b, ok in gate_rows]
        out.append("")
    if results:
        out += ["## Timings (median ms; ratio = peer / ours, > 1 means ours is faster; fla is compared with ours on "
                "the same Mamba-2 case, the official kernel with ours on the same shared-B/C + bias interface)", "",
                "| shape | candidate | fwd ms | fwd TFLOP/s | fwd GB/s | fwd % roofline | fwd+bwd ms | fwd+bwd TFLOP/s "
                "| fwd+bwd GB/s | fwd+bwd % roofline | peak MiB fwd / fwd+bwd | ratio fwd | ratio fwd+bwd |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        f = lambda v, fmt: "—" if v is None else format(v, fmt)
        pct = lambda v: "—" if v is None else f"{v:.0f}%"
        for shape in results:
            for r in shape["rows"]:
                if "error" in r:
                    out.append(f"| {r['shape']} | {r['candidate']} | not run: {r['error'][:100]} |||||||||||")
                    continue
                out.append(f"| {r['shape']} | {r['candidate']} | {r['fwd_ms']:.3f} | {r['fwd_tflops']:.1f} | "
                           f"{r['fwd_gbps']:.0f} | {pct(r['fwd_pct_roofline'])} | {r['fwdbwd_ms']:.3f} | "
                           f"{r['fwdbwd_tflops']:.1f} | {r['fwdbwd_gbps']:.0f} | {pct(r['fwdbwd_pct_roofline'])} | "
                           f"{f(r['fwd_peak_mb'], '.0f')} / {f(r['fwdbwd_peak_mb'], '.0f')} | "
                           f"{f(r.get('fwd_ratio_vs_ours'), '.2f')} | {f(r.get('fwdbwd_ratio_vs_ours'), '.2f')} |")
        roof = (f"Roofline ({meta['gpu'] or meta['device']}): max(FLOPs / {meta['peak_tflops']:g} TFLOP/s, bytes / {meta['peak_tbps']:g} "
                f"TB/s{', datasheet' if meta['peaks_from'] == 'datasheet' else ', given'}) for the minimal interface "
                "(shared B/C, bf16)" if meta["peak_tflops"] is not None else
                f"No roofline: {meta['peaks_from']}")
        out += ["", roof + "; GB/s = those minimal bytes / time (the same count for every candidate, so a candidate "
                "that moves more bytes shows its waste as a lower number). TFLOP/s use the nominal SSD FLOP count for "
                "every candidate."]
    if meta["peers"]:
        out += ["", "Peers: " + "; ".join(meta["peers"])]
    return "\n".join(out) + "\n"


SHAPES = {"main": dict(b=16, T=2048, H=32, P=64, N=128, S=32, L=64),
          "L32": dict(b=16, T=2048, H=32, P=64, N=128, S=32, L=32),
          "L128": dict(b=16, T=2048, H=32, P=64, N=128, S=32, L=128),
          "T512": dict(b=64, T=512, H=32, P=64, N=128, S=32, L=64),
          "T8192": dict(b=4, T=8192, H=32, P=64, N=128, S=32, L=64)}


def main(argv=None):
    global FLA, OFFICIAL, COMPILED, DEADLINE
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="the main shape only, 20 reps, no torch.compile")
    p.add_argument("--cpu", action="store_true", help="Triton interpreter on CPU at tiny shapes (harness check)")
    p.add_argument("--part", default="all", choices=["gate", "time", "all"],
                   help="gate: correctness only; time: timings + peer agreement (run the gate first); all: both")
    p.add_argument("--shapes", default=None, help=f"comma-separated, of {','.join(SHAPES)} (default: all; smoke: main)")
    p.add_argument("--sweep-warps", default="4,16", help="extra num_warps timed for ours at the main shape ('' for none)")
    p.add_argument("--out", default=os.environ.get("OUT") or "bench/results", help="directory for JSON + markdown")
    p.add_argument("--reps", type=int, default=None, help="timed reps (default 100; smoke 20; cpu 2)")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--budget-s", type=float, default=8.0, help="stop a timing loop after this many seconds (reps are reported)")
    p.add_argument("--deadline-s", type=float, default=None,
                   help="after this many seconds, peers are skipped (ours always runs); default 400 full, 150 smoke")
    p.add_argument("--peer-configs", type=int, default=4,
                   help="autotune configs kept per peer kernel (0: all; the official kernel lists up to 81)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="dense bf16 peak for the roofline (default: the GPU's row in bench/gpu_model.py's GPUS)")
    p.add_argument("--peak-tbps", type=float, default=None, help="HBM bandwidth for the roofline (default: likewise)")
    p.add_argument("--no-compile", action="store_true", help="leave out ssd_chunked under torch.compile")
    a = p.parse_args(argv)
    shape_names = (a.shapes or ("main" if a.smoke else ",".join(SHAPES))).split(",")
    if bad := [n for n in shape_names if n not in SHAPES]:
        p.error(f"--shapes: unknown {bad}; expected names from {list(SHAPES)}")
    try:
        sweep = tuple(int(w) for w in a.sweep_warps.split(",") if w.strip())
    except ValueError:
        p.error(f"--sweep-warps: expected comma-separated integers, got {a.sweep_warps!r}")
    torch.set_flush_denormal(True)
    if a.cpu:
        torch.set_num_threads(1)
        device = torch.device("cpu")
    else:
        if not torch.cuda.is_available():
            p.error("no CUDA device: run with --cpu for the interpreter harness check")
        device = torch.device("cuda")
    a.reps = a.reps or (2 if a.cpu else 20 if a.smoke else 100)
    a.warmup = a.warmup if a.warmup is not None else (1 if a.cpu else 3 if a.smoke else 10)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    if a.cpu:
        dtype = torch.float32   # the interpreter's bf16 tl.dot is wrong
    peers, FLA, OFFICIAL = [], None, None
    if a.part != "gate":   # import (and on CPU only import) the peers: the load path is part of the harness
        for name, loader in (("fla", load_fla), ("official", load_official)):
            got = loader(a.peer_configs)
            if isinstance(got, str):
                peers.append(got)
                continue
            fn, note = got
            peers.append(f"{note} (imported; not run under --cpu)" if a.cpu else note)
            if not a.cpu:
                FLA, OFFICIAL = (fn, OFFICIAL) if name == "fla" else (FLA, fn)
    do_compile = not (a.smoke or a.cpu or a.no_compile) and a.part != "gate"
    COMPILED = torch.compile(ssd_chunked, dynamic=False) if do_compile else None
    if not do_compile and a.part != "gate":
        peers.append("ssd_chunked under torch.compile: not run (" + ("cpu" if a.cpu else "smoke" if a.smoke else "--no-compile") + ")")

    if a.cpu:
        shapes = [dict(name="cpu-tiny L16", b=1, T=64, H=2, P=16, N=32, S=4, L=16, sweep_warps=sweep[:1]),
                  dict(name="cpu-tiny L32", b=1, T=64, H=2, P=16, N=32, S=4, L=32)]
    else:
        shapes = [dict(name=f"{n} b{SHAPES[n]['b']} T{SHAPES[n]['T']} L{SHAPES[n]['L']}", **SHAPES[n],
                       compile=do_compile and n == "main", sweep_warps=sweep if n == "main" and not a.smoke else ())
                  for n in shape_names]

    import triton
    dev_name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU (Triton interpreter)"
    gpu, a.peak_tflops, a.peak_tbps, peaks_from = roofline_peaks(dev_name if device.type == "cuda" else None,
                                                                  a.peak_tflops, a.peak_tbps)
    meta = dict(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), device=dev_name,
                torch=torch.__version__, triton=triton.__version__, dtype=str(dtype).replace("torch.", ""),
                mode="cpu" if a.cpu else "smoke" if a.smoke else "full", part=a.part, reps=a.reps, warmup=a.warmup,
                gpu=gpu, peaks_from=peaks_from, peak_tflops=a.peak_tflops, peak_tbps=a.peak_tbps, peers=peers,
                tolerances=TOL)
    print(f"SSD kernel benchmark on {dev_name} ({meta['mode']}, part {a.part}); peers: {'; '.join(peers) or 'not loaded'}",
          flush=True)

    t0 = time.perf_counter()
    a.deadline_s = a.deadline_s if a.deadline_s is not None else (150.0 if a.smoke else 400.0)
    DEADLINE = t0 + a.deadline_s
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"ssd_kernel_{meta['mode']}_{a.part}"
    gate_rows, results, verdict = [], [], 0

    def write():
        "Rewrite the JSON and markdown with what has finished (after each gate precision and each timed row)."
        meta["wall_s"] = time.perf_counter() - t0
        stem.with_suffix(".json").write_text(json.dumps(dict(
            meta=meta, ok=verdict == 0 and (bool(gate_rows) or a.part == "time"), verdict=VERDICTS[verdict], gate=[dict(check=n, value=v, bound=b, ok=ok) for n, v, b, ok in gate_rows],
            results=results), indent=1))
        stem.with_suffix(".md").write_text(markdown(meta, gate_rows, results))

    try:
        if a.part in ("gate", "all"):
            def gate_written():
                nonlocal verdict
                verdict = gate_verdict(gate_rows)
                write()
            gate(device, a.cpu, gate_rows, gate_written)
        if a.part in ("time", "all") and verdict != 1:   # an fp32 miss (or an exception) stops the timings
            time_all(Timer(device), shapes, a, device, dtype, results, gate_rows, write)
    except KeyboardInterrupt:
        meta["interrupted"] = True
        write()
        print(f"interrupted after {time.perf_counter() - t0:.0f}s; wrote what finished to {stem}.json and .md", flush=True)
        return 130
    for n, v, b, ok in gate_rows:
        print(f"  gate {n:60s} {v:.2e} <= {b:.0e} {'ok' if ok else 'FAILED'}")
    write()
    print(stem.with_suffix(".md").read_text())
    print(f"wrote {stem}.json and .md ({meta['wall_s']:.1f}s)")
    if verdict:
        print(f"ssd_kernel.py: {VERDICTS[verdict]}" + ("; the timings ran" if verdict == 3 and a.part != "gate" else ""))
    return verdict


FLA = OFFICIAL = COMPILED = None
DEADLINE = float("inf")

if __name__ == "__main__":
    import sigint_once
    sigint_once.install()
    sys.exit(main())
