"""Training-step throughput and MFU of the ~434M preset on one GPU: bf16 autocast, AdamW, micro-batch 16 x 2048 (the
production geometry of configs/pretrain_a100_400m.yaml), eager first and then under torch.compile.

Each timed step is `mamba3_lite.train.train_step` (forward, loss, backward, clip, fused AdamW) on random
tokens. MFU = tokens/s x flops_per_token(seq_len) / the GPU's bf16 dense peak (mamba3_lite.logger table);
flops_per_token counts 6 x params + the SSD core, not the recompute of gradient checkpointing.

The modes run one after the other on the same model and optimizer, eager first: the eager step needs no compile,
so its row exists before Inductor starts on 28 layers. --out DIR/train_gpu.json is rewritten after every step
(warm-up steps included), one row per mode, so a run stopped by SIGINT (`timeout -s INT`, as bench/gpu_suite.sh
does at a section's cap) or killed keeps every row and step it reached; the row being measured says where it was cut.

    ENABLE_TRITON_KERNELS=1 python bench/train_gpu.py                     # eager, then compile (default mode)
    python bench/train_gpu.py --modes compiled --grad-checkpoint --compile-mode max-autotune --steps 20
    python bench/train_gpu.py --smoke --cpu                               # harness check without a GPU (tiny, fp32, eager)
Target: >= 100k tokens/s on one H200 (~35% MFU). bench/gpu_suite.sh runs it with --out DIR.
"""
import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from mamba3_lite.files import atomic_write
from mamba3_lite.logger import peak_flops_for
from mamba3_lite.model import Mamba3Transformer, ModelConfig
from mamba3_lite.config import LoopConfig, apply_triton_opt_in
from mamba3_lite.data import Batch
from mamba3_lite.optim import build_optimizer
from mamba3_lite.train import train_step

MODES = ("eager", "compiled")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="a100-400m", help="model preset (default: a100-400m, ~434M)")
    p.add_argument("--batch", type=int, default=16, help="micro-batch size (default: 16)")
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per sequence (default: 2048)")
    p.add_argument("--accum", type=int, default=1, help="micro-steps per optimizer step (default: 1)")
    p.add_argument("--steps", type=int, default=10, help="timed optimizer steps per mode (default: 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first in each mode, compile included (default: 3)")
    p.add_argument("--modes", default=None,
                   help="comma-separated, in order, of eager,compiled (default: eager,compiled; --cpu: eager)")
    p.add_argument("--compile-mode", default="default",
                   help="torch.compile mode: default, reduce-overhead, max-autotune (default: default)")
    p.add_argument("--no-compile", action="store_true", help="eager only (same as --modes eager)")
    p.add_argument("--grad-checkpoint", action="store_true", help="recompute each layer in backward (the production config's setting)")
    p.add_argument("--ssd-dispatch", default="triton", choices=["triton", "pytorch"],
                   help="SSD path (default: triton; needs ENABLE_TRITON_KERNELS=1, else pytorch with a warn line)")
    p.add_argument("--smoke", action="store_true", help="quick rerun: 3 timed steps after 2 warmup steps per mode")
    p.add_argument("--cpu", action="store_true", help="harness check on CPU: tiny preset, 2 x 64, fp32, pytorch SSD, eager")
    p.add_argument("--out", metavar="DIR", help="also write DIR/train_gpu.json with the numbers")
    a = p.parse_args(argv)
    a.modes = [m for m in (a.modes or ("eager" if a.no_compile or a.cpu else "eager,compiled")).split(",") if m]
    if not a.modes or any(m not in MODES for m in a.modes):
        p.error(f"--modes: expected names from {list(MODES)}, got {a.modes}")
    if a.no_compile and "compiled" in a.modes:
        p.error("--no-compile: contradicts --modes compiled")
    if a.smoke:
        a.steps, a.warmup = 3, 2
    if a.cpu:
        a.preset, a.batch, a.seq_len, a.ssd_dispatch = "tiny", 2, 64, "pytorch"
    return a


def measure(mode, step_fn, batches, a, row, save, sync, cuda):
    """Warm-up then timed steps of one mode, filling `row` and calling save() after every step. A step is timed
    alone (synchronised before and after), so the steps reached before a cut are a measurement of their own."""
    row["status"] = "warm-up" + (f" (torch.compile mode {a.compile_mode} compiles in the first step)" if mode == "compiled" else "")
    print(f"{mode}: {row['status']}, {a.warmup} steps", flush=True)
    t0 = time.perf_counter()
    for i in range(a.warmup):
        step_fn(batches())
        sync()
        row.update(warmup_steps_done=i + 1, warmup_s=time.perf_counter() - t0)
        save()
    print(f"{mode}: warm-up done in {row['warmup_s']:.1f}s; timing {a.steps} steps", flush=True)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    row.update(status="timed steps", step_s=[], losses=[])
    for i in range(a.steps):
        b = batches()
        sync()
        t0 = time.perf_counter()
        loss = step_fn(b)
        sync()
        row["step_s"].append(time.perf_counter() - t0)
        row["losses"].append(loss)
        row.update(steps_done=i + 1, **rates(a, row["step_s"], cuda))
        save()
        print(f"{mode}: step {i + 1}/{a.steps} {1000 * row['step_s'][-1]:.1f} ms, loss {loss:.3f}", flush=True)
    row["status"] = "ok" if all(math.isfinite(x) for x in row["losses"]) else "non-finite loss"
    save()


