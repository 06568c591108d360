"""CPU training step of the tiny Mamba-3 preset against a same-size GPT, with the full-logits and the chunked loss.

Every variant (model x loss x threads) lives in its own worker process, built and warmed up once; the driver then
runs interleaved rounds (each worker in turn, `--steps` steps per round), so a load change on a shared machine hits
every variant alike. Each worker's peak RSS (`ru_maxrss`) is that variant's alone. Variants:

- `step/full`: forward, cross-entropy of the materialised (b, T, V) logits, backward, clip, AdamW;
- `step/chunked`: the same with `chunked_lm_loss` (what `mamba3-lite train` runs);
- `backbone`: the same without the head and the loss (mean of the squared final hidden states): the sequence mixer's
  share of the step;
- `step/compiled` (Mamba only, with `--compile`): `step/chunked` through `torch.compile(model)` in the mode CPU
  training uses (`default`), as `training.compile_on_cpu: true` runs it; its first step is the compile.

The GPT is plain PyTorch (`scaled_dot_product_attention`, GELU MLP, learned positions, tied head), its depth chosen
so that its parameter count is the closest to the Mamba model's; both see the same tokens, fp32, the same AdamW.
Times are process CPU seconds per step (wall seconds beside them): medians over rounds, [min-max].

- `mamba3@REV` (with `--baseline REV`): the Mamba model, its optimizer and the chunked loss as they were at git
  revision REV (bench/baseline.py), its `step/chunked` and `backbone` rows beside this tree's, for a change measured
  before and after in one run.

    python bench/train_cpu.py [--batch 16] [--seq-len 128] [--rounds 7] [--steps 2] [--threads 1,2] [--compile]
                              [--baseline REV] [--out FILE]
"""
import argparse
import datetime
import json
import math
import multiprocessing as mp
import os
import resource
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

import baseline
from cpu_env import cpu_machine
from mamba3_lite.config import LoopConfig, physical_cores
from mamba3_lite.loss import chunked_lm_loss, full_lm_loss
from mamba3_lite.model import Mamba3Transformer, ModelConfig
from mamba3_lite.optim import build_optimizer
from mamba3_lite.train import keep_freed_memory_in_heap


