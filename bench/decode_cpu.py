"""CPU benchmark: O(1)-per-token decoding of the tiny Mamba-3 LM.

Measured side by side in one process (targets: decode time flat in context length, cached step far faster than re-running the prefix):
1. per-token `step` time after a prefill of 128 vs 4096 tokens -- the state has a fixed size, so the ratio
   should be 1.0 +- 0.2;
2. at context 1024: decode tokens/s with the cache vs re-running the forward on the whole prefix for every new
   token (`forward(ids, num_last_tokens=1)`, the no-cache baseline) -- the cache should be >= 10x faster.

The two contexts of part 1 are timed in alternating rounds so that load from other processes hits both alike, and
every time reported is the best round (as `timeit` does): the uncontended cost, robust to a busy machine.

`--baseline REV` adds part 3: `generate` (greedy, `--new-tokens` after a 16-token prompt) of this tree against the
package as it was at git revision REV (`git archive`d into a temporary directory and imported under another name),
the same weights in both, in interleaved rounds: median tokens/s in process CPU time (steady on a shared machine),
their ratio, and the aten ops one `step` runs per token (torch.profiler, every op counted, nested ones included);
`--op-table K` also prints the K most frequent of those ops for each tree.

    python bench/decode_cpu.py
    python bench/decode_cpu.py --contexts 128 4096 --steps 32 --rounds 5 --threads 1
    python bench/decode_cpu.py --baseline HEAD~3 --rounds 15
    python bench/decode_cpu.py --baseline 2b4a725 --skip-parts-1-2 --rounds 11 --op-table 15
"""
import argparse
import collections
import datetime
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

import baseline
from mamba3_lite.config import physical_cores

from mamba3_lite.model import Mamba3Transformer, ModelConfig


def time_steps(model, cache, token, n):
    "Seconds per token of n `step` calls continuing `cache` (modified in place)."
    t0 = time.perf_counter()
    for _ in range(n):
        logits = model.step(token, cache)
        token = logits.argmax(-1)
    return (time.perf_counter() - t0) / n


def ops_per_token(model, token, cache):
    "aten ops (every one, nested included) of one `step`, counted by name."
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        model.step(token, cache)
    return collections.Counter(e.name for e in prof.events() if e.name.startswith("aten::"))


def versus_baseline(a, cfg, model):
    "Part 3: generate tokens/s and ops per step, this tree vs the package at a.baseline, interleaved rounds."
    with tempfile.TemporaryDirectory() as tmp:
        base_mod = baseline.module(baseline.extract(a.baseline, tmp), "model")
        base = base_mod.Mamba3Transformer(base_mod.ModelConfig.from_preset(a.preset)).eval()
        base.load_state_dict(model.state_dict())
        prompt = torch.randint(0, cfg.vocab_size, (a.batch, 16), generator=torch.Generator().manual_seed(1))
        models = {"this tree": model, f"@{a.baseline}": base}
        outs = {k: m.generate(prompt, a.new_tokens, temperature=0) for k, m in models.items()}   # warm-up
        same = torch.equal(*outs.values())
        tables = {}
        for k, m in models.items():
            logits, cache = m.prefill(prompt)
            m.step(logits.argmax(-1), cache)
            tables[k] = ops_per_token(m, logits.argmax(-1), cache)
        ops = {k: sum(t.values()) for k, t in tables.items()}
        times = {k: [] for k in models}
        for _ in range(a.rounds):
            for k, m in models.items():
                c0 = time.process_time()
                m.generate(prompt, a.new_tokens, temperature=0)
                times[k].append(time.process_time() - c0)
    print(f"\n3. generate ({a.new_tokens} new tokens after 16, greedy), median CPU s of {a.rounds} interleaved rounds")
    print(f"{'code':>16} {'tokens/s':>10} {'[min-max]':>16} {'ops/step':>9}")
    tps = {}
    for k in models:
        tps[k] = a.batch * a.new_tokens / statistics.median(times[k])
        lo, hi = (a.batch * a.new_tokens / max(times[k]), a.batch * a.new_tokens / min(times[k]))
        print(f"{k:>16} {tps[k]:>10.1f} {f'[{lo:.0f}-{hi:.0f}]':>16} {ops[k]:>9}")
    k0, k1 = models
    if a.op_table:
        print(f"\nthe {a.op_table} most frequent aten ops of one step")
        rows = [[f"{n:>6} {name}" for name, n in tables[k].most_common(a.op_table)] for k in models]
        print(f"{k0:>38} | {k1}")
        for r0, r1 in zip(*(r + [""] * (a.op_table - len(r)) for r in rows)):
            print(f"{r0:>38} | {r1}")
    print(f"speed-up: {tps[k0] / tps[k1]:.2f}x tokens/s, ops per step {ops[k1]} -> {ops[k0]} "
          f"({ops[k0] / ops[k1]:.2f}x); same tokens: {same}")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "preset": a.preset,
            "batch": a.batch, "threads": torch.get_num_threads(), "new_tokens": a.new_tokens, "rounds": a.rounds,
            "clock": "process CPU time", "load_average_1min": os.getloadavg()[0], "physical_cores": physical_cores(),
            "torch": torch.__version__, "same_tokens": same,
            "rows": {k: {"tokens_per_s_median": tps[k], "cpu_s_per_round": times[k], "aten_ops_per_step": ops[k],
                         "aten_ops_by_name": dict(tables[k].most_common())} for k in models},
            "speedup_tokens_per_s": tps[k0] / tps[k1], "ops_ratio": ops[k0] / ops[k1]}, indent=1))


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
    p.add_argument("--baseline", default=None, metavar="REV", help="part 3: generate vs the package at git revision REV")
    p.add_argument("--new-tokens", type=int, default=64, help="part 3: tokens generated per round")
    p.add_argument("--skip-parts-1-2", action="store_true", help="with --baseline: run part 3 only")
    p.add_argument("--op-table", type=int, default=0, metavar="K", help="with --baseline: print the K most frequent ops per tree")
    p.add_argument("--json", default=None, metavar="PATH", help="with --baseline: write part 3 to PATH")
    a = p.parse_args(argv)
    torch.set_flush_denormal(True)
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset(a.preset)
    model = Mamba3Transformer(cfg).eval()
    print(f"preset={a.preset} ({model.num_parameters():,} params) batch={a.batch} threads={torch.get_num_threads()} "
          f"fp32; {a.steps} steps x {a.rounds} rounds")
    if a.baseline and a.skip_parts_1_2:
        return versus_baseline(a, cfg, model)

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
    if a.baseline:
        versus_baseline(a, cfg, model)


if __name__ == "__main__":
    main()
