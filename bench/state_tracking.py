"""State tracking on CPU: parity and modular arithmetic (with and without brackets) for every block variant
(Mamba-3; fixed RoPE; no RoPE; Mamba-2 = no rotation + Euler), each over a small learning-rate sweep, trained with the
length curriculum of `mamba3_lite.state_tracking` and evaluated at lengths beyond it.

    OMP_NUM_THREADS=1 python bench/state_tracking.py [--tasks parity,...] [--lrs 3e-3,1e-2] [--steps-per-stage 300]

Writes `bench/results/state_tracking_<UTC date>.json` (every run, the chosen learning rate per task and variant, the
CPU time used) and `state_tracking_<date>.png` (scaled accuracy vs test length, one panel per task). The learning rate
of a (task, variant) is the one with the best mean scaled accuracy over the test lengths up to the longest *training*
length; the lengths beyond it play no part in the choice. The paper's Table 5b (https://arxiv.org/abs/2603.15569) is printed next to the
measured accuracy at test length 256."""
import argparse
import datetime
import json
import time
from pathlib import Path

import torch

from mamba3_lite.state_tracking import TASKS, VARIANTS, StateTrackingConfig, train_state_tracking

PAPER_256 = {"parity": {"Mamba-3": 100.00, "fixed RoPE": 1.56, "no RoPE": 2.27, "Mamba-2": 0.90},
             "modarith": {"Mamba-3": 98.51, "fixed RoPE": 20.70, "no RoPE": 1.49, "Mamba-2": 47.81},
             "modarith_brackets": {"Mamba-3": 87.75, "fixed RoPE": 2.62, "no RoPE": 0.72, "Mamba-2": 0.88}}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default="parity,modarith,modarith_brackets")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--lrs", default="3e-3,1e-2", help="comma-separated learning rates (all tasks)")
    p.add_argument("--steps-per-stage", type=int, default=300)
    p.add_argument("--stages", default="8,16,40,80,160")
    p.add_argument("--layers", default="parity=1,modarith=1,modarith_brackets=1", help="task=n_layers,...")
    p.add_argument("--eval-lengths", default="40,80,160,256,512")
    p.add_argument("--eval-sequences", type=int, default=256)
    d = StateTrackingConfig()
    p.add_argument("--a-init", default=str(d.a_init), help="initial decay rate |A| (0 < a < 1), or 'none' for the LM's")
    p.add_argument("--dt-range", default=f"{d.dt_min:g},{d.dt_max:g}", help="initial Δ range: min,max (log-uniform)")
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--out", default=None, help="JSON path (default bench/results/state_tracking_<date>.json)")
    p.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                   help="combine the runs of earlier JSON files (e.g. sweeps run in parallel processes) into --out")
    a = p.parse_args(argv)
    a.tasks, a.variants = a.tasks.split(","), a.variants.split(",")
    for t in a.tasks:
        if t not in TASKS: p.error(f"--tasks: unknown task {t!r}; expected some of {sorted(TASKS)}")
    for v in a.variants:
        if v not in VARIANTS: p.error(f"--variants: unknown variant {v!r}; expected some of {list(VARIANTS)}")
    a.lrs = [float(x) for x in a.lrs.split(",")]
    a.stages = tuple(int(x) for x in a.stages.split(","))
    a.layers = {k: int(v) for k, v in (kv.split("=") for kv in a.layers.split(","))}
    a.eval_lengths = tuple(int(x) for x in a.eval_lengths.split(","))
    a.a_init = None if a.a_init.lower() == "none" else float(a.a_init)
    a.dt_range = tuple(float(x) for x in a.dt_range.split(","))
    if len(a.dt_range) != 2: p.error(f"--dt-range: expected min,max, got {a.dt_range!r}")
    if a.a_init is not None and not 0 < a.a_init < 1: p.error(f"--a-init: expected 0 < a < 1 or 'none', got {a.a_init}")
    return a


