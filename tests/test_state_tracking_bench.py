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


@pytest.mark.parametrize("argv, msg", [(["--a-init", "2"], "--a-init: expected a decay rate in (0, 1]"),
                                       (["--dt-range", "1"], "--dt-range: expected min,max"),
                                       (["--min-length-frac", "1.5"], "--min-length-frac: expected a fraction"),
                                       (["--steps-per-stage", "5,6"], "--steps-per-stage: expected a count >= 1, or one per stage"),
                                       (["--tasks", "sorting"], "--tasks: unknown task")])
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
