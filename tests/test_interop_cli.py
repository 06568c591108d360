"""`mamba3-lite export` / `import`: a trained run -> official model directory -> a new run that `generate`, `eval`
and `train` accept, with the same logits. The round trip runs the console script in subprocesses; the rest calls
the same entry point (`mamba3_lite.cli.main`) in-process, to keep the time down."""
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml

from mamba3_lite.checkpoint import CheckpointWarning
from mamba3_lite.cli import main
from mamba3_lite.ssd import nmax
from mamba3_lite.config import DataConfig, LoopConfig, TrainingConfig, load_config
from mamba3_lite.evaluate import load_trained
from mamba3_lite.train import run_training

RANKS = os.environ.get("MAMBA3_LITE_GPT2_RANKS")
CLI = [sys.executable, "-c", "import sys; from mamba3_lite.cli import main; sys.exit(main())"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def cli(*args, timeout=300):
    r = subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True, env=ENV, timeout=timeout)
    return r


def tiny_run(run_dir: Path, data_path: Path = None) -> Path:
    "Train the tiny-mimo preset (output norm on) for 2 steps on random tokens, or on `data_path` when given."
    cfg = TrainingConfig(model={"preset": "tiny-mimo", "outproj_norm": True},
                         data=DataConfig(data_path=str(data_path or run_dir / "none"), max_seq_len=32,
                                         dummy=data_path is None),
                         training=LoopConfig(micro_batch_size=2, gradient_accumulation_steps=1, max_steps=2,
                                             warmup_steps=1, eval_every=2, eval_batches=1, save_every=2,
                                             checkpoint_dir=str(run_dir), compile=False, device="cpu",
                                             num_threads=1, log_every=1, lr=3e-3))
    run_training(cfg, log=lambda s: None)
    return run_dir


def logits(run_dir, ids):
    model, _, _ = load_trained(run_dir, log=lambda s: None)
    with torch.no_grad():
        return model(ids).logits


def test_export_import_round_trip_through_the_cli(tmp_path, capsys):
    run = tiny_run(tmp_path / "run")
    r = cli("export", run, tmp_path / "hf")
    assert r.returncode == 0, r.stderr
    assert "exported step 2" in r.stdout
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["config.json", "model.safetensors", "pytorch_model.bin"]
    r = cli("import", tmp_path / "hf", "--out", tmp_path / "run2")
    assert r.returncode == 0, r.stderr
    assert "as step 0 of" in r.stdout and "mamba3-lite train --config" in r.stdout
    torch.manual_seed(0)
    ids = torch.randint(0, 50257, (2, 40))
    a, b = logits(run, ids), logits(tmp_path / "run2", ids)
    print(f"CLI round trip run -> export -> import -> run: logits max |diff| {(a - b).abs().max().item():.1e}, "
          f"rel. {nmax(b, a):.1e}")
    assert torch.equal(a, b)  # exact: equal weights and config, the same ops on the same shapes
    # importing over an existing run is refused in one line, nothing overwritten
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "run2").iterdir()}
    capsys.readouterr()
    assert main(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "run2")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already holds checkpoints (steps [0])" in err
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "run2").iterdir()} == before
    # an exported model directory is not a run: `export` says how to make it one
    assert main(["export", str(tmp_path / "hf"), str(tmp_path / "hf2")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"mamba3-lite import {tmp_path / 'hf'} --out runs/NAME" in err


def test_train_continues_an_imported_run(tmp_path, capsys, monkeypatch):
    run = tiny_run(tmp_path / "run")
    assert main(["export", str(run), str(tmp_path / "hf")]) == 0
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "hf").iterdir()}
    capsys.readouterr()
    assert main(["export", str(run), str(tmp_path / "hf")]) == 2          # never over an earlier export
    assert "config.json: already exists" in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "hf").iterdir()} == before
    assert main(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "run2"), "--config", "tiny_cpu"]) == 0
    r2 = tmp_path / "run2"
    monkeypatch.chdir(tmp_path)                                            # a relative --out is stored absolute
    assert main(["import", "hf", "--out", "run3"]) == 0
    assert main(["import", "hf", "--out", "run4", "--config", "tiny_cpu"]) == 0
    for run_dir, data in (("run3", TrainingConfig().data.data_path), ("run4", load_config("tiny_cpu").data.data_path)):
        stored = load_config(tmp_path / run_dir / "config.yaml")           # and the data path, resolved against the cwd
        assert (stored.training.checkpoint_dir, stored.data.data_path) == (str(tmp_path / run_dir), str(tmp_path / data))
    cfg = load_config(r2 / "config.yaml")      # the imported architecture, tiny_cpu's data and training sections
    assert cfg.model["preset"] == "tiny" and cfg.model["is_mimo"] and cfg.model["outproj_norm"]
    assert (cfg.training.lr, cfg.data.max_seq_len, cfg.training.checkpoint_dir) == (3e-3, 128, str(r2))
    over = ["--set", "data.dummy=true", "--set", "data.max_seq_len=32", "--set", "training.micro_batch_size=2",
            "--set", "training.eval_batches=1", "--set", "training.device=cpu", "--set", "training.num_threads=1"]
    with warnings.catch_warnings():                    # the [resume] line says the optimizer starts fresh; no warning again
        warnings.simplefilter("error", CheckpointWarning)
        assert main(["train", "--config", str(r2 / "config.yaml"), "--max-steps", "1"] + over) == 0
    out = capsys.readouterr().out
    assert "checkpoint step 0 holds weights only" in out and "[resume] from checkpoint step 0" in out
    assert (r2 / "meta_step_1.json").exists()
    # an explicit --resume 0 takes the imported weights too (from step 0: they are the step-0 weights on disk)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CheckpointWarning)
        assert main(["train", "--config", str(r2 / "config.yaml"), "--max-steps", "2", "--resume", "0"] + over) == 0
    assert "[resume] from checkpoint step 0" in capsys.readouterr().out


