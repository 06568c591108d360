"""GPU benchmark: forward+backward training throughput (tokens/s) and MFU of the Mamba-3 LM.

Default: the ~434M preset "a100-400m" at micro-batch 16 x 2048 under bf16 autocast (fp32 master weights and
residual stream), whole-layer gradient checkpointing on (the production config's), PyTorch SSD. One timed step =
zero_grad + forward with the training loss (`lm_loss`: the chunked cross-entropy, no logits kept) + backward (no
optimizer step, so the number is the model's, not AdamW's).

    MFU = flops_per_token(seq_len) * tokens/s / peak
    flops_per_token = 6 * params + the SSD core's forward+backward (nbs/03_model.ipynb, `flops_per_token`); the
                      recompute of gradient checkpointing is not counted (model FLOPs, not hardware FLOPs)
    peak            = the dense bf16 tensor peak of the GPU's row in bench/gpu_model.py's GPUS (found by device
                      name); a GPU the table does not hold gets no MFU (one line says so) unless --peak-tflops

Before the model is built, bench/model_memory.py counts what the step needs (fake tensors, no GPU): a configuration
whose floor exceeds 90% of the GPU's memory (--memory-gib on CPU) is not run; one line says so with the numbers, and
its JSON line has status "skipped: does not fit". Variants, one per run:

    python bench/model_gpu.py                                   # 434M, 16x2048, bf16, checkpointing, pytorch SSD
    ENABLE_TRITON_KERNELS=1 python bench/model_gpu.py --ssd-dispatch triton
    python bench/model_gpu.py --no-grad-checkpoint             # runs where it fits (an H200), skipped on an 80 GB card
    python bench/model_gpu.py --preset a100-400m-mimo
    python bench/model_gpu.py --device cpu --preset tiny --batch 2 --seq-len 64 --steps 2 --warmup 1 --peak-tflops 1

--json PATH appends one JSON line with the configuration and the numbers, rewritten after every warm-up and timed
step (`status` says which phase it reached, `steps_done` how many timed steps its median covers), so a run stopped by
SIGINT (`timeout -s INT`, as bench/gpu_suite.sh does at a section's cap) or killed keeps its line.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from mamba3_lite.data import Batch
from mamba3_lite.evaluate import lm_loss
from mamba3_lite.files import atomic_write
from mamba3_lite.model import Mamba3Transformer, ModelConfig

from gpu_env import datasheet
from model_memory import fits, training_memory


def peak_tflops(device_name, given):
    """Dense bf16 peak (TFLOP/s) of the GPU called `device_name` (None: a CPU): --peak-tflops, else the GPU's datasheet
    row (bench/gpu_model.py); None (no MFU, one line says why) for a GPU the table does not hold, or a CPU."""
    if given is not None:
        return given
    if device_name is not None:
        _, row = datasheet(device_name, say=lambda line: print(f"model_gpu.py: {line}"))
        return None if row is None else row["tensor"] / 1e12
    print("model_gpu.py: no --peak-tflops on a CPU: no MFU reported")
    return None


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rates(times, a, fpt, peak, device):
    "ms/step (median of the timed steps reached), tokens/s, MFU and peak GiB."
    t = statistics.median(times)
    tokens_per_s = a.batch * a.seq_len / t
    mem = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return dict(ms_per_step=t * 1e3, tokens_per_s=tokens_per_s, flops_per_token=fpt, peak_tflops=peak,
                mfu=None if peak is None else fpt * tokens_per_s / (peak * 1e12), peak_mem_gib=mem)


def fits_or_skip(cfg, a, device, rec, save):
    """Count the step's memory floor (bench/model_memory.py) into `rec`; False, after one line and the JSON line
    marked "skipped: does not fit", when it exceeds 90% of the GPU's memory (or --memory-gib)."""
    need = training_memory(cfg, a.batch, a.seq_len, optimizer=False,
                           dtype=torch.bfloat16 if a.dtype == "bf16" else torch.float32)
    rec.update(params=need["params"], memory_floor_gib=need["floor"] / 2**30, memory_saved_gib=need["saved"] / 2**30)
    capacity = (a.memory_gib * 2**30 if a.memory_gib is not None else
                torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None)
    if capacity is None:
        return True
    ok, line = fits(need, capacity)
    print(f"model_gpu.py: {a.batch} x {a.seq_len}, grad_checkpoint={a.grad_checkpoint} {line}"
          + ("" if ok else ": not run"), flush=True)
    if not ok:
        rec.update(status="skipped: does not fit", note=line)
        save(rec)
    return ok


