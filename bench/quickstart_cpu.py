"""The whole `mamba3-lite quickstart` (prepare the stdlib sources, train, evaluate, sample) on `training.num_threads:
auto` and on one thread, one after the other in fresh run directories: wall time, process CPU time, the thread count
`auto` chose, tokens/s and the validation loss of each, and the wall-time ratio.

Both runs do the same work (same config, seed and corpus). Run it on an idle machine to see what `auto` gives there:
the script prints the load average before each run, and `auto`'s own note when it finds cores busy with other work.
`--rounds 2` alternates the two variants twice (medians), for a machine whose load drifts.

    python bench/quickstart_cpu.py [--max-steps N] [--rounds R] [--out FILE]
"""
import argparse
import datetime
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cpu_env import cpu_machine
from mamba3_lite.config import physical_cores

VARIANTS = {"auto": {}, "1 thread": {"OMP_NUM_THREADS": "1"}}   # auto: no OMP_NUM_THREADS, so `auto` decides


def run_quickstart(run_dir: Path, extra_env: dict, max_steps) -> dict:
    "One quickstart in a subprocess; its wall and CPU seconds and what it printed about threads, speed and loss."
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | extra_env
    cmd = [sys.executable, "-m", "mamba3_lite.cli", "quickstart", "--run-dir", str(run_dir)]
    if max_steps: cmd += ["--max-steps", str(max_steps)]
    load, cpu0, t0 = os.getloadavg()[0], resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall, cpu1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"quickstart_cpu: the quickstart failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    out = proc.stdout
    threads = re.search(r"\[cpu\] (\d+) threads? \(training\.num_threads: auto", out)
    loss = re.search(r"validation loss ([\d.]+) -> ([\d.]+)", out)
    tps = re.findall(r"tps=([\d,]+)", out)
    return {"wall_s": wall, "cpu_s": (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime),
            "threads": int(threads.group(1)) if threads else None, "load_average_1min_start": load,
            "busy_note": next((l for l in out.splitlines() if "looks shared" in l), None),
            "val_loss": [float(loss.group(1)), float(loss.group(2))] if loss else None,
            "last_tps": int(tps[-1].replace(",", "")) if tps else None}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-steps", type=int, default=None, help="override the config's 300 steps (default: none)")
    p.add_argument("--rounds", type=int, default=1, help="alternating rounds of the two variants (default: 1)")
    p.add_argument("--out", default=None, help="write the runs and the ratio as JSON here")
    a = p.parse_args(argv)
    runs = {k: [] for k in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for name, env in VARIANTS.items():
                row = run_quickstart(Path(tmp) / f"{r}-{name.replace(' ', '_')}", env, a.max_steps)
                runs[name].append(row)
                print(f"round {r}  {name:9s} threads={row['threads']}  wall {row['wall_s']:7.1f} s  CPU {row['cpu_s']:7.1f} s  "
                      f"tps {row['last_tps']}  val loss {row['val_loss']}  load {row['load_average_1min_start']:.1f}"
                      + (f"  ({row['busy_note']})" if row["busy_note"] else ""), flush=True)
    wall = {k: statistics.median(r["wall_s"] for r in v) for k, v in runs.items()}
    ratio = wall["auto"] / wall["1 thread"]
    print(f"quickstart wall time, auto / 1 thread: {ratio:.2f} ({wall['auto']:.1f} s vs {wall['1 thread']:.1f} s; "
          f"{physical_cores()} physical cores)")
    if a.out:
        Path(a.out).write_text(json.dumps({
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": cpu_machine(),
            "max_steps": a.max_steps, "rounds": a.rounds, "runs": runs,
            "wall_s_median": wall, "auto_over_1_thread_wall": ratio}, indent=1))
        print(f"-> {a.out}")


if __name__ == "__main__":
    main()