class GPTBlock(nn.Module):
    "Pre-norm causal self-attention + GELU MLP (4x)."
    def __init__(self, d: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):  # (b, T, d)
        b, T, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, T, 3, self.n_heads, d // self.n_heads).unbind(2)  # (b, T, h, hd)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, T, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    "A GPT-2-style LM with tied embeddings and learned positions."
    def __init__(self, vocab_size: int, d: int, n_layers: int, n_heads: int, max_len: int):
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab_size, d), nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(GPTBlock(d, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d)

    def hidden(self, ids):
        x = self.embed(ids) + self.pos(torch.arange(ids.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return self.ln_f(x)

    def param_groups(self, weight_decay):
        return [{"params": [p for p in self.parameters() if p.ndim >= 2], "weight_decay": weight_decay},
                {"params": [p for p in self.parameters() if p.ndim < 2], "weight_decay": 0.0}]


def n_params(m):
    return sum(p.numel() for p in m.parameters())


def build(model_name: str, preset: str, seq_len: int, base_dir=None):
    "(model, hidden(ids) -> (b, T, d), head weight (V, d)); `mamba3@REV`: the package at REV (bench/baseline.py)."
    torch.manual_seed(0)
    if model_name.startswith("mamba3@"):
        m = baseline.module(base_dir, "model")
        old = m.Mamba3Transformer(m.ModelConfig.from_preset(preset, ssd_dispatch="pytorch", grad_checkpoint=False))
        return old, lambda ids: old._backbone(ids)[0], old.embed.weight
    mamba = Mamba3Transformer(ModelConfig.from_preset(preset, ssd_dispatch="pytorch", grad_checkpoint=False))
    if model_name == "mamba3":
        return mamba, lambda ids: mamba._backbone(ids)[0], mamba.embed.weight
    cfg, target = mamba.config, n_params(mamba)
    heads = max(1, cfg.d_model // 16)
    depth = min(range(1, 65), key=lambda L: abs(n_params(GPT(cfg.vocab_size, cfg.d_model, L, heads, seq_len)) - target))
    gpt = GPT(cfg.vocab_size, cfg.d_model, depth, heads, seq_len)
    return gpt, gpt.hidden, gpt.embed.weight


LOSSES = {
    "step/full": lambda h, w, y: full_lm_loss(F.linear(h, w), y),
    "step/chunked": chunked_lm_loss,
    "backbone": lambda h, w, y: h.square().mean(),
}


def worker(conn, model_name, variant, threads, a):
    "Build one variant, warm it up, then time `a.steps` steps per 'run' message; 'stop' returns the peak RSS."
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    keep_freed_memory_in_heap()   # as the CPU trainer does
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    model, hidden, weight = build(model_name, a.preset, a.seq_len, a.base_dir)
    make_opt, losses = build_optimizer, LOSSES
    if model_name.startswith("mamba3@"):   # the optimizer and the chunked loss at REV too
        make_opt = baseline.module(a.base_dir, "optim").build_optimizer
        losses = {**LOSSES, "step/chunked": baseline.module(a.base_dir, "loss").chunked_lm_loss}
    opt = make_opt(model, LoopConfig(lr=1e-3, weight_decay=0.1))
    g = torch.Generator().manual_seed(0)
    data = [torch.randint(0, weight.shape[0], (a.batch, a.seq_len + 1), generator=g) for _ in range(4)]
    i = 0
    if variant == "step/compiled":
        compiled = torch.compile(model, mode="default")
        loss_of = lambda x, y: compiled(x, targets=y, return_logits=False).loss
    else:
        loss_of = lambda x, y: losses[variant](hidden(x), weight, y)

    def step():
        nonlocal i
        w = data[i % len(data)]; i += 1
        loss = loss_of(w[:, :-1], w[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        assert math.isfinite(loss.item())

    c0 = time.process_time()
    step()
    first = time.process_time() - c0
    for _ in range(a.warmup - 1):
        step()
    conn.send({"params": n_params(model), "rss_import_kib": rss0, "first_step_cpu_s": first})
    try:
        while conn.recv() == "run":
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(a.steps):
                step()
            conn.send(((time.process_time() - c0) / a.steps, (time.perf_counter() - w0) / a.steps))
        conn.send(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    except EOFError:   # the driver is gone
        pass


def med(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny", help="Mamba-3 model preset (default: tiny)")
    p.add_argument("--batch", type=int, default=16, help="sequences per step (default: 16, the quickstart's)")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per sequence (default: 128, the quickstart's)")
    p.add_argument("--rounds", type=int, default=7, help="interleaved timed rounds (default: 7)")
    p.add_argument("--steps", type=int, default=2, help="steps per variant per round (default: 2)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per variant first (default: 2)")
    p.add_argument("--threads", default="1", help="comma-separated torch thread counts, each a set of variants (default: 1)")
    p.add_argument("--variants", default=",".join(LOSSES), help=f"subset of {','.join(LOSSES)}")
    p.add_argument("--models", default="mamba3,gpt", help="subset of mamba3,gpt (the ratios need both)")
    p.add_argument("--compile", action="store_true", help="add the compiled Mamba step at the first thread count")
    p.add_argument("--out", default=None, help="results JSON (default: bench/results/train_cpu_<UTC date>.json, or ..._<date>T<HHMM>.json beside an earlier run that day)")
    p.add_argument("--baseline", default=None, metavar="REV",
                   help="add the Mamba model as it was at git revision REV (its step/chunked and backbone rows)")
    a = p.parse_args(argv)
    a.base_dir = None
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # so that `finally` stops the workers
    threads = [int(t) for t in a.threads.split(",")]
    variants = a.variants.split(",")
    load0 = os.getloadavg()
    ctx = mp.get_context("spawn")
    workers = {}
    tmp = tempfile.TemporaryDirectory() if a.baseline else None
    if tmp:
        a.base_dir = str(baseline.extract(a.baseline, tmp.name))
    try:
        return run(a, ctx, workers, threads, variants, load0)
    finally:
        for proc, _, _ in workers.values():
            proc.terminate()
        if tmp: tmp.cleanup()


def run(a, ctx, workers, threads, variants, load0):
    for t in threads:
        for m in a.models.split(","):
            for v in variants:
                here, there = ctx.Pipe()
                proc = ctx.Process(target=worker, args=(there, m, v, t, a), daemon=True)
                proc.start()
                workers[(m, v, t)] = (proc, here, here.recv())   # built and warmed up one at a time
    for v in [v for v in ("step/chunked", "backbone") if v in variants] if a.baseline else []:
        here, there = ctx.Pipe()
        proc = ctx.Process(target=worker, args=(there, f"mamba3@{a.baseline}", v, threads[0], a), daemon=True)
        proc.start()
        workers[(f"mamba3@{a.baseline}", v, threads[0])] = (proc, here, here.recv())
    if a.compile:
        here, there = ctx.Pipe()
        proc = ctx.Process(target=worker, args=(there, "mamba3", "step/compiled", threads[0], a), daemon=True)
        proc.start()
        workers[("mamba3", "step/compiled", threads[0])] = (proc, here, here.recv())
    times = {k: ([], []) for k in workers}
    for _ in range(a.rounds):
        for k, (_, conn, _) in workers.items():
            conn.send("run")
            cpu, wall = conn.recv()
            times[k][0].append(cpu); times[k][1].append(wall)
    rows = []
    for k, (proc, conn, info) in workers.items():
        conn.send("stop")
        rss = conn.recv()
        proc.join()
        m, v, t = k
        rows.append({"model": m, "variant": v, "threads": t, "params": info["params"], "cpu_s_per_step": med(times[k][0]),
                     "wall_s_per_step": med(times[k][1]), "peak_rss_mib": rss / 1024,
                     "first_step_cpu_s": info["first_step_cpu_s"],
                     "rss_after_import_mib": info["rss_import_kib"] / 1024})
    load1 = os.getloadavg()
    cores = physical_cores()
    by = {(r["model"], r["variant"], r["threads"]): r for r in rows}
    cpu = lambda m, v, t: by[(m, v, t)]["cpu_s_per_step"]["median"]
    wall = lambda m, v, t: by[(m, v, t)]["wall_s_per_step"]["median"]
    ratios = {}
    models = a.models.split(",")
    for t in threads:
        for v in variants if len(models) == 2 else []:
            ratios[f"mamba3/gpt {v} cpu, {t} thread(s)"] = cpu("mamba3", v, t) / cpu("gpt", v, t)
        if {"step/full", "step/chunked"} <= set(variants):
            for m in models:
                ratios[f"{m} chunked/full cpu, {t} thread(s)"] = cpu(m, "step/chunked", t) / cpu(m, "step/full", t)
                ratios[f"{m} chunked/full peak RSS, {t} thread(s)"] = (by[(m, "step/chunked", t)]["peak_rss_mib"]
                                                                      / by[(m, "step/full", t)]["peak_rss_mib"])
    for t in threads[1:]:
        for m in models:
            for v in variants:
                ratios[f"{m} {v} wall, {t}/{threads[0]} threads"] = wall(m, v, t) / wall(m, v, threads[0])
    for v in [v for v in ("step/chunked", "backbone") if v in variants] if a.baseline else []:
        t = threads[0]
        ratios[f"mamba3/mamba3@{a.baseline} {v} cpu, {t} thread(s)"] = cpu("mamba3", v, t) / cpu(f"mamba3@{a.baseline}", v, t)
        if "gpt" in models:
            ratios[f"mamba3@{a.baseline}/gpt {v} cpu, {t} thread(s)"] = cpu(f"mamba3@{a.baseline}", v, t) / cpu("gpt", v, t)
    if a.compile:
        t = threads[0]
        eager, comp = cpu("mamba3", "step/chunked", t), cpu("mamba3", "step/compiled", t)
        cost = by[("mamba3", "step/compiled", t)]["first_step_cpu_s"] - comp
        ratios[f"mamba3 compiled/eager cpu, {t} thread(s)"] = comp / eager
        ratios["mamba3 compile cost, CPU s (first step - steady step)"] = cost
        ratios["mamba3 compile break-even, steps"] = cost / (eager - comp) if eager > comp else float("inf")
    machine = {**cpu_machine(), "load_average_1min_start": load0[0], "load_average_1min_end": load1[0],
               "shared": max(load0[0], load1[0]) > cores}
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "machine": machine,
              "baseline": a.baseline, "batch": a.batch, "seq_len": a.seq_len, "rounds": a.rounds, "steps_per_round": a.steps,
              "rows": rows, "ratios": ratios}
    print(f"CPU training step, preset {a.preset}, batch {a.batch} x seq {a.seq_len}, fp32, {a.rounds} interleaved "
          f"rounds x {a.steps} steps; {cores} physical cores, load average {load0[0]:.1f} -> {load1[0]:.1f}"
          f"{' (shared machine)' if machine['shared'] else ''}")
    print(f"{'model':<16}{'variant':<14}{'thr':>4}{'params':>11}{'CPU s/step [range]':>26}{'wall s/step':>13}{'peak RSS MiB':>14}")
    for r in rows:
        c, w = r["cpu_s_per_step"], r["wall_s_per_step"]
        print(f"{r['model']:<16}{r['variant']:<14}{r['threads']:>4}{r['params']:>11,}"
              f"{c['median']:>10.3f} [{c['min']:.3f}-{c['max']:.3f}]{w['median']:>13.3f}{r['peak_rss_mib']:>14,.0f}")
    for k, v in ratios.items():
        print(f"{k:<46}{v:6.2f}")
    now = datetime.datetime.now(datetime.timezone.utc)
    out = Path(a.out or f"bench/results/train_cpu_{now.date().isoformat()}.json")
    if not a.out and out.exists():   # a second run that day: beside the first, not over it
        out = out.with_name(f"train_cpu_{now.date().isoformat()}T{now:%H%M}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"-> {out}")


if __name__ == "__main__":
    main()