def test_eval_and_generate_run_on_the_runs_thread_setting(tmp_path, monkeypatch):
    "generate, eval and eval --tasks set torch's threads from the run's training.num_threads (1 here), not from auto."
    import mamba3_lite.cli as cli_mod
    run = tiny_run(tmp_path / "run")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")                           # what `auto` would take
    seen = {}
    def tasks_stub(*args):                                                # lm-eval itself is tests/test_harness.py's
        seen["tasks"] = torch.get_num_threads()
        return 0
    monkeypatch.setattr(cli_mod, "eval_tasks", tasks_stub)
    before = torch.get_num_threads()
    try:
        for name, argv in (("generate", ["generate", "--checkpoint-dir", str(run), "--prompt", "x", "--max-new-tokens", "1"]),
                           ("tasks", ["eval", "--checkpoint-dir", str(run), "--tasks", "t"])):
            torch.set_num_threads(2)
            assert main(argv) == 0
            seen.setdefault(name, torch.get_num_threads())
    finally: torch.set_num_threads(before)
    print(seen)
    assert seen == {"generate": 1, "tasks": 1}


def test_export_refuses_a_missing_run_in_one_line(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nothing"), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "checkpoint directory not found" in err
    assert not (tmp_path / "hf").exists()


@pytest.mark.skipif(not RANKS, reason="MAMBA3_LITE_GPT2_RANKS not set (.ci/run provides the GPT-2 ranks offline)")
def test_imported_run_generates_and_evaluates_like_the_original(tmp_path, capsys, monkeypatch):
    texts = tmp_path / "texts"
    texts.mkdir()
    for i in range(40):
        (texts / f"m{i}.py").write_text("\n".join(f"def f_{i}_{j}(x):\n    return x * {j}\n" for j in range(10)))
    assert main(["prepare", str(texts), "--out", str(tmp_path / "data"), "--include", "*.py", "--val-tokens", "2048"]) == 0
    run = tiny_run(tmp_path / "run", tmp_path / "data")
    _, _, meta = load_trained(run, log=lambda s: None)
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(meta["config"]))   # the same data section (window length)
    assert main(["export", str(run), str(tmp_path / "hf")]) == 0
    assert main(["import", str(tmp_path / "hf"), "--out", str(tmp_path / "run2"), "--config", str(tmp_path / "base.yaml")]) == 0
    capsys.readouterr()
    outs = {}
    for name in ("run", "run2", "hf"):           # a run, the run imported from its export, and the export read as it is
        assert main(["generate", "--checkpoint-dir", str(tmp_path / name), "--prompt", "def f(x):",
                     "--max-new-tokens", "6", "--temperature", "0"]) == 0
        # a run evaluates its own data; an exported model directory names none (nor its window length)
        data = ["--data-path", str(tmp_path / "data"), "--seq-len", "32"] if name == "hf" else []
        assert main(["eval", "--checkpoint-dir", str(tmp_path / name), "--max-batches", "2", "--batch-size", "2", "--quiet"] + data) == 0
        gen, ev = [l for l in capsys.readouterr().out.splitlines() if not l.startswith("[cpu]")]   # (auto threads' note)
        outs[name] = (gen, ev.split(" | ", 1)[1].rsplit(" | saved=", 1)[0].rsplit(" | not saved", 1)[0])   # the numbers, not the step or file
        if name == "hf": assert ev.endswith("not saved (a model directory is never written into; --output FILE keeps the result)")
        else: assert ev.endswith(str((run if name == "run" else tmp_path / name) / "eval.jsonl"))
    print(outs)
    assert outs["run"] == outs["run2"] == outs["hf"]  # exact: equal weights and windows, the same commands
    # the numbers were appended beside metrics.jsonl (nothing in the model directory), two more after a second eval
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)   # a terminal: the progress bar is drawn
    assert main(["eval", "--checkpoint-dir", str(run), "--max-batches", "1", "--batch-size", "2"]) == 0
    assert "eval: 100%" in capsys.readouterr().err
    recs = [json.loads(l) for l in (run / "eval.jsonl").read_text().splitlines()]
    assert [(r["step"], r["batches"], r["data_path"]) for r in recs] == [(2, 2, str(tmp_path / "data")), (2, 1, str(tmp_path / "data"))]
    assert not (tmp_path / "hf" / "eval.jsonl").exists()                       # a model directory is never written into
