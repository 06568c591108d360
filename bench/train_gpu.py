"""Training-step throughput and MFU of the production config on one GPU: configs/pretrain_a100_400m.yaml (the ~434M
preset, micro-batch 16 x 2048, gradient accumulation 2, gradient checkpointing, Triton SSD, bf16 autocast, AdamW) as
`mamba3-lite train` runs it, eager first and then under torch.compile in the config's compile mode.

Each timed step is `mamba3_lite.train.train_step` (forward, loss, backward over the config's micro-batches, clip,
fused AdamW) on random tokens, with the model, optimizer, clipping and compile mode the config gives
(`build_model_config`, `build_optimizer`, `compile_mode_for`: TORCH_COMPILE_MODE overrides the mode, as in training).
MFU = tokens/s x flops_per_token(seq_len) / the dense bf16 peak of the GPU's row in bench/gpu_model.py's GPUS (by
device name; a GPU the table does not hold gets no MFU, one line says so); flops_per_token counts 6 x params + the SSD
core, not the recompute of gradient checkpointing. Before the model is built, bench/model_memory.py counts the step's
memory floor (weights, gradients, AdamW, saved tensors; fake tensors, no GPU); a configuration whose floor exceeds 90%
of the GPU is not run (one line says so).

The modes run one after the other on the same model and optimizer, eager first: the eager step needs no compile,
so its row exists before Inductor starts on 28 layers. --out DIR/train_gpu.json is rewritten after every step
(warm-up steps included), one row per mode, so a run stopped by SIGINT (`timeout -s INT`, as bench/gpu_suite.sh
does at a section's cap) or killed keeps every row and step it reached; the row being measured says where it was cut.

    ENABLE_TRITON_KERNELS=1 python bench/train_gpu.py                 # the production config: eager, then compiled
    python bench/train_gpu.py --modes compiled --compile-mode max-autotune --steps 20
    python bench/train_gpu.py --no-grad-checkpoint --accum 1           # runs where it fits (an H200), not on 80 GB
    python bench/train_gpu.py --smoke --cpu                           # harness check without a GPU (tiny, fp32, eager)
Target: >= 100k tokens/s on one H100 / H200 (~35% MFU). bench/gpu_suite.sh runs it with --smoke --out DIR.
"""
import argparse
import json
import math
import sys
import time
import traceback
from pathlib import Path

import torch

from mamba3_lite.config import apply_overrides, build_model_config, compile_mode_for, load_config
from mamba3_lite.data import Batch
from mamba3_lite.files import atomic_write
from mamba3_lite.model import Mamba3Transformer
from mamba3_lite.optim import build_optimizer
from mamba3_lite.train import train_step

from gpu_env import datasheet
from model_memory import fits, training_memory

PRODUCTION = Path(__file__).resolve().parents[1] / "configs" / "pretrain_a100_400m.yaml"   # this checkout's
MODES = ("eager", "compiled")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(PRODUCTION),
                   help="training config, a path or a packaged name (default: this checkout's configs/pretrain_a100_400m.yaml)")
    p.add_argument("--preset", default=None, help="model preset (default: the config's)")
    p.add_argument("--batch", type=int, default=None, help="micro-batch size (default: the config's)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default: the config's)")
    p.add_argument("--accum", type=int, default=None, help="micro-steps per optimizer step (default: the config's)")
    p.add_argument("--grad-checkpoint", action=argparse.BooleanOptionalAction, default=None,
                   help="recompute each layer in backward (default: the config's)")
    p.add_argument("--ssd-dispatch", default=None, choices=["triton", "pytorch"],
                   help="SSD path (default: the config's; triton needs ENABLE_TRITON_KERNELS=1, else pytorch with a warn line)")
    p.add_argument("--steps", type=int, default=10, help="timed optimizer steps per mode (default: 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first in each mode, compile included (default: 3)")
    p.add_argument("--modes", default=None,
                   help="comma-separated, in order, of eager,compiled (default: eager,compiled; --cpu: eager)")
    p.add_argument("--compile-mode", default=None,
                   help="torch.compile mode (default: TORCH_COMPILE_MODE, else the config's training.compile_mode)")
    p.add_argument("--no-compile", action="store_true", help="eager only (same as --modes eager)")
    p.add_argument("--smoke", action="store_true", help="quick rerun: 3 timed steps after 2 warmup steps per mode")
    p.add_argument("--cpu", action="store_true",
                   help="harness check on CPU: the config with the tiny preset, 2 x 64, accumulation 1, fp32, pytorch SSD, eager")
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
        a.preset, a.batch, a.seq_len, a.accum, a.ssd_dispatch = "tiny", 2, 64, 1, "pytorch"
    return a


