"""Does restarting the SSM state at every EOS pay off? The quickstart config with and without `data.reset_at_eos`.

Two runs of the `tiny_cpu` config on the Python standard library corpus (the quickstart's data), the same seed,
the same initialisation, the same batches and the same number of steps; only `data.reset_at_eos` differs. Each
model is then evaluated the way it was trained (with / without `seq_idx`) on the same validation windows, and the
script prints, side by side:

- the validation loss on the first 64 tokens of each document (targets whose offset inside their document is < 64),
- the validation loss over all targets,
- training tokens/s of each run, and an interleaved forward+backward timing of one model with and without
  `seq_idx` on the same batches (the cost of the restart itself, less noisy than whole runs).

    python bench/doc_reset_cpu.py [--data data/stdlib] [--steps 150] [--eval-windows 512] [--threads 1]
    python bench/doc_reset_cpu.py --throughput-only [--device cuda] [--smoke]     # the GPU suite's section

`--data` is a prepared corpus; if it does not exist, the stdlib sources are prepared there first (as
`mamba3-lite quickstart` does). `--throughput-only` skips the training runs and times forward+backward with and
without `seq_idx` on random tokens with an EOS every 256 tokens on average (no corpus needed), and `--json PATH`
writes that row (first with `status` "timing", then the numbers; "interrupted" on SIGINT); `--cpu` is
`--device cpu`, for the GPU suite's interpreter harness check.
"""
import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from mamba3_lite.config import apply_overrides, build_model_config, load_config
from mamba3_lite.optim import build_optimizer, build_scheduler
from mamba3_lite.data import Batch, PretrainDataset
from mamba3_lite.prepare import prepare_corpus, stdlib_corpus_files
from mamba3_lite.distributed import setup_distributed
from mamba3_lite.model import Mamba3Transformer
from mamba3_lite.ssd import seq_idx_from_eos
from mamba3_lite.evaluate import lm_loss
from mamba3_lite.streams import make_streams
from mamba3_lite.files import atomic_write
from mamba3_lite.train import keep_freed_memory_in_heap, seed_everything, train_step

HEAD = 64  # "the first 64 tokens of each document"


def train(cfg, env, steps: int):
    "Train the config's model for `steps` steps; returns (model, tokens/s over the training steps)."
    seed_everything(cfg.training.seed)
    mcfg = build_model_config(cfg, log=lambda s: None)
    model = Mamba3Transformer(mcfg).to(env.device)
    opt = build_optimizer(model, cfg.training)
    sched = build_scheduler(opt, cfg.training)
    stream, _ = make_streams(cfg, env, mcfg.vocab_size, log=lambda s: None)
    t = cfg.training
    tokens, busy = 0, 0.0
    for step in range(steps):
        batches = [stream.next_batch() for _ in range(t.gradient_accumulation_steps)]
        t0 = time.perf_counter()
        r = train_step(model, opt, batches, scheduler=sched, max_grad_norm=t.max_grad_norm)
        if env.device.type == "cuda": torch.cuda.synchronize()
        busy += time.perf_counter() - t0
        tokens += sum(b[0].numel() for b in batches)
        if step % 25 == 0 or step == steps - 1:
            print(f"  step {step + 1:>4}/{steps} loss {r.loss:.3f}", flush=True)
    return model, tokens / busy


def doc_offsets(x: torch.Tensor, y: torch.Tensor, eos_id: int) -> np.ndarray:
    "Offset inside its document of every target y (b, L) of consecutive windows 0..b-1 (the stream from window 0 on)."
    stream = np.concatenate([x.flatten().numpy(), y[-1, -1:].numpy()])            # tokens 0 .. b*L
    pos = np.arange(stream.size)
    starts = np.where(np.concatenate([[True], stream[:-1] == eos_id]), pos, 0)   # a document starts after each EOS
    offset = pos - np.maximum.accumulate(starts)
    return offset[1:].reshape(y.shape)                                           # target j of window i is token i*L + j + 1


@torch.no_grad()
def per_token_nll(model, x, y, seq_idx, batch: int, device) -> torch.Tensor:
    "Cross-entropy of every target (b, L), evaluated `batch` windows at a time."
    model.eval()
    out = []
    for i in range(0, x.shape[0], batch):
        xb, yb = x[i:i + batch].to(device), y[i:i + batch].to(device)
        sb = None if seq_idx is None else seq_idx[i:i + batch].to(device)
        logits = model(xb, seq_idx=sb).logits.float()
        out.append(torch.nn.functional.cross_entropy(logits.transpose(1, 2), yb, reduction="none").cpu())
    return torch.cat(out)


def fwd_bwd_rate(model, x, y, seq_idx, device, reps: int) -> tuple:
    "Tokens/s of forward+backward with and without seq_idx, interleaved on the same batch."
    model.train()
    x, y, seq_idx = x.to(device), y.to(device), seq_idx.to(device)
    times = {False: 0.0, True: 0.0}
    for rep in range(reps + 1):
        for with_docs in (False, True):
            t0 = time.perf_counter()
            lm_loss(model, Batch(x, y, seq_idx if with_docs else None)).backward()
            if device.type == "cuda": torch.cuda.synchronize()
            if rep: times[with_docs] += time.perf_counter() - t0                # rep 0 is the warm-up
    model.zero_grad(set_to_none=True)
    return x.numel() * reps / times[False], x.numel() * reps / times[True]


