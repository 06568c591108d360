"""torch.compile on CPU from the command line with the shipped CPU config: the default mode compiles and trains to
the eager losses; a mode that fails on CPU is refused in one line before anything runs. The model is shrunk (one
layer, a 256-token vocabulary) so that the compile takes well under a minute of CPU time."""
from pathlib import Path

import pytest

from mamba3_lite import cli as CLI
from mamba3_lite.logger import read_metrics
from mamba3_lite.testing import run_captured

TINY_CPU = Path(__file__).resolve().parents[1] / "configs" / "tiny_cpu.yaml"   # the shipped CPU config
SMALL = ["--set", "model.n_layers=1", "--set", "model.vocab_size=256", "--set", "data.max_seq_len=32",
         "--set", "training.micro_batch_size=4", "--set", "training.eval_batches=1"]


def train_losses(run_dir, *extra):
    argv = ["--config", str(TINY_CPU), "--dry-run", "--checkpoint-dir", str(run_dir), *SMALL, *extra]
    rc, out, err = run_captured(CLI.train_cli, argv)
    assert rc == 0, err
    rows = [r for r in read_metrics(run_dir / "dry_run") if r.get("kind") == "train"]
    return [r["loss"] for r in rows], out


def test_cpu_compile_default_mode_matches_eager(tmp_path):
    eager, _ = train_losses(tmp_path / "eager")
    compiled, out = train_losses(tmp_path / "compiled", "--set", "training.compile=true",
                                 "--set", "training.compile_on_cpu=true")
    assert "[compile] torch.compile(mode=default)" in out
    assert len(eager) == len(compiled) == 2
    assert compiled == pytest.approx(eager, rel=1e-4)     # Inductor fuses and reorders fp32 sums


def test_cpu_compile_max_autotune_is_refused_in_one_line(tmp_path):
    argv = ["--config", str(TINY_CPU), "--dry-run", "--checkpoint-dir", str(tmp_path / "run"), *SMALL,
            "--set", "training.compile=true", "--set", "training.compile_on_cpu=true",
            "--set", "training.compile_mode=max-autotune"]
    rc, out, err = run_captured(CLI.train_cli, argv)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "training.compile_mode='max-autotune' fails on CPU" in err
    assert not (tmp_path / "run" / "dry_run").exists() or not any((tmp_path / "run" / "dry_run").glob("step_*"))
