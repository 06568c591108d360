"""Language-model ablation on CPU: the tiny preset with each Mamba-3 switch flipped (rotation, discretization, B/C
bias), trained on the same tokens from the same seed, validation loss side by side with the direction of the paper's
440M ablation (https://arxiv.org/abs/2603.15569: validation perplexity full 15.72; λ = ½ 15.76; Euler 15.81; no B/C
bias 16.49; no bias and no trapezoid 16.68).

    OMP_NUM_THREADS=1 python bench/lm_ablation.py [--steps 250] [--seeds 0,1] [--variants default,...]

The corpus is the quickstart's: this Python's standard-library sources, GPT-2 BPE, prepared by `prepare_corpus`
(capped at --max-tokens). To fit a CPU budget the vocabulary is compacted to the ids that occur in the prepared
tokens (the same map for every variant), so the tied embedding and head are that size instead of 50,257 rows; the
mixer, MLP and layer count are the tiny preset's. Writes `bench/results/lm_ablation_<UTC date>.json`."""
import argparse
import datetime
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mamba3_lite.data import PretrainDataset
from mamba3_lite.model import Mamba3Transformer, ModelConfig
from mamba3_lite.prepare import prepare_corpus, stdlib_corpus_files

VARIANTS = {"default": {}, "rotation=none": dict(rotation="none"), "rotation=fixed": dict(rotation="fixed"),
            "discretization=half": dict(discretization="half"), "discretization=euler": dict(discretization="euler"),
            "bc_bias=False": dict(bc_bias=False),
            "bc_bias=False+euler": dict(bc_bias=False, discretization="euler"),
            "bc_norm=False": dict(bc_norm=False)}
PAPER_PPL = {"default": 15.72, "discretization=half": 15.76, "discretization=euler": 15.81, "bc_bias=False": 16.49,
             "bc_bias=False+euler": 16.68}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", default="default,rotation=none,rotation=fixed,discretization=half,"
                                         "discretization=euler,bc_bias=False,bc_bias=False+euler")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--steps", type=int, default=250)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--max-tokens", type=int, default=600_000, help="train tokens prepared from the stdlib")
    p.add_argument("--val-windows", type=int, default=96)
    p.add_argument("--data-dir", default=None, help="prepared corpus to reuse, or where to prepare it (default: a temporary dir)")
    p.add_argument("--prepare-only", action="store_true", help="prepare --data-dir and stop")
    p.add_argument("--merge", nargs="+", default=None, metavar="JSON", help="combine earlier JSON files into --out")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    a.variants = a.variants.split(",")
    for v in a.variants:
        if v not in VARIANTS: p.error(f"--variants: unknown variant {v!r}; expected some of {list(VARIANTS)}")
    a.seeds = [int(s) for s in a.seeds.split(",")]
    return a


def corpus(tmp: Path, a):
    "Train / val windows (as compact ids) and the compact vocabulary size; prepares the corpus unless tmp holds it."
    if not (tmp / "train").is_dir():
        prepare_corpus(stdlib_corpus_files(), tmp, shard_size_tokens=1 << 22, val_tokens=1 << 15,
                       max_tokens=a.max_tokens + (1 << 15), workers=1, progress=False)
    sets = {s: PretrainDataset(tmp, a.seq_len, 50257, split=s) for s in ("train", "val")}
    win = {s: torch.stack([torch.cat([ds[i][0], ds[i][1][-1:]]) for i in range(len(ds))]) for s, ds in sets.items()}
    ids = torch.unique(torch.cat([w.flatten() for w in win.values()]))
    remap = torch.full((50257,), -1, dtype=torch.long); remap[ids] = torch.arange(len(ids))
    return {s: remap[w] for s, w in win.items()}, len(ids)