def throughput_only(a):
    "The restart's cost alone: the tiny_cpu model, forward+backward with and without seq_idx, random tokens."
    env = setup_distributed(a.device)
    cfg = load_config("tiny_cpu")
    seed_everything(0)
    model = Mamba3Transformer(build_model_config(cfg, log=lambda s: None)).to(env.device)
    b, L = (16, cfg.data.max_seq_len) if env.device.type == "cpu" else (64, 2048)
    g = torch.Generator().manual_seed(0)
    w = torch.randint(0, model.config.vocab_size - 1, (b, L + 1), generator=g)
    w[torch.rand(b, L + 1, generator=g) < 1 / 256] = model.config.vocab_size - 1          # the EOS id
    x, y = w[:, :-1], w[:, 1:]
    sid = seq_idx_from_eos(x, model.config.vocab_size - 1)
    rec = dict(bench="doc_reset", device=a.device, batch=b, seq_len=L, doc_pieces=int(sid[:, -1].sum() + b),
               reps=2 if a.smoke else 10, status="timing")
    save = (lambda: atomic_write(Path(a.json), lambda t: t.write_text(json.dumps(rec, indent=1)), sync_dir=False)) \
        if a.json else (lambda: None)
    save()
    try:
        print(f"timing fwd+bwd with and without seq_idx, {rec['reps']} interleaved reps", flush=True)
        off, on = fwd_bwd_rate(model, x, y, sid, env.device, reps=rec["reps"])
    except KeyboardInterrupt:   # SIGINT (the GPU suite's cap): the JSON says the timing did not finish
        rec["status"] = "interrupted (SIGINT) during timing"
        save()
        raise
    rec.update(status="ok", tokens_per_s_without_seq_idx=off, tokens_per_s_with_seq_idx=on, time_ratio_with=off / on)
    save()
    print(f"tiny model, batch {b} x {L}, {rec['doc_pieces']} document pieces, {a.device}: fwd+bwd tokens/s "
          f"{off:,.0f} without seq_idx, {on:,.0f} with; time x{off / on:.3f} with seq_idx")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="data/stdlib")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--eval-windows", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--throughput-only", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="fewer repetitions")
    ap.add_argument("--cpu", action="store_true", help="same as --device cpu")
    ap.add_argument("--json", default=None, help="--throughput-only: also write the numbers to this JSON file")
    a = ap.parse_args()
    if a.cpu: a.device = "cpu"
    torch.set_num_threads(a.threads)
    torch.set_flush_denormal(True)
    if a.device == "cpu": keep_freed_memory_in_heap()
    if a.throughput_only:
        return throughput_only(a)
    data = Path(a.data)
    if not data.exists():
        print(f"preparing the Python standard library sources into {data}", flush=True)
        prepare_corpus(stdlib_corpus_files(), data, shard_size_tokens=1 << 22, val_tokens=1 << 16, workers=2)
    env = setup_distributed(a.device)
    base = load_config("tiny_cpu")
    runs = {}
    for reset in (False, True):
        cfg = apply_overrides(base, {"data.data_path": str(data), "training.max_steps": a.steps,
                                     "training.device": a.device, "data.reset_at_eos": reset})
        print(f"training tiny_cpu for {a.steps} steps, data.reset_at_eos={reset}", flush=True)
        runs[reset] = train(cfg, env, a.steps)
    L = base.data.max_seq_len
    val = PretrainDataset(data, L, runs[False][0].config.vocab_size, split="val")
    n = min(a.eval_windows, len(val))
    b = val.get_batch(range(n))
    x, y = b.x, b.y
    seq_idx = seq_idx_from_eos(x, val.eos_id)
    head = torch.from_numpy(doc_offsets(x, y, val.eos_id) < HEAD)
    nll = {reset: per_token_nll(runs[reset][0], x, y, seq_idx if reset else None, 16, env.device) for reset in (False, True)}
    rate_off, rate_on = fwd_bwd_rate(runs[True][0], x[:16], y[:16], seq_idx[:16], env.device, reps=5)
    print(f"\nquickstart config (tiny, {L}-token windows, batch {base.training.micro_batch_size}), {a.steps} steps each, "
          f"{a.threads} thread(s), {a.device}; validation: {n} windows = {y.numel():,} targets, {int(head.sum()):,} of them "
          f"among the first {HEAD} tokens of a document ({int(seq_idx[:, -1].sum() + n)} document pieces)")
    print(f"{'':34}{'reset_at_eos=false':>20}{'reset_at_eos=true':>20}")
    print(f"{'val loss, first 64 tokens/doc':34}{nll[False][head].mean():>20.4f}{nll[True][head].mean():>20.4f}")
    print(f"{'val loss, all tokens':34}{nll[False].mean():>20.4f}{nll[True].mean():>20.4f}")
    print(f"{'training tokens/s (whole runs)':34}{runs[False][1]:>20,.0f}{runs[True][1]:>20,.0f}")
    print(f"{'fwd+bwd tokens/s (interleaved)':34}{rate_off:>20,.0f}{rate_on:>20,.0f}")
    print(f"restart cost: fwd+bwd time x{rate_off / rate_on:.3f} with seq_idx (same model, same batch)")


if __name__ == "__main__":
    import sigint_once
    sigint_once.install()
    main()
