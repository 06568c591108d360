"""CPU benchmark: the sequential golden recurrence `ssd_naive` vs the chunked `ssd_chunked` (forward; --grad adds the backward).

Both run in one process on the same inputs; the table reports the best time of a few runs of each (wall clock,
or process CPU time with --clock cpu, which is steadier on a shared machine) and their ratio.
Target: ssd_chunked at least 20x faster than ssd_naive at T = 4096 (b=1, H=4, P=16, N=32).

`--mamba2` times instead the Mamba-2 case (no rotation, λ = 1: exponential Euler, no D), forward + backward, of
`ssd_chunked` against the official `ssd_minimal_discrete` (https://github.com/state-spaces/mamba,
mamba_ssm/modules/ssd_minimal.py; it needs einops and finds mamba_ssm on sys.path or under --mamba-ssm DIR, without
running the package's CUDA-only __init__). Its X·Δ and A·Δ are formed inside its timed call, as ssd_chunked forms
them inside its own. `--baseline REV` adds a column for `ssd_chunked` as it was at git revision REV (bench/baseline.py), so a change is measured before and after in one run. These runs are
interleaved rounds (each function once per round, in turn), with the median and the [min-max] over rounds; the
backward is driven by a fixed random cotangent (a `y.sum()` gradient is a stride-0 tensor, which sends batched
matmul backwards into a per-matrix loop that training never sees).

    python bench/ssd_cpu.py                       # defaults below
    python bench/ssd_cpu.py --T 256 1024 --threads 1 --repeats 5
    python bench/ssd_cpu.py --grad                # forward + backward (the CPU training path)
    python bench/ssd_cpu.py --mamba2 --threads 1 --clock cpu --baseline HEAD~1 --mamba-ssm /path/to/mamba_ssm-2.3.2.post1
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import baseline
from official import official_or_reason
from mamba3_lite.config import physical_cores

from mamba3_lite.ssd import ssd_chunked, ssd_naive, ssd_random_inputs


def best_time(fn, repeats, clock):
    "Shortest time of fn() over `repeats` runs after one warm-up run."
    fn()
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return min(times)


def load_minimal(root=None):
    "The official `ssd_minimal_discrete`, or one line saying why it is unavailable."
    if root: sys.path.insert(0, str(root))
    return official_or_reason("modules.ssd_minimal", "ssd_minimal_discrete",
                              "not found (pip install it, or pass --mamba-ssm DIR holding the mamba_ssm package)")


def mamba2_rows(a, clock):
    "The Mamba-2 case, forward + backward: ssd_chunked [, its baseline] and ssd_minimal_discrete, interleaved rounds."
    minimal = load_minimal(a.mamba_ssm)
    fns = {"ssd_chunked": lambda kw: ssd_chunked(kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], kw["lam"],
                                                 chunk_size=a.chunk_size)[0]}
    if a.baseline:
        tmp = tempfile.TemporaryDirectory()                             # removed when this function returns
        old = baseline.module(baseline.extract(a.baseline, tmp.name), "ssd").ssd_chunked
        fns[f"@{a.baseline}"] = lambda kw: old(kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], kw["lam"],
                                               chunk_size=a.chunk_size)[0]
    if callable(minimal):
        fns["ssd_minimal_discrete"] = lambda kw: minimal(kw["x"] * kw["dt"][..., None], kw["A"] * kw["dt"], kw["B"],
                                                         kw["C"], a.chunk_size)[0]
    else:
        print(minimal)
    names, rows = list(fns), []
    print(f"Mamba-2 case (no rotation, lambda = 1, no D), fp32 forward + backward, b={a.b} H={a.H} P={a.P} N={a.N} "
          f"chunk={a.chunk_size} threads={torch.get_num_threads()} {a.clock} clock, median [min-max] of {a.rounds} "
          f"interleaved rounds")
    print(f"{'T':>6} " + " ".join(f"{n + ' ms':>30}" for n in names) + "".join(
        f" {n + ' / ssd_chunked':>26}" for n in names[1:]))
    for T in a.T:
        base = ssd_random_inputs(b=a.b, T=T, H=a.H, P=a.P, N=a.N, S=0, dtype=torch.float32, seed=T)
        kw = {k: base[k].requires_grad_() for k in ("x", "dt", "A", "B", "C")}
        kw["lam"] = torch.ones_like(base["lam"])
        cot = torch.randn(base["x"].shape, generator=torch.Generator().manual_seed(1))

        def run(f):
            y = f(kw)
            torch.autograd.backward(y, cot)
            for v in kw.values(): v.grad = None

        ys = {n: f(kw).detach() for n, f in fns.items()}
        err = max(((ys[n] - ys[names[0]]).abs().max() / ys[names[0]].abs().max()).item() for n in names)
        times = {n: [] for n in names}
        for n in names: run(fns[n])                                     # warm-up
        for _ in range(a.rounds):
            for n in names:
                t0 = clock(); run(fns[n]); times[n].append(clock() - t0)
        med = {n: statistics.median(times[n]) for n in names}
        cells = " ".join(f"{med[n] * 1e3:>11.2f} [{min(times[n]) * 1e3:.2f}-{max(times[n]) * 1e3:.2f}]".rjust(30)
                         for n in names)
        ratios = "".join(f" {med[n] / med[names[0]]:>25.3f}x" for n in names[1:])
        print(f"{T:>6} {cells}{ratios}   (outputs agree to {err:.1e})")
        rows.append({"T": T, "ms": {n: {"median": med[n] * 1e3, "min": min(times[n]) * 1e3, "max": max(times[n]) * 1e3}
                                    for n in names},
                     "ratio_to_ssd_chunked": {n: med[n] / med[names[0]] for n in names[1:]}, "max_rel_diff": err})
    if a.json:
        Path(a.json).write_text(json.dumps({
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "case": "mamba2",
            "shape": dict(b=a.b, H=a.H, P=a.P, N=a.N, chunk=a.chunk_size), "threads": torch.get_num_threads(),
            "clock": a.clock, "rounds": a.rounds, "baseline": a.baseline, "load_average_1min": os.getloadavg()[0],
            "physical_cores": physical_cores(), "torch": torch.__version__, "rows": rows}, indent=1))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--T", type=int, nargs="+", default=[256, 1024, 4096], help="sequence lengths")
    p.add_argument("--b", type=int, default=1)
    p.add_argument("--H", type=int, default=4)
    p.add_argument("--P", type=int, default=16)
    p.add_argument("--N", type=int, default=32)
    p.add_argument("--S", type=int, default=8, help="rotary angles per token (2S <= N)")
    p.add_argument("--R", type=int, default=None, help="MIMO rank (default: SISO)")
    p.add_argument("--chunk-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--grad", action="store_true", help="time forward + backward of a sum of the outputs")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="wall: time.perf_counter; cpu: time.process_time (all threads of this process)")
    p.add_argument("--mamba2", action="store_true", help="the Mamba-2 case vs the official ssd_minimal_discrete")
    p.add_argument("--baseline", default=None, metavar="REV", help="with --mamba2: also ssd_chunked at git revision REV")
    p.add_argument("--mamba-ssm", default=None, metavar="DIR", help="directory holding the mamba_ssm package")
    p.add_argument("--rounds", type=int, default=15, help="with --mamba2: interleaved rounds")
    p.add_argument("--json", default=None, metavar="PATH", help="with --mamba2: write the rows to PATH")
    a = p.parse_args(argv)
    torch.set_flush_denormal(True)
    if a.threads: torch.set_num_threads(a.threads)
    if a.mamba2:
        return mamba2_rows(a, time.perf_counter if a.clock == "wall" else time.process_time)
    mode = "forward + backward" if a.grad else "forward"
    print(f"ssd_naive vs ssd_chunked, fp32 {mode}, b={a.b} H={a.H} P={a.P} N={a.N} S={a.S} R={a.R or 1} "
          f"chunk={a.chunk_size} threads={torch.get_num_threads()} {a.clock} clock, best of {a.repeats}")
    print(f"{'T':>6} {'naive ms':>10} {'chunked ms':>11} {'speed-up':>9}")
    for T in a.T:
        kw = ssd_random_inputs(b=a.b, T=T, H=a.H, P=a.P, N=a.N, S=a.S, R=a.R, dtype=torch.float32, seed=T)
        if a.grad: kw = {k: v.requires_grad_() for k, v in kw.items()}

        def step(f, **extra):
            def run():
                with torch.set_grad_enabled(a.grad):
                    y, _ = f(**kw, **extra)
                    if a.grad: y.sum().backward()
            return run

        clock = time.perf_counter if a.clock == "wall" else time.process_time
        t_naive = best_time(step(ssd_naive), a.repeats, clock)
        t_chunk = best_time(step(ssd_chunked, chunk_size=a.chunk_size), a.repeats, clock)
        print(f"{T:>6} {t_naive * 1e3:>10.1f} {t_chunk * 1e3:>11.2f} {t_naive / t_chunk:>8.1f}x")


if __name__ == "__main__":
    main()