def run(variant: str, seed: int, win: dict, vocab: int, a) -> dict:
    torch.manual_seed(seed)
    cfg = ModelConfig.from_preset("tiny", vocab_size=vocab, **VARIANTS[variant])
    model = Mamba3Transformer(cfg).train()
    opt = torch.optim.AdamW(model.param_groups(0.1), lr=a.lr, betas=(0.9, 0.95))
    warm = 20
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) * (
        0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, max(0, s - warm) / max(1, a.steps - warm))))))
    order = torch.randperm(len(win["train"]), generator=torch.Generator().manual_seed(1234))   # same tokens for all
    cpu0 = time.process_time()
    for step in range(a.steps):
        idx = order[(step * a.batch_size + torch.arange(a.batch_size)) % len(order)]
        w = win["train"][idx]
        loss = model(w[:, :-1], targets=w[:, 1:]).loss
        opt.zero_grad(set_to_none=True); loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step(); sched.step()
    model.eval()
    with torch.no_grad():
        val = win["val"][:a.val_windows]
        losses = [model(v[:, :-1], targets=v[:, 1:]).loss.item() for v in val.split(32)]   # equal-size batches
    return dict(variant=variant, seed=seed, val_loss=float(np.mean(losses)), train_loss_last=loss.item(),
                n_params=model.num_parameters(), cpu_s=time.process_time() - cpu0)


def write(out: Path, date: str, a, vocab: int, runs: list, cpu_s: float) -> dict:
    "Mean and spread (max - min over seeds) of the validation loss per variant; the JSON with every run."
    summary = {}
    for v in a.variants:
        xs = [q["val_loss"] for q in runs if q["variant"] == v]
        if xs: summary[v] = dict(mean=float(np.mean(xs)), spread=float(max(xs) - min(xs)), n=len(xs))
    settings = {k: v for k, v in vars(a).items() if k not in ("out", "merge", "prepare_only", "data_dir")}
    out.write_text(json.dumps(dict(date=date, settings=settings, vocab=vocab,
                                   train_tokens_seen=a.steps * a.batch_size * a.seq_len, runs=runs, summary=summary,
                                   paper_val_ppl_440m=PAPER_PPL, cpu_s=cpu_s, threads=1), indent=1))
    return summary


def main(argv=None):
    a = parse_args(argv)
    torch.set_flush_denormal(True); torch.set_num_threads(1)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    out = Path(a.out or Path(__file__).parent / "results" / f"lm_ablation_{date}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    cpu0, merging = time.process_time(), bool(a.merge)
    if merging:
        parts = [json.loads(Path(f).read_text()) for f in a.merge]
        runs, vocab = [r for p in parts for r in p["runs"]], parts[0]["vocab"]
        a = argparse.Namespace(**{**parts[0]["settings"], "variants": [v for v in VARIANTS if any(r["variant"] == v for r in runs)]})
        cpu0 -= sum(p["cpu_s"] for p in parts)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            win, vocab = corpus(Path(a.data_dir or tmp), a)
        print(f"{len(win['train'])} train windows, {len(win['val'])} val windows of {a.seq_len} tokens; vocab {vocab}")
        if a.prepare_only: return
        runs = []
    for seed in ([] if merging else a.seeds):   # seed-major: a cut run has every variant of seed 0
        for variant in a.variants:
            r = run(variant, seed, win, vocab, a); runs.append(r)
            print(f"{variant:22s} seed {seed}  val loss {r['val_loss']:.4f}  ({r['cpu_s']:.0f} cpu-s)", flush=True)
            write(out, date, a, vocab, runs, time.process_time() - cpu0)
    summary = write(out, date, a, vocab, runs, time.process_time() - cpu0)
    print("\n| variant | val loss (mean of seeds) | spread (max-min) | paper 440M val ppl |\n|---|---|---|---|")
    for v, s in summary.items():
        print(f"| {v} | {s['mean']:.4f} | {s['spread']:.4f} | {PAPER_PPL.get(v, '')} |")
    print(f"CPU time {time.process_time() - cpu0:.0f} s; wrote {out}")


if __name__ == "__main__":
    main()
