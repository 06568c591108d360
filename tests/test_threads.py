"""`training.num_threads` reaches torch in every command: train applies it (and `auto` says what it chose), eval and
generate apply the run's setting from its checkpoint."""
from pathlib import Path

import pytest
import torch

from mamba3_lite import cli as CLI
from mamba3_lite.testing import gpt2_available, run_captured

TINY_CPU = Path(__file__).resolve().parents[1] / "configs" / "tiny_cpu.yaml"   # the shipped CPU config
SMALL = ["--set", "model.n_layers=1", "--set", "data.max_seq_len=32", "--set", "training.micro_batch_size=2",
         "--set", "training.eval_batches=1", "--set", "training.device=cpu"]


@pytest.mark.skipif(not gpt2_available(), reason="GPT-2 ranks not available offline (set MAMBA3_LITE_GPT2_RANKS)")
def test_every_command_applies_num_threads(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(8):
        (corpus / f"doc{i}.txt").write_text(f"def f{i}(x):\n    return x * {i}\n" * 30)
    assert run_captured(CLI.prepare_cli, [str(corpus), "--out", str(tmp_path / "tok"), "--val-fraction", "0.3",
                                          "--include", "*.txt", "--quiet"])[0] == 0
    before = torch.get_num_threads()
    try:
        base = ["--config", str(TINY_CPU), "--data-path", str(tmp_path / "tok"), "--checkpoint-dir", str(tmp_path / "run"), *SMALL]
        rc, out, err = run_captured(CLI.train_cli, base + ["--max-steps", "1"])   # the shipped config: auto
        assert rc == 0, err
        assert "thread" in out and "(training.num_threads: auto;" in out, out
        torch.set_num_threads(1)
        rc, out, err = run_captured(CLI.train_cli, base + ["--max-steps", "2", "--set", "training.num_threads=2"])
        assert rc == 0 and torch.get_num_threads() == 2, err
        for cmd, argv in ((CLI.eval_cli, ["--data-path", str(tmp_path / "tok"), "--batch-size", "2"]),
                          (CLI.generate_cli, ["--prompt", "def f1(x):", "--max-new-tokens", "2"])):
            torch.set_num_threads(1)
            rc, out, err = run_captured(cmd, ["--checkpoint-dir", str(tmp_path / "run"), *argv])
            assert rc == 0 and torch.get_num_threads() == 2, (cmd.__name__, err)   # the run's training.num_threads
    finally:
        torch.set_num_threads(before)


def test_auto_leaves_a_core_that_another_process_keeps_busy():
    "busy_cores() sees a spinning process on this process's CPUs, so `auto` gives every core but that one."
    import subprocess
    import sys
    import time

    from mamba3_lite.config import auto_threads, busy_cores, physical_cores

    spin = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 20\nwhile time.time() < end: pass"])
    try:
        time.sleep(0.5)                                        # (it is running, not starting)
        busy = busy_cores()
        assert busy >= 0.7, f"a spinning process kept {busy:.2f} cores busy (expected >= 0.7)"
        n = auto_threads({}, log=lambda s: None)                # (no OMP_NUM_THREADS: auto decides)
        assert n <= max(1, physical_cores() - 1), (n, physical_cores())
    finally:
        spin.kill()
        spin.wait()