def jsonl_line(path):
    """save(rec): this run's line of the JSONL file at `path`, rewritten whole (atomically) at every call; the lines
    earlier runs appended stay. None: save does nothing."""
    if path is None:
        return lambda rec: None
    path = Path(path)
    before = path.read_text() if path.exists() else ""
    before += "" if not before or before.endswith("\n") else "\n"
    return lambda rec: atomic_write(path, lambda tmp: tmp.write_text(before + json.dumps(rec) + "\n"), sync_dir=False)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="a100-400m")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="autocast dtype (weights stay fp32)")
    p.add_argument("--grad-checkpoint", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--ssd-dispatch", choices=["pytorch", "triton"], default="pytorch")
    p.add_argument("--chunk-size", type=int, default=None, help="override the preset's chunk_size (tokens per SSD chunk)")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="cuda")
    p.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak for MFU (default: the GPU's datasheet row)")
    p.add_argument("--memory-gib", type=float, default=None,
                   help="memory the run may use (default: the GPU's; on CPU: no check unless given)")
    p.add_argument("--json", default=None, help="append a JSON line with the results to this file (kept up to date)")
    a = p.parse_args(argv)
    if a.steps < 1 or a.warmup < 0:
        p.error(f"--steps: expected >= 1 timed steps and --warmup >= 0, got {a.steps} and {a.warmup}")

    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device available (use --device cpu for a smoke run)")
    peak = peak_tflops(torch.cuda.get_device_name(device) if device.type == "cuda" else None, a.peak_tflops)
    torch.manual_seed(0)
    overrides = dict(grad_checkpoint=a.grad_checkpoint, ssd_dispatch=a.ssd_dispatch)
    if a.chunk_size is not None:
        overrides["chunk_size"] = a.chunk_size
    cfg = ModelConfig.from_preset(a.preset, **overrides)
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    fpt = cfg.flops_per_token(a.seq_len)
    rec = dict(bench="model_gpu", preset=a.preset, batch=a.batch, seq_len=a.seq_len, dtype=a.dtype,
               grad_checkpoint=a.grad_checkpoint, ssd_dispatch=a.ssd_dispatch, chunk_size=cfg.chunk_size,
               device=dev_name, flops_per_token=fpt, peak_tflops=peak, steps=a.steps, warmup_done=0, steps_done=0,
               status="memory count")
    save = jsonl_line(a.json)
    save(rec)
    times = []
    try:
        if not fits_or_skip(cfg, a, device, rec, save):
            return 0
        model = Mamba3Transformer(cfg).to(device).train()
        ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seq_len + 1), device=device)
        batch = Batch(ids[:, :-1], ids[:, 1:])
        amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.dtype == "bf16")

        def train_step():
            model.zero_grad(set_to_none=True)
            with amp:
                loss = lm_loss(model, batch)
            loss.backward()
            return loss

        rec["status"] = "warm-up"
        save(rec)
        for i in range(a.warmup):
            loss = train_step()
            sync(device)
            rec.update(warmup_done=i + 1)
            save(rec)
            print(f"warm-up {i + 1}/{a.warmup} loss {loss.item():.3f}", flush=True)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        rec["status"] = "timed steps"
        for i in range(a.steps):
            t0 = time.perf_counter()
            loss = train_step()
            sync(device)
            times.append(time.perf_counter() - t0)
            rec.update(steps_done=i + 1, loss=loss.item(), **rates(times, a, fpt, peak, device))
            save(rec)
            print(f"step {i + 1}/{a.steps} {times[-1] * 1e3:.1f} ms", flush=True)
    except KeyboardInterrupt:   # SIGINT (the suite's cap): the line keeps the steps reached and says where it stopped
        rec["status"] = f"interrupted (SIGINT) during {rec['status']}"
        save(rec)
        print(f"model_gpu.py: {rec['status']} after {rec['warmup_done']} warm-up and {len(times)} timed steps", flush=True)
        return 130
    except torch.OutOfMemoryError as e:   # a result for this configuration (one line), not a crash
        first = str(e).splitlines()[0][:200]
        print(f"model_gpu.py: out of memory at batch {a.batch} x {a.seq_len}, grad_checkpoint={a.grad_checkpoint}: {first}")
        rec.update(status="out of memory", error=f"out of memory: {first}")
        save(rec)
        return 1
    rec["status"] = "ok"
    save(rec)
    mem = rec.get("peak_mem_gib")
    print(f"{a.preset}: {model.num_parameters():,} params, {fpt / 1e9:.3f} GFLOP/token (6 x params + the SSD core, "
          f"forward + backward), device {dev_name}, peak {'unknown' if peak is None else f'{peak:g} TFLOP/s'}")
    print(f"{'batch x seq':>12} {'dtype':>6} {'ckpt':>5} {'ssd':>8} {'ms/step':>9} {'tokens/s':>11} {'MFU':>7} "
          f"{'peak GiB':>9} {'loss':>7}")
    print(f"{f'{a.batch}x{a.seq_len}':>12} {a.dtype:>6} {str(a.grad_checkpoint):>5} {a.ssd_dispatch:>8} "
          f"{rec.get('ms_per_step', float('nan')):>9.1f} {rec.get('tokens_per_s', float('nan')):>11,.0f} "
          f"{'-' if rec.get('mfu') is None else format(rec['mfu'], '.1%'):>7} {'-' if mem is None else f'{mem:.1f}':>9} "
          f"{loss.item():>7.3f}")
    return 0


if __name__ == "__main__":
    import sigint_once
    sigint_once.install()
    sys.exit(main())
