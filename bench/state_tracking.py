"""State tracking on CPU: parity and modular arithmetic (with and without brackets) for every block variant
(Mamba-3; fixed RoPE; no RoPE; Mamba-2 = no rotation + Euler), each over a small learning-rate sweep (and, with
`--seeds`, several seeds), trained with the length curriculum of `mamba3_lite.state_tracking` and evaluated at lengths
beyond it.

    OMP_NUM_THREADS=1 python bench/state_tracking.py [--tasks modarith,...] [--variants Mamba-3,...] [--lrs 3e-3,1e-2] [--seeds 0,1]

Each task trains with its recipe, `RECIPES[task]` (layers, initialisation, head, curriculum, learning rates); an option
given here replaces that field for every task run. Writes `bench/results/state_tracking_<UTC date>.json` (every run
with its learning curve, the chosen learning rate per task and variant, the process CPU time of each run and of the
whole sweep, the load average of the machine before and after) and `state_tracking_<date>.png` (scaled accuracy vs
test length, and the learning curves, one column per task). The learning rate (and seed) of a (task, variant) is the
run with the best mean scaled accuracy over the test lengths up to the longest *training* length; the lengths beyond it
play no part in the choice, and every run stays in the JSON. The paper's Table 5b (https://arxiv.org/abs/2603.15569)
is printed next to the measured accuracy at test length 256."""
import argparse
import datetime
import json
import math
import os
import platform
import time
from pathlib import Path

import torch

from mamba3_lite.state_tracking import RECIPES, TASKS, VARIANTS, StateTrackingConfig, train_state_tracking

PAPER_256 = {"parity": {"Mamba-3": 100.00, "fixed RoPE": 1.56, "no RoPE": 2.27, "Mamba-2": 0.90},
             "modarith": {"Mamba-3": 98.51, "fixed RoPE": 20.70, "no RoPE": 1.49, "Mamba-2": 47.81},
             "modarith_brackets": {"Mamba-3": 87.75, "fixed RoPE": 2.62, "no RoPE": 0.72, "Mamba-2": 0.88}}


FLAGS = {"n_layers": "layers", "dt_min": "dt-range", "dt_max": "dt-range"}   # config field -> option, where they differ


def _ints(s): return tuple(int(x) for x in s.split(","))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default="parity,modarith,modarith_brackets")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--lrs", default=None, help="comma-separated learning rates (default: the recipe's)")
    p.add_argument("--seeds", default="0", help="comma-separated seeds: each learning rate trains once per seed")
    recipe = p.add_argument_group("recipe fields (default: each task's RECIPES entry)")
    recipe.add_argument("--layers", type=int, default=None, dest="n_layers")
    recipe.add_argument("--d-model", type=int, default=None, help="model width (the block's d_inner is twice it)")
    recipe.add_argument("--d-state", type=int, default=None, help="state size N per head (half of it rotated)")
    recipe.add_argument("--stages", default=None, help="longest training length of each stage, e.g. 40,80,160")
    recipe.add_argument("--steps-per-stage", default=None, help="one count for every stage, or one per stage")
    recipe.add_argument("--min-length-frac", type=float, default=None,
                        help="each step's length is uniform in [max(3, frac * stage length), stage length]")
    recipe.add_argument("--a-init", default=None,
                        help="initial decay rate |A|: a (0 < a < 1), lo,hi (spread over each layer's heads), or 'none' (the LM's)")
    recipe.add_argument("--dt-range", default=None, help="initial Δ range: min,max (log-uniform)")
    recipe.add_argument("--head", default=None, help="'tied' (the LM's head) or 'linear' (a K-class head)")
    recipe.add_argument("--batch-size", type=int, default=None)
    recipe.add_argument("--lr-final", type=float, default=None, help="the cosine schedule's last learning rate, as a fraction of the peak")
    recipe.add_argument("--curve-every", type=int, default=None, help="steps between the points of the learning curve")
    recipe.add_argument("--ema", type=float, default=None,
                        help="decay of an exponential moving average of the weights, which the test then measures (0: none)")
    recipe.add_argument("--ema-start", type=float, default=None, help="fraction of the steps after which the average starts")
    p.add_argument("--eval-lengths", default="40,80,160,256,512")
    p.add_argument("--eval-sequences", type=int, default=256)
    p.add_argument("--out", default=None, help="JSON path (default bench/results/state_tracking_<date>.json)")
    p.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                   help="combine the runs of --tasks from earlier JSON files (e.g. sweeps run in parallel processes) into --out")
    a = p.parse_args(argv)
    a.tasks, a.variants = a.tasks.split(","), a.variants.split(",")
    for t in a.tasks:
        if t not in TASKS: p.error(f"--tasks: unknown task {t!r}; expected some of {sorted(TASKS)}")
    for v in a.variants:
        if v not in VARIANTS: p.error(f"--variants: unknown variant {v!r}; expected some of {list(VARIANTS)}")
    a.lrs = None if a.lrs is None else tuple(float(x) for x in a.lrs.split(","))
    a.eval_lengths = _ints(a.eval_lengths)
    try: a.seeds = _ints(a.seeds)
    except ValueError: p.error(f"--seeds: expected comma-separated integers, got {a.seeds!r}")
    over = {k: getattr(a, k) for k in ("n_layers", "d_model", "d_state", "head", "batch_size", "lr_final", "curve_every", "min_length_frac", "ema", "ema_start") if getattr(a, k) is not None}
    if a.stages is not None: over["stages"] = _ints(a.stages)
    if a.steps_per_stage is not None:
        steps = _ints(a.steps_per_stage)
        over["steps_per_stage"] = steps[0] if len(steps) == 1 else steps
    if a.dt_range is not None:
        dt = tuple(float(x) for x in a.dt_range.split(","))
        if len(dt) != 2: p.error(f"--dt-range: expected min,max, got {a.dt_range!r}")
        over["dt_min"], over["dt_max"] = dt
    if a.a_init is not None:
        rates = None if a.a_init.lower() == "none" else tuple(float(x) for x in a.a_init.split(","))
        over["a_init"] = rates if rates is None or len(rates) > 1 else rates[0]
    a.overrides = over
    for task in a.tasks:                   # every field checked once, here, by the config itself
        try: StateTrackingConfig(task=task, **recipe_of(task, a)[0]).model_config()
        except ValueError as e:
            field, msg = str(e).split(": ", 1)
            p.error(f"--{FLAGS.get(field, field.replace('_', '-'))}: {msg}")
    return a


