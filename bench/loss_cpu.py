"""CPU benchmark of the chunked LM loss's two choices: the operand layout of its V-wide products, and the chunk size.

- `layout`: the two V-wide products of one chunk, each in both layouts, on the same operands: the logits
  H_chunk W^T against a transposed view of W (V, d) and against a row-major (d, V) copy of W^T; the weight gradient
  as dL/dW += G^T H_chunk (a transposed view of G) and as dL/dW^T += H_chunk^T G (what `chunked_lm_loss` runs).
- `chunks`: `chunked_lm_loss` forward + backward of the quickstart batch (16 x 128 tokens, the GPT-2 vocabulary,
  d = 64) at several chunk sizes, its default (the 32 MiB rule) among them; with `--baseline REV`, also the loss as
  it was at git revision REV (bench/baseline.py) at the default chunk, in the same rounds.

Interleaved rounds (each variant once per round, in turn), process CPU time, medians with [min-max]; one thread
unless --threads. Writes bench/results/loss_cpu_<UTC date>.json (or --out).

    python bench/loss_cpu.py [--chunks 32,64,166,512] [--rounds 7] [--threads 1] [--baseline REV] [--out FILE]
"""
import argparse
import datetime
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

import baseline
from cpu_env import cpu_machine
from mamba3_lite.loss import chunked_lm_loss, loss_chunk_tokens


def interleaved(fns: dict, rounds: int) -> dict:
    "Process CPU seconds per call of each function, one call of each per round, after one untimed call each."
    for f in fns.values():
        f()
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            t0 = time.process_time()
            f()
            times[k].append(time.process_time() - t0)
    return {k: {"median": statistics.median(v), "min": min(v), "max": max(v)} for k, v in times.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=16 * 128, help="tokens per batch (default: 2,048, the quickstart's)")
    p.add_argument("--d", type=int, default=64, help="hidden size (default: 64, the tiny preset's)")
    p.add_argument("--vocab", type=int, default=50257, help="vocabulary size (default: GPT-2's)")
    p.add_argument("--chunks", default=f"32,64,{loss_chunk_tokens(50257)},512", help="chunk sizes in tokens")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--baseline", default=None, metavar="REV", help="also the loss at git revision REV, default chunk")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.set_flush_denormal(True)
    g = torch.Generator().manual_seed(0)
    n, d, V, c = a.tokens, a.d, a.vocab, loss_chunk_tokens(a.vocab)
    h = torch.randn(n, d, generator=g)
    w = 0.02 * torch.randn(V, d, generator=g)
    targets = torch.randint(0, V, (n,), generator=g)

    hc, wt, G = h[:c].clone(), w.T.contiguous(), torch.randn(c, V, generator=g) / (c * V)
    z, gw, gwt = torch.empty(c, V), torch.zeros(V, d), torch.zeros(d, V)
    layout = interleaved({
        "logits, W^T as a view of W": lambda: torch.mm(hc, w.T, out=z),
        "logits, W^T row-major": lambda: torch.mm(hc, wt, out=z),
        "dW += G^T H (view of G)": lambda: gw.addmm_(G.T, hc),
        "dW^T += H^T G": lambda: gwt.addmm_(hc.T, G),
    }, a.rounds)

    hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
    def loss_step(chunk, fn=chunked_lm_loss):
        loss = fn(hh, ww, targets, chunk_tokens=chunk)
        torch.autograd.grad(loss, (hh, ww))
    chunks = [int(x) for x in a.chunks.split(",")]
    variants = {ch: (lambda ch=ch: loss_step(ch)) for ch in chunks}
    with tempfile.TemporaryDirectory() as tmp:
        if a.baseline:
            old = baseline.module(baseline.extract(a.baseline, tmp), "loss").chunked_lm_loss
            variants[f"{c}@{a.baseline}"] = lambda: loss_step(c, old)
        sweep = interleaved(variants, a.rounds)

    med = lambda r, k: r[k]["median"]
    ratios = {"logits: view / row-major": med(layout, "logits, W^T as a view of W") / med(layout, "logits, W^T row-major"),
              "weight gradient: G^T H / H^T G": med(layout, "dW += G^T H (view of G)") / med(layout, "dW^T += H^T G")}
    ratios.update({f"loss chunk {ch} / chunk {c}": med(sweep, ch) / med(sweep, c) for ch in chunks if ch != c})
    if a.baseline:
        ratios[f"loss chunk {c}: this tree / {a.baseline}"] = med(sweep, c) / med(sweep, f"{c}@{a.baseline}")
    print(f"chunked LM loss on CPU: {n} tokens, d = {d}, V = {V:,}, {a.threads} thread(s), {a.rounds} interleaved rounds")
    print(f"{'one chunk of ' + str(c) + ' tokens':<36}{'CPU ms [range]':>24}")
    for k, r in layout.items():
        print(f"{k:<36}{r['median'] * 1e3:>10.2f} [{r['min'] * 1e3:.2f}-{r['max'] * 1e3:.2f}]")
    print(f"{'loss forward + backward, chunk':<36}{'CPU ms [range]':>24}")
    for ch, r in sweep.items():
        print(f"{str(ch) + (' (default)' if ch == c else ''):<36}{r['median'] * 1e3:>10.1f} [{r['min'] * 1e3:.1f}-{r['max'] * 1e3:.1f}]")
    for k, v in ratios.items():
        print(f"{k:<36}{v:6.2f}")
    now = datetime.datetime.now(datetime.timezone.utc)
    result = {"date": now.isoformat(timespec="seconds"), "machine": cpu_machine(), "tokens": n, "d": d, "vocab": V,
              "threads": a.threads, "rounds": a.rounds, "default_chunk": c, "baseline": a.baseline,
              "layout_cpu_s": layout, "chunks_cpu_s": {str(k): v for k, v in sweep.items()}, "ratios": ratios}
    out = Path(a.out or f"bench/results/loss_cpu_{now.date().isoformat()}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"-> {out}")


if __name__ == "__main__":
    main()
