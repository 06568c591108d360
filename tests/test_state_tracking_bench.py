"""bench/state_tracking.py's recipe options reach every run's config, and bad values are refused with one line (exit 2)."""
import importlib.util
from pathlib import Path

import pytest

from mamba3_lite.state_tracking import RECIPES, StateTrackingConfig

spec = importlib.util.spec_from_file_location("state_tracking_bench",
                                              Path(__file__).resolve().parent.parent / "bench" / "state_tracking.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_recipe_options_parse():
    a = bench.parse_args([])
    assert a.overrides == {} and a.lrs is None                    # every task trains with its RECIPES entry
    fields, lrs = bench.recipe_of("modarith", a)
    assert {k: fields[k] for k in ("n_layers", "head", "stages")} == {k: RECIPES["modarith"][k] for k in ("n_layers", "head", "stages")}
    assert lrs == RECIPES["modarith"]["lrs"]
    a = bench.parse_args(["--a-init", "none", "--dt-range", "0.1,1", "--batch-size", "32", "--steps-per-stage", "5,6",
                          "--stages", "8,16", "--min-length-frac", "0.5", "--lrs", "1e-2"])
    assert a.overrides == dict(a_init=None, dt_min=0.1, dt_max=1.0, batch_size=32, steps_per_stage=(5, 6), stages=(8, 16),
                               min_length_frac=0.5)
    fields, lrs = bench.recipe_of("parity", a)
    assert lrs == (1e-2,) and StateTrackingConfig(task="parity", **fields).stage_steps() == [5, 6]
    assert bench.parse_args(["--a-init", "1e-4,1"]).overrides["a_init"] == (1e-4, 1.0)
    assert a.seeds == (0,) and bench.parse_args(["--seeds", "1,2"]).seeds == (1, 2)      # one run per learning rate and seed
    assert bench.parse_args(["--ema", "0.999", "--ema-start", "0.5"]).overrides == dict(ema=0.999, ema_start=0.5)
    assert bench.parse_args(["--lr-final", "0.01"]).overrides == dict(lr_final=0.01)
    fields, _ = bench.recipe_of("modarith", bench.parse_args(["--d-state", "64", "--d-model", "64"]))
    assert (StateTrackingConfig(**fields).model_config().d_state, StateTrackingConfig(**fields).model_config().d_model) == (64, 64)


@pytest.mark.parametrize("argv, msg", [(["--a-init", "2"], "--a-init: expected a decay rate in (0, 1]"),
                                       (["--dt-range", "1"], "--dt-range: expected min,max"),
                                       (["--min-length-frac", "1.5"], "--min-length-frac: expected a fraction"),
                                       (["--steps-per-stage", "5,6"], "--steps-per-stage: expected a count >= 1, or one per stage"),
                                       (["--tasks", "sorting"], "--tasks: unknown task"),
                                       (["--seeds", "0,x"], "--seeds: expected comma-separated integers"),
                                       (["--lr-final", "0"], "--lr-final: expected a fraction of lr in (0, 1]"),
                                       (["--ema", "1"], "--ema: expected a decay in [0, 1)"),
                                       (["--ema-start", "-0.1"], "--ema-start: expected a fraction in [0, 1)")])
def test_bad_recipe_options_exit_2(argv, msg, capsys):
    with pytest.raises(SystemExit) as e:
        bench.parse_args(argv)
    assert e.value.code == 2 and msg in capsys.readouterr().err


def test_merged_settings_name_every_swept_rate_and_only_shared_settings():
    part = lambda **kw: {"settings": {"tasks": ["parity"], "variants": ["Mamba-3"], "lrs": [3e-3], "steps_per_stage": 300,
                                      "batch_size": 64, **kw}}
    parts = [part(), part(lrs=[1e-3]), part(tasks=["modarith"], variants=["Mamba-3", "Mamba-2"], steps_per_stage=100)]
    s = bench.merged_settings(parts)
    assert (s["tasks"], s["variants"], s["lrs"]) == (["parity", "modarith"], ["Mamba-3", "Mamba-2"], [3e-3, 1e-3])
    assert s["batch_size"] == 64 and "steps_per_stage" not in s     # differs between the files: only in merged_from
    assert s["merged_from"] == [p["settings"] for p in parts]
    again = bench.merged_settings([{"settings": s}, part(lrs=[1e-2])])      # merging a merged file: its parts are kept
    assert again["merged_from"] == [p["settings"] for p in parts] + [part(lrs=[1e-2])["settings"]] and again["lrs"] == [3e-3, 1e-3, 1e-2]
    old = part()                                                   # written before --seeds: its runs used seed 0
    assert bench.merged_settings([old, part(seeds=[1, 2])])["seeds"] == [0, 1, 2]


def test_best_of_chooses_the_seed_by_the_training_lengths_only():
    run = lambda seed, acc: {"config": {"task": "modarith", "variant": "Mamba-3", "lr": 3e-3, "seed": seed, "stages": [40, 160]},
                             "scaled_accuracy": acc, "stage_steps": [10, 10], "cpu_s": 1.0}
    runs = [run(0, {"40": 90.0, "160": 60.0, "256": 80.0}),     # mean over <= 160: 75, the better score at 256
            run(1, {"40": 95.0, "160": 70.0, "256": 10.0}),     # mean over <= 160: 82.5
            run(2, {"40": 10.0, "160": 0.0, "256": 99.0})]
    best = bench.best_of(runs)["modarith"]["Mamba-3"]
    assert (best["seed"], best["scaled_accuracy"]["256"]) == (1, 10.0)