def recipe_of(task: str, a) -> tuple:
    "(config fields, learning rates) of `task`: its RECIPES entry with the command line's overrides."
    fields = {**RECIPES[task], **a.overrides}
    lrs = fields.pop("lrs")
    return dict(fields, eval_lengths=a.eval_lengths, eval_sequences=a.eval_sequences), a.lrs or lrs


def plot(result: dict, path: Path):
    "One column per task: scaled accuracy vs test length; the learning curves (scaled accuracy, training loss) of the chosen rates."
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tasks = list(result["best"])
    fig, axes = plt.subplots(3, len(tasks), figsize=(max(4.4 * len(tasks), 7.0), 9.0), squeeze=False)   # wide enough for the title
    for col, task in enumerate(tasks):
        ax, cax, lax = axes[:, col]
        per = result["best"][task]
        for variant, best in per.items():
            acc = best["scaled_accuracy"]
            line, = ax.plot([int(k) for k in acc], list(acc.values()), marker="o", label=f"{variant} (lr {best['lr']:g}, seed {best['seed']})")
            if best["curve"]:
                steps = [c[0] for c in best["curve"]]
                cax.plot(steps, [c[3] for c in best["curve"]], color=line.get_color(), label=variant)
                lax.plot(steps, [c[2] for c in best["curve"]], color=line.get_color(), label=variant)
        stages = best["stages"]
        ax.axvline(max(stages), color="grey", ls=":", lw=1)
        ax.set(title=task, xscale="log", xlabel="test length", ylabel="scaled accuracy (%)", ylim=(-10, 105))
        lengths = sorted({int(k) for b in per.values() for k in b["scaled_accuracy"]})
        ax.minorticks_off(); ax.set_xticks(lengths); ax.set_xticklabels([str(n) for n in lengths])
        ax.legend(fontsize=7)
        ends = [sum(best["stage_steps"][:i + 1]) for i in range(len(stages) - 1)]
        for a in (cax, lax):
            for e in ends: a.axvline(e, color="grey", ls=":", lw=1)
        cax.set(ylim=(-10, 105), ylabel=f"scaled accuracy at {best['curve_length']} (%)")
        lax.axhline(math.log(TASKS[task]), color="grey", ls="--", lw=1)
        lax.set(xlabel="training step (dotted: next curriculum stage)", ylabel="training loss (dashed: chance, ln K)", ylim=(0, None))
        if any(b["curve"] for b in per.values()): cax.legend(fontsize=7)
        else:
            for a in (cax, lax): a.text(0.5, 0.5, "no learning curve recorded", ha="center", transform=a.transAxes, fontsize=8)
    fig.suptitle("top: trained up to the dotted length; 0 = chance, 100 = perfect\n"
                 "middle and bottom: learning curves of the chosen rates (the loss of the step's batch)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def best_of(runs: list) -> dict:
    """Per task and variant, the run (learning rate, seed) with the best mean scaled accuracy over the test lengths up to
    its longest training length (a tie keeps the first run)."""
    best = {}
    for r in runs:
        c = r["config"]
        train_max = max(c["stages"])
        score = lambda acc: sum(v for k, v in acc.items() if int(k) <= train_max) / max(1, sum(int(k) <= train_max for k in acc))
        cur = best.setdefault(c["task"], {}).get(c["variant"])
        if cur is None or score(r["scaled_accuracy"]) > score(cur["scaled_accuracy"]):
            stage_steps = r.get("stage_steps") or [c["steps_per_stage"]] * len(c["stages"])   # runs written before curves
            best[c["task"]][c["variant"]] = dict(
                lr=c["lr"], seed=c["seed"], scaled_accuracy=r["scaled_accuracy"], steps=sum(stage_steps), stages=c["stages"],
                stage_steps=stage_steps, cpu_s=r["cpu_s"], curve=r.get("curve", []), curve_length=c.get("curve_length", 256))
    return best


def report(result: dict, out: Path):
    out.write_text(json.dumps(result, indent=1))
    plot(result, out.with_suffix(".png"))
    print(f"\n| task | variant | lr | seed | steps | CPU s | scaled acc. @256 | paper @256 |\n|---|---|---|---|---|---|---|---|")
    for task, per in result["best"].items():
        for variant, b in per.items():
            print(f"| {task} | {variant} | {b['lr']:g} | {b['seed']} | {b['steps']} | {b['cpu_s']:.0f} | "
                  f"{b['scaled_accuracy'].get('256', float('nan')):.1f} | {PAPER_256[task][variant]:.2f} |")
    per_task = {t: sum(r["cpu_s"] for r in result["runs"] if r["config"]["task"] == t) for t in result["best"]}
    print("CPU time per task (every run of its sweep): " + ", ".join(f"{t} {s:.0f} s" for t, s in per_task.items()) +
          f"; all {result['cpu_s']:.0f} s (1 thread per process); wrote {out} and {out.with_suffix('.png')}")


def merged_settings(parts):
    "The settings of runs merged from several JSON files: what they share, the union of their sweeps, and each run's own."
    own = [s for p in parts for s in p["settings"].get("merged_from", [p["settings"]])]   # a merged file brings its parts
    union_keys = ("tasks", "variants", "lrs", "seeds")
    shared = {k: v for k, v in own[0].items() if k not in union_keys and all(o.get(k) == v for o in own)}
    swept = lambda o, k: o.get(k, [0] if k == "seeds" else None) or []      # settings from before --seeds ran seed 0
    union = {k: sorted({x for o in own for x in swept(o, k)}, key=[x for o in own for x in swept(o, k)].index)
             for k in union_keys}
    return dict(shared, **union, merged_from=own)


def machine() -> dict:
    "What the numbers were measured on: CPU model, logical CPUs, load average (other processes share the cores)."
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    return dict(cpu=model, logical_cpus=os.cpu_count(), load_avg=os.getloadavg())


def main(argv=None):
    a = parse_args(argv)
    torch.set_flush_denormal(True)
    torch.set_num_threads(1)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    out = Path(a.out or Path(__file__).parent / "results" / f"state_tracking_{date}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    if a.merge:
        parts = [json.loads(Path(f).read_text()) for f in a.merge]
        runs = [r for part in parts for r in part["runs"] if r["config"]["task"] in a.tasks]
        result = dict(date=date, settings=merged_settings(parts), runs=runs, best=best_of(runs), paper_at_256=PAPER_256,
                      cpu_s=sum(r["cpu_s"] for r in runs), wall_s=max(p["wall_s"] for p in parts),
                      machine=[p.get("machine") for p in parts], threads=1, torch=torch.__version__)
        return report(result, out)
    settings = dict(tasks=a.tasks, variants=a.variants, lrs=list(a.lrs) if a.lrs else None, seeds=list(a.seeds), overrides=a.overrides,
                    recipes={t: recipe_of(t, a)[0] | {"lrs": list(recipe_of(t, a)[1])} for t in a.tasks})
    runs, cpu0, t0, before = [], time.process_time(), time.perf_counter(), machine()
    for task in a.tasks:
        fields, lrs = recipe_of(task, a)
        for variant in a.variants:
            for lr, seed in [(lr, seed) for lr in lrs for seed in a.seeds]:
                cfg = StateTrackingConfig(task=task, variant=variant, lr=lr, seed=seed, **fields)
                r = train_state_tracking(cfg, log_every=250, log=print)
                for key in ("scaled_accuracy", "scaled_accuracy_raw"):
                    if key in r: r[key] = {str(k): v for k, v in r[key].items()}
                print(f"{task:18s} {variant:10s} lr {lr:<7g} seed {seed} {r['cpu_s']:6.0f} cpu-s  " +
                      "  ".join(f"{k}:{v:6.1f}" for k, v in r["scaled_accuracy"].items()) +
                      ("  (last weights: " + "  ".join(f"{k}:{v:6.1f}" for k, v in r["scaled_accuracy_raw"].items()) + ")"
                       if "scaled_accuracy_raw" in r else ""), flush=True)
                runs.append(r)
                result = dict(date=date, settings=settings, runs=runs, best=best_of(runs), paper_at_256=PAPER_256,
                              cpu_s=time.process_time() - cpu0, wall_s=time.perf_counter() - t0,
                              machine=dict(before, load_avg_after=os.getloadavg()), threads=torch.get_num_threads(),
                              torch=torch.__version__)
                out.write_text(json.dumps(result, indent=1))       # after every run: an interrupted sweep keeps its runs
    report(result, out)


if __name__ == "__main__":
    main()