def plot(result: dict, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tasks = list(result["best"])
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.2), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for variant, best in result["best"][task].items():
            acc = best["scaled_accuracy"]
            ax.plot([int(k) for k in acc], list(acc.values()), marker="o", label=f"{variant} (lr {best['lr']:g})")
        ax.axvline(max(result["settings"]["stages"]), color="grey", ls=":", lw=1)
        ax.set(title=task, xscale="log", xlabel="test length", ylabel="scaled accuracy (%)", ylim=(-10, 105))
        lengths = sorted({int(k) for b in result["best"][task].values() for k in b["scaled_accuracy"]})
        ax.minorticks_off(); ax.set_xticks(lengths); ax.set_xticklabels([str(n) for n in lengths])
        ax.legend(fontsize=7)
    fig.suptitle("trained up to the dotted length; 0 = chance, 100 = perfect", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def best_of(runs: list, stages) -> dict:
    "Per task and variant, the learning rate with the best mean scaled accuracy over the test lengths <= the longest training length."
    best = {}
    score = lambda acc: sum(v for k, v in acc.items() if int(k) <= max(stages)) / max(1, sum(int(k) <= max(stages) for k in acc))
    for r in runs:
        task, variant = r["config"]["task"], r["config"]["variant"]
        cur = best.setdefault(task, {}).get(variant)
        acc = r["scaled_accuracy"]
        if cur is None or score(acc) > score(cur["scaled_accuracy"]):
            best[task][variant] = dict(lr=r["config"]["lr"], scaled_accuracy=acc,
                                       steps=r["config"]["steps_per_stage"] * len(r["config"]["stages"]))
    return best


def report(result: dict, out: Path):
    out.write_text(json.dumps(result, indent=1))
    plot(result, out.with_suffix(".png"))
    print(f"\n| task | variant | lr | scaled acc. @256 | paper @256 |\n|---|---|---|---|---|")
    for task, per in result["best"].items():
        for variant, b in per.items():
            print(f"| {task} | {variant} | {b['lr']:g} | {b['scaled_accuracy'].get('256', float('nan')):.1f} | "
                  f"{PAPER_256[task][variant]:.2f} |")
    print(f"CPU time {result['cpu_s']:.0f} s (1 thread per process); wrote {out} and {out.with_suffix('.png')}")


def merged_settings(parts, stages):
    "The settings of runs merged from several JSON files: what they share, the union of their sweeps, and each run's own."
    own = [s for p in parts for s in p["settings"].get("merged_from", [p["settings"]])]   # a merged file brings its parts
    shared = {k: v for k, v in own[0].items() if k not in ("tasks", "variants", "lrs") and all(o.get(k) == v for o in own)}
    union = {k: sorted({x for o in own for x in o[k]}, key=[x for o in own for x in o[k]].index) for k in ("tasks", "variants", "lrs")}
    return dict(shared, **union, stages=stages, merged_from=own)


def main(argv=None):
    a = parse_args(argv)
    torch.set_flush_denormal(True)
    torch.set_num_threads(1)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    out = Path(a.out or Path(__file__).parent / "results" / f"state_tracking_{date}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(a).items() if k not in ("out", "merge")}
    if a.merge:
        parts = [json.loads(Path(f).read_text()) for f in a.merge]
        runs = [r for part in parts for r in part["runs"]]
        stages = max((r["config"]["stages"] for r in runs), key=max)
        result = dict(date=date, settings=merged_settings(parts, stages),
                      runs=runs, best=best_of(runs, stages), paper_at_256=PAPER_256,
                      cpu_s=sum(r["cpu_s"] for r in runs), wall_s=max(p["wall_s"] for p in parts),
                      threads=1, torch=torch.__version__)
        return report(result, out)
    runs, cpu0, t0 = [], time.process_time(), time.perf_counter()
    for task in a.tasks:
        for variant in a.variants:
            for lr in a.lrs:
                cfg = StateTrackingConfig(task=task, variant=variant, lr=lr, n_layers=a.layers.get(task, 1),
                                          stages=a.stages, steps_per_stage=a.steps_per_stage,
                                          eval_lengths=a.eval_lengths, eval_sequences=a.eval_sequences,
                                          a_init=a.a_init, dt_min=a.dt_range[0], dt_max=a.dt_range[1],
                                          batch_size=a.batch_size)
                r = train_state_tracking(cfg, log_every=max(1, a.steps_per_stage // 2), log=print)
                r["scaled_accuracy"] = {str(k): v for k, v in r["scaled_accuracy"].items()}
                print(f"{task:18s} {variant:10s} lr {lr:<7g} {r['cpu_s']:6.0f} cpu-s  " +
                      "  ".join(f"{k}:{v:6.1f}" for k, v in r["scaled_accuracy"].items()), flush=True)
                runs.append(r)
                result = dict(date=date, settings=settings, runs=runs, best=best_of(runs, a.stages),
                              paper_at_256=PAPER_256, cpu_s=time.process_time() - cpu0,
                              wall_s=time.perf_counter() - t0, threads=torch.get_num_threads(), torch=torch.__version__)
                out.write_text(json.dumps(result, indent=1))       # after every run: an interrupted sweep keeps its runs
    report(result, out)


if __name__ == "__main__":
    main()