def run_config(a):
    """The training config the benchmark runs: --config with the command line's overrides applied and checked, and
    the compile mode training would use on the device (TORCH_COMPILE_MODE, else training.compile_mode; --compile-mode
    wins)."""
    over = {f"model.{k}": v for k, v in (("preset", a.preset), ("grad_checkpoint", a.grad_checkpoint),
                                          ("ssd_dispatch", a.ssd_dispatch)) if v is not None}
    over.update({k: v for k, v in (("training.micro_batch_size", a.batch), ("data.max_seq_len", a.seq_len),
                                   ("training.gradient_accumulation_steps", a.accum)) if v is not None})
    cfg = apply_overrides(load_config(a.config), over)
    return cfg, a.compile_mode or compile_mode_for(cfg.training, "cpu" if a.cpu else "cuda")


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
    "tokens/s, ms/step (mean over the timed steps reached), MFU (None without a peak) and peak GiB (None on CPU)."
    tps = a.accum * a.batch * a.seq_len * len(step_s) / sum(step_s)
    return dict(tokens_per_s=tps, ms_per_step=1000 * sum(step_s) / len(step_s),
                mfu=tps * a.flops_per_token / a.peak if a.peak else None,
                peak_mem_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else None)


def main(argv=None):
    a = parse_args(argv)
    if not a.cpu and not torch.cuda.is_available():
        print("bench/train_gpu.py: no CUDA device; this benchmark needs a GPU (or --cpu for a harness check)", file=sys.stderr)
        return 2
    cfg, a.compile_mode = run_config(a)
    t = cfg.training
    a.batch, a.seq_len, a.accum = t.micro_batch_size, cfg.data.max_seq_len, t.gradient_accumulation_steps
    dev = torch.device("cpu" if a.cpu else "cuda")
    cuda = dev.type == "cuda"
    amp = None if a.cpu or t.precision == "fp32" else torch.bfloat16
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    torch.backends.cuda.matmul.allow_tf32 = True
    if a.cpu:
        torch.set_flush_denormal(True)
    torch.manual_seed(0)
    model_cfg = build_model_config(cfg)
    name = torch.cuda.get_device_name(dev) if cuda else "CPU"
    gpu, row = datasheet(name, say=lambda line: print(f"bench/train_gpu.py: {line}")) if cuda else (None, None)
    a.peak = row["tensor"] if row else None
    a.flops_per_token = model_cfg.flops_per_token(a.seq_len)
    meta = {"device": name, "gpu": gpu, "config": a.config, "preset": cfg.model.get("preset"),
            "batch": a.batch, "seq_len": a.seq_len, "accum": a.accum, "grad_checkpoint": model_cfg.grad_checkpoint,
            "ssd_dispatch": model_cfg.ssd_dispatch, "compile_mode": a.compile_mode,
            "dtype": "fp32" if amp is None else "bf16", "steps": a.steps, "warmup": a.warmup, "modes": a.modes,
            "flops_per_token": a.flops_per_token, "peak_flops": a.peak}
    rec = {"meta": meta, "rows": [], "interrupted": None}
    path = Path(a.out) / "train_gpu.json" if a.out else None
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)

    def save():
        if path:
            atomic_write(path, lambda tmp: tmp.write_text(json.dumps(rec, indent=1)), sync_dir=False)

    try:
        need = training_memory(model_cfg, a.batch, a.seq_len, optimizer=True, dtype=amp or torch.float32)
    except KeyboardInterrupt:
        rec["interrupted"] = "interrupted (SIGINT) during the memory count"
        save()
        print(f"bench/train_gpu.py: {rec['interrupted']}", flush=True)
        return 130
    meta.update(params=need["params"], memory_floor_gib=need["floor"] / 2**30, memory_saved_gib=need["saved"] / 2**30)
    save()
    if cuda:
        ok, line = fits(need, torch.cuda.get_device_properties(dev).total_memory)
        print(f"bench/train_gpu.py: micro-batch {a.batch} x {a.seq_len}, grad_checkpoint={model_cfg.grad_checkpoint} "
              f"{line}{'' if ok else ': not run'}", flush=True)
        if not ok:
            meta["skipped"] = f"does not fit: {line}"
            save()
            return 0
    raw = Mamba3Transformer(model_cfg).to(dev)
    opt = build_optimizer(raw, t)
    g = torch.Generator(device=dev).manual_seed(0)

    def batches():
        w = torch.randint(0, model_cfg.vocab_size, (a.accum, a.batch, a.seq_len + 1), device=dev, generator=g)
        return [Batch(w[i, :, :-1], w[i, :, 1:]) for i in range(a.accum)]

    print(f"{name} | {a.config}: preset {meta['preset']} ({need['params'] / 1e6:.1f}M) | {meta['dtype']} | modes "
          f"{','.join(a.modes)} (compile mode {a.compile_mode}) | grad_checkpoint={model_cfg.grad_checkpoint} | "
          f"ssd_dispatch={model_cfg.ssd_dispatch} | micro-batch {a.batch} x {a.seq_len} x accum {a.accum} | "
          f"{a.flops_per_token / 1e9:.3f} GFLOP/token (6 x params + the SSD core) | peak "
          f"{'unknown: no MFU' if a.peak is None else f'{a.peak / 1e12:g} TFLOP/s ({gpu} datasheet)'} | memory floor "
          f"{need['floor'] / 2**30:.1f} GiB", flush=True)
    rc = 0
    for mode in a.modes:
        model = raw if mode == "eager" else torch.compile(raw, mode=a.compile_mode)
        row = {"mode": mode, "compile": a.compile_mode if mode == "compiled" else None, "warmup_steps_done": 0,
               "warmup_s": 0.0, "steps_done": 0}
        rec["rows"].append(row)
        save()
        step_fn = lambda b: train_step(model, opt, b, max_grad_norm=t.max_grad_norm, autocast_dtype=amp).loss
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
                  f"(grad_checkpoint={model_cfg.grad_checkpoint})", file=sys.stderr)
            save()
            rc = 1
        except Exception as e:   # a compile or kernel failure is this mode's result (traceback printed); the next runs
            traceback.print_exc()
            row["status"] = f"error: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"
            save()
            rc = 1
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.empty_cache()
        rc = rc or (row["status"] != "ok")
    f = lambda v, spec: "-" if v is None else format(v, spec)
    print(f"{'mode':>10}{'tokens/s':>12}{'ms/step':>10}{'MFU':>8}{'peak GiB':>10}{'warmup s':>10}{'loss':>8}  status")
    for r in rec["rows"]:
        if r.get("steps_done"):
            print(f"{r['mode']:>10}{r['tokens_per_s']:>12,.0f}{r['ms_per_step']:>10.1f}{f(r['mfu'], '.1%'):>8}"
                  f"{f(r['peak_mem_gib'], '.1f'):>10}{r['warmup_s']:>10.1f}{r['losses'][-1]:>8.3f}  {r['status']}")
        else:
            print(f"{r['mode']:>10}  {r['status']}")
    done = {r["mode"]: r["tokens_per_s"] for r in rec["rows"] if r["status"] == "ok"}
    if len(done) == 2:
        rec["compiled_over_eager"] = done["compiled"] / done["eager"]
        save()
        print(f"compiled ({a.compile_mode}) / eager tokens/s: {rec['compiled_over_eager']:.2f}")
    if cuda:
        best = max(done.values(), default=0.0)
        print(f"target >= 100,000 tokens/s: {'met' if best >= 100_000 else 'NOT met'}")
    return int(bool(rc))


if __name__ == "__main__":
    import sigint_once
    sigint_once.install()
    sys.exit(main())
