"""CPU benchmark: O(1)-per-token decoding of the tiny Mamba-3 LM.

Measured side by side in one process (targets: decode time flat in context length, cached step far faster than re-running the prefix):
1. per-token `step` time after a prefill of 128 vs 4096 tokens -- the state has a fixed size, so the ratio
   should be 1.0 +- 0.2;
2. at context 1024: decode tokens/s with the cache vs re-running the forward on the whole prefix for every new
   token (`forward(ids, num_last_tokens=1)`, the no-cache baseline) -- the cache should be >= 10x faster.

The two contexts of part 1 are timed in alternating rounds so that load from other processes hits both alike, and
every time reported is the best round (as `timeit` does): the uncontended cost, robust to a busy machine.

    python bench/decode_cpu.py
    python bench/decode_cpu.py --contexts 128 4096 --steps 32 --rounds 5 --threads 1
"""
import argparse
import time

import torch

from mamba3_lite.model import Mamba3Transformer, ModelConfig


def time_steps(model, cache, token, n):
    "Seconds per token of n `step` calls continuing `cache` (modified in place)."
    t0 = time.perf_counter()
    for _ in range(n):
        logits = model.step(token, cache)
        token = logits.argmax(-1)
    return (time.perf_counter() - t0) / n


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--contexts", type=int, nargs=2, default=[128, 4096], help="short and long prefill length")
    p.add_argument("--compare-context", type=int, default=1024, help="context for cache vs recompute")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=8, help="decode steps per timing round")
    p.add_argument("--rounds", type=int, default=30, help="alternating timing rounds (best reported)")
    p.add_argument("--forward-repeats", type=int, default=5, help="timed full-prefix forwards (<= rounds)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    a = p.parse_args(argv)
    torch.set_flush_denormal(True)
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset(a.preset)
    model = Mamba3Transformer(cfg).eval()
    print(f"preset={a.preset} ({model.num_parameters():,} params) batch={a.batch} threads={torch.get_num_threads()} "
          f"fp32; {a.steps} steps x {a.rounds} rounds")

    # 1. per-token decode time vs context length
    caches, tokens = {}, {}
    for T in a.contexts:
        ids = torch.randint(0, cfg.vocab_size, (a.batch, T))
        logits, caches[T] = model.prefill(ids)
        tokens[T] = logits.argmax(-1)
        time_steps(model, caches[T], tokens[T], 2)                      # warm-up
    per_token = {T: [] for T in a.contexts}
    for _ in range(a.rounds):
        for T in a.contexts:
            per_token[T].append(time_steps(model, caches[T], tokens[T], a.steps))
    short, long = a.contexts
    t_short, t_long = min(per_token[short]), min(per_token[long])
    print("\n1. decode time per token after a prefill (constant-size state)")
    print(f"{'context':>8} {'ms/token':>10}")
    for T in a.contexts:
        print(f"{T:>8} {min(per_token[T]) * 1e3:>10.3f}")
    ratio = t_long / t_short
    print(f"ratio {long}/{short}: {ratio:.3f}  (target 1.0 +- 0.2: {'met' if abs(ratio - 1) <= 0.2 else 'NOT met'})")

    # 2. cache vs recomputing the whole prefix
    T = a.compare_context
    ids = torch.randint(0, cfg.vocab_size, (a.batch, T))
    logits, cache = model.prefill(ids)
    token = logits.argmax(-1)
    time_steps(model, cache, token, 2)
    step_times, fwd_times = [], []
    with torch.no_grad():
        model(ids, num_last_tokens=1)                                   # warm-up
        for r in range(a.rounds):                                       # alternate the two methods
            step_times.append(time_steps(model, cache, token, a.steps))
            if r < a.forward_repeats:
                t0 = time.perf_counter()
                model(ids, num_last_tokens=1)
                fwd_times.append(time.perf_counter() - t0)
    t_step, t_fwd = min(step_times), min(fwd_times)
    speedup = t_fwd / t_step
    print(f"\n2. next-token cost at context {T}")
    print(f"{'method':>28} {'ms/token':>10} {'tokens/s':>10}")
    print(f"{'cached step':>28} {t_step * 1e3:>10.3f} {a.batch / t_step:>10.1f}")
    print(f"{'forward on the whole prefix':>28} {t_fwd * 1e3:>10.3f} {a.batch / t_fwd:>10.1f}")
    print(f"speed-up: {speedup:.1f}x  (target >= 10x: {'met' if speedup >= 10 else 'NOT met'})")


if __name__ == "__main__":
    main()
