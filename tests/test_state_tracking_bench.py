"""bench/state_tracking.py's recipe options reach every run's config, and bad values are refused with one line (exit 2)."""
import importlib.util
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("state_tracking_bench",
                                              Path(__file__).resolve().parent.parent / "bench" / "state_tracking.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_recipe_options_parse():
    a = bench.parse_args([])
    assert (a.a_init, a.dt_range) == (1e-3, (1.0, 4.0))          # the notebook's StateTrackingConfig defaults
    a = bench.parse_args(["--a-init", "none", "--dt-range", "0.1,1", "--batch-size", "32"])
    assert (a.a_init, a.dt_range, a.batch_size) == (None, (0.1, 1.0), 32)


@pytest.mark.parametrize("argv, msg", [(["--a-init", "2"], "--a-init: expected 0 < a < 1"),
                                       (["--dt-range", "1"], "--dt-range: expected min,max")])
def test_bad_recipe_options_exit_2(argv, msg, capsys):
    with pytest.raises(SystemExit) as e:
        bench.parse_args(argv)
    assert e.value.code == 2 and msg in capsys.readouterr().err
