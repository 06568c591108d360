"""CPU benchmark: the sequential golden recurrence `ssd_naive` vs the chunked `ssd_chunked` (forward; --grad adds the backward).

Both run in one process on the same inputs; the table reports the best time of a few runs of each (wall clock,
or process CPU time with --clock cpu, which is steadier on a shared machine) and their ratio.
Target: ssd_chunked at least 20x faster than ssd_naive at T = 4096 (b=1, H=4, P=16, N=32).

    python bench/ssd_cpu.py                       # defaults below
    python bench/ssd_cpu.py --T 256 1024 --threads 1 --repeats 5
    python bench/ssd_cpu.py --grad                # forward + backward (the CPU training path)
"""
import argparse
import time

import torch

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
    a = p.parse_args(argv)
    torch.set_flush_denormal(True)
    if a.threads: torch.set_num_threads(a.threads)
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
