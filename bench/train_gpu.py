"""Training-step throughput and MFU of the ~434M preset on one GPU: bf16 autocast, torch.compile, AdamW,
micro-batch 16 x 2048 (the production geometry of configs/pretrain_a100_400m.yaml).

Each timed step is `mamba3_lite.train.train_step` (forward, loss, backward, clip, fused AdamW) on random
tokens. MFU = tokens/s x flops_per_token(seq_len) / the GPU's bf16 dense peak (mamba3_lite.logger table);
flops_per_token counts 6 x params + the SSD core, not the recompute of gradient checkpointing.

    ENABLE_TRITON_KERNELS=1 python bench/train_gpu.py                     # compile (default mode), no recompute
    python bench/train_gpu.py --grad-checkpoint --compile-mode max-autotune --steps 20
    python bench/train_gpu.py --smoke --cpu                               # harness check without a GPU (tiny, fp32)
Target: >= 100k tokens/s on one H200 (~35% MFU). bench/gpu_suite.sh runs it with --out DIR.
"""
import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from mamba3_lite.logger import peak_flops_for
from mamba3_lite.model import Mamba3Transformer, ModelConfig
from mamba3_lite.config import LoopConfig, apply_triton_opt_in
from mamba3_lite.train import build_optimizer, train_step


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="a100-400m", help="model preset (default: a100-400m, ~434M)")
    p.add_argument("--batch", type=int, default=16, help="micro-batch size (default: 16)")
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per sequence (default: 2048)")
    p.add_argument("--accum", type=int, default=1, help="micro-steps per optimizer step (default: 1)")
    p.add_argument("--steps", type=int, default=10, help="timed optimizer steps (default: 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first, compile included (default: 3)")
    p.add_argument("--compile-mode", default="default",
                   help="torch.compile mode: default, reduce-overhead, max-autotune (default: default)")
    p.add_argument("--no-compile", action="store_true", help="run eagerly")
    p.add_argument("--grad-checkpoint", action="store_true", help="recompute each layer in backward (the production config's setting)")
    p.add_argument("--ssd-dispatch", default="triton", choices=["triton", "pytorch"],
                   help="SSD path (default: triton; needs ENABLE_TRITON_KERNELS=1, else pytorch with a warn line)")
    p.add_argument("--smoke", action="store_true", help="quick rerun: 3 timed steps after 2 warmup steps")
    p.add_argument("--cpu", action="store_true", help="harness check on CPU: tiny preset, 2 x 64, fp32, no compile, pytorch SSD")
    p.add_argument("--out", metavar="DIR", help="also write DIR/train_gpu.json with the numbers")
    a = p.parse_args(argv)
    if a.smoke:
        a.steps, a.warmup = 3, 2
    if a.cpu:
        a.preset, a.batch, a.seq_len, a.no_compile, a.ssd_dispatch = "tiny", 2, 64, True, "pytorch"
    elif not torch.cuda.is_available():
        print("bench/train_gpu.py: no CUDA device; this benchmark needs a GPU (or --cpu for a harness check)", file=sys.stderr)
        return 2
    dev = torch.device("cpu" if a.cpu else "cuda")
    amp = None if a.cpu else torch.bfloat16
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(0)
    over = apply_triton_opt_in({"ssd_dispatch": a.ssd_dispatch})
    cfg = ModelConfig.from_preset(a.preset, grad_checkpoint=a.grad_checkpoint, **over)
    raw = Mamba3Transformer(cfg).to(dev)
    opt = build_optimizer(raw, LoopConfig(lr=3e-4))
    model = raw if a.no_compile else torch.compile(raw, mode=a.compile_mode)
    g = torch.Generator(device=dev).manual_seed(0)

    def batches():
        w = torch.randint(0, cfg.vocab_size, (a.accum, a.batch, a.seq_len + 1), device=dev, generator=g)
        return [(w[i, :, :-1], w[i, :, 1:]) for i in range(a.accum)]

    print(f"warm-up: {a.warmup} steps" + ("" if a.no_compile else f" (torch.compile mode {a.compile_mode} compiles in the first)"),
          flush=True)
    try:
        t_compile = time.perf_counter()
        for _ in range(a.warmup):
            train_step(model, opt, batches(), max_grad_norm=1.0, autocast_dtype=amp)
        sync()
        t_compile = time.perf_counter() - t_compile
        print(f"warm-up done in {t_compile:.1f}s; timing {a.steps} steps", flush=True)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        data = [batches() for _ in range(a.steps)]
        sync()
        t0 = time.perf_counter()
        losses = [train_step(model, opt, b, max_grad_norm=1.0, autocast_dtype=amp).loss for b in data]
        sync()
        dt = time.perf_counter() - t0
    except torch.OutOfMemoryError as e:   # one line for this configuration, not a traceback
        print(f"bench/train_gpu.py: out of memory at micro-batch {a.batch} x {a.seq_len} "
              f"(grad_checkpoint={a.grad_checkpoint}): {str(e).splitlines()[0][:200]}", file=sys.stderr)
        return 1
    assert all(math.isfinite(x) for x in losses), losses
    tokens = a.steps * a.accum * a.batch * a.seq_len
    tps = tokens / dt
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    peak = peak_flops_for(name) if dev.type == "cuda" else 0.0
    mem = torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else float("nan")
    fpt = cfg.flops_per_token(a.seq_len)
    mfu = tps * fpt / peak if peak else float("nan")
    print(f"{name} | preset {a.preset} ({raw.num_parameters() / 1e6:.1f}M) | {'fp32' if amp is None else 'bf16'} | "
          f"compile={'off' if a.no_compile else a.compile_mode} | grad_checkpoint={a.grad_checkpoint} | "
          f"ssd_dispatch={cfg.ssd_dispatch} | micro-batch {a.batch} x {a.seq_len} x accum {a.accum}")
    print(f"{'tokens/s':>12}{'ms/step':>10}{'MFU':>8}{'peak GiB':>10}{'warmup s':>10}{'loss':>8}")
    print(f"{tps:>12,.0f}{1000 * dt / a.steps:>10.1f}{mfu:>8.1%}{mem:>10.1f}"
          f"{t_compile:>10.1f}{losses[-1]:>8.3f}")
    if not a.cpu:
        print(f"target >= 100,000 tokens/s: {'met' if tps >= 100_000 else 'NOT met'}")
    if a.out:
        rec = {"device": name, "preset": a.preset, "params": raw.num_parameters(), "batch": a.batch, "seq_len": a.seq_len,
               "accum": a.accum, "compile": None if a.no_compile else a.compile_mode, "grad_checkpoint": a.grad_checkpoint,
               "ssd_dispatch": cfg.ssd_dispatch, "tokens_per_s": tps, "ms_per_step": 1000 * dt / a.steps, "mfu": mfu,
               "peak_mem_gib": mem, "warmup_s": t_compile, "flops_per_token": fpt, "losses": losses}
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "train_gpu.json").write_text(json.dumps(rec, indent=1, allow_nan=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