def rates(a, step_s, cuda):
    "tokens/s, ms/step (mean over the timed steps reached), MFU and peak GiB for the row."
    tps = a.accum * a.batch * a.seq_len * len(step_s) / sum(step_s)
    mfu = tps * a.flops_per_token / a.peak if a.peak else float("nan")
    return dict(tokens_per_s=tps, ms_per_step=1000 * sum(step_s) / len(step_s), mfu=mfu,
                peak_mem_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"))


def main(argv=None):
    a = parse_args(argv)
    if not a.cpu and not torch.cuda.is_available():
        print("bench/train_gpu.py: no CUDA device; this benchmark needs a GPU (or --cpu for a harness check)", file=sys.stderr)
        return 2
    dev = torch.device("cpu" if a.cpu else "cuda")
    cuda = dev.type == "cuda"
    amp = None if a.cpu else torch.bfloat16
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    torch.backends.cuda.matmul.allow_tf32 = True
    if a.cpu:
        torch.set_flush_denormal(True)
    torch.manual_seed(0)
    over = apply_triton_opt_in({"ssd_dispatch": a.ssd_dispatch})
    cfg = ModelConfig.from_preset(a.preset, grad_checkpoint=a.grad_checkpoint, **over)
    raw = Mamba3Transformer(cfg).to(dev)
    opt = build_optimizer(raw, LoopConfig(lr=3e-4))
    g = torch.Generator(device=dev).manual_seed(0)
    name = torch.cuda.get_device_name(dev) if cuda else "CPU"
    a.peak = peak_flops_for(name) if cuda else 0.0
    a.flops_per_token = cfg.flops_per_token(a.seq_len)
    meta = {"device": name, "preset": a.preset, "params": raw.num_parameters(), "batch": a.batch, "seq_len": a.seq_len,
            "accum": a.accum, "grad_checkpoint": a.grad_checkpoint, "ssd_dispatch": cfg.ssd_dispatch,
            "dtype": "fp32" if amp is None else "bf16", "steps": a.steps, "warmup": a.warmup, "modes": a.modes,
            "flops_per_token": a.flops_per_token, "peak_flops": a.peak}
    rec = {"meta": meta, "rows": [], "interrupted": None}
    path = Path(a.out) / "train_gpu.json" if a.out else None
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)

    def save():
        if path:
            atomic_write(path, lambda tmp: tmp.write_text(json.dumps(rec, indent=1, allow_nan=True)), sync_dir=False)

    def batches():
        w = torch.randint(0, cfg.vocab_size, (a.accum, a.batch, a.seq_len + 1), device=dev, generator=g)
        return [Batch(w[i, :, :-1], w[i, :, 1:]) for i in range(a.accum)]

    print(f"{name} | preset {a.preset} ({raw.num_parameters() / 1e6:.1f}M) | {meta['dtype']} | modes {','.join(a.modes)} "
          f"(compile mode {a.compile_mode}) | grad_checkpoint={a.grad_checkpoint} | ssd_dispatch={cfg.ssd_dispatch} | "
          f"micro-batch {a.batch} x {a.seq_len} x accum {a.accum}", flush=True)
    rc = 0
    for mode in a.modes:
        model = raw if mode == "eager" else torch.compile(raw, mode=a.compile_mode)
        row = {"mode": mode, "compile": a.compile_mode if mode == "compiled" else None, "warmup_steps_done": 0,
               "warmup_s": 0.0, "steps_done": 0}
        rec["rows"].append(row)
        save()
        step_fn = lambda b: train_step(model, opt, b, max_grad_norm=1.0, autocast_dtype=amp).loss
        try:
            measure(mode, step_fn, batches, a, row, save, sync, cuda)
        except KeyboardInterrupt:   # SIGINT (the suite's cap): keep every row and step reached, say where it stopped
            rec["interrupted"] = row["status"] = f"interrupted (SIGINT) during {mode} {row['status'].split(' (')[0]}"
            save()
            print(f"bench/train_gpu.py: {row['status']}; kept {len(rec['rows'])} row(s) in {path}", flush=True)
            return 130
        except torch.OutOfMemoryError as e:   # one line for this mode, not a traceback; the next mode still runs
            row["status"] = f"out of memory: {str(e).splitlines()[0][:200]}"
            print(f"bench/train_gpu.py: {mode}: out of memory at micro-batch {a.batch} x {a.seq_len} "
                  f"(grad_checkpoint={a.grad_checkpoint})", file=sys.stderr)
            save()
            rc = 1
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.empty_cache()
        rc = rc or (row["status"] != "ok")
    print(f"{'mode':>10}{'tokens/s':>12}{'ms/step':>10}{'MFU':>8}{'peak GiB':>10}{'warmup s':>10}{'loss':>8}  status")
    for r in rec["rows"]:
        if r.get("steps_done"):
            print(f"{r['mode']:>10}{r['tokens_per_s']:>12,.0f}{r['ms_per_step']:>10.1f}{r['mfu']:>8.1%}"
                  f"{r['peak_mem_gib']:>10.1f}{r['warmup_s']:>10.1f}{r['losses'][-1]:>8.3f}  {r['status']}")
        else:
            print(f"{r['mode']:>10}  {r['status']}")
    if cuda:
        best = max((r["tokens_per_s"] for r in rec["rows"] if r["status"] == "ok"), default=0.0)
        print(f"target >= 100,000 tokens/s: {'met' if best >= 100_000 else 'NOT met'}")
    return int(bool(rc))


if __name__ == "__main__":
    import sigint_once
    sigint_once.install()
    sys.exit(main())
