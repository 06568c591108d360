"""The `mamba3-lite` console script and the quickstart main job, run as a user would (subprocesses)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

RANKS = os.environ.get("MAMBA3_LITE_GPT2_RANKS")
needs_ranks = pytest.mark.skipif(not RANKS, reason="MAMBA3_LITE_GPT2_RANKS not set (.ci/run provides the GPT-2 ranks offline)")
CLI = [sys.executable, "-c", "import sys; from mamba3_lite.cli import main; sys.exit(main())"]


def run(args, env=None, cwd=None, timeout=600):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)


def test_help_lists_every_command():
    r = run(["--help"])
    assert r.returncode == 0, r.stderr
    for name in ("quickstart", "prepare", "train", "eval", "generate", "export", "import", "install-tokenizer"):
        assert name in r.stdout


def test_help_is_fast_and_accurate():
    "Every command's --help without importing torch (~0.2 s instead of 5-10 s), the top-level help names what each does."
    code = ("import sys, contextlib, io; from mamba3_lite.cli import COMMANDS, main\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "    rcs = [main([c, '--help']) for c in COMMANDS] + [main(['--help'])]\n"
            "print(rcs, 'torch' in sys.modules); print(out.getvalue())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    first, help_ = r.stdout.split("\n", 1)
    assert first == f"{[0] * 9} False", (first, r.stderr)
    top = help_[help_.index("usage: mamba3-lite COMMAND"):]
    prep = next(l for l in top.splitlines() if l.strip().startswith("prepare "))
    ev = next(l for l in top.splitlines() if l.strip().startswith("eval "))
    assert all(w in prep for w in ("text", ".jsonl", ".parquet", "Hugging Face")), prep
    assert all(w in ev for w in ("perplexity", "bits per byte", "--tasks")), ev


def test_version():
    from mamba3_lite import __version__
    r = run(["--version"])
    assert (r.returncode, r.stdout) == (0, f"mamba3-lite {__version__}\n")


def test_flags_and_defaults_agree_across_commands():
    from mamba3_lite.cli import BOOTSTRAP_ITERS, eval_parser, generate_parser, prepare_parser, quickstart_parser, train_parser
    inc = ["--include", "*.py", "*.pyi", "--include", "*.txt"]           # several after one flag, or the flag repeated
    p, q = prepare_parser().parse_args(["x", "--out", "o"] + inc), quickstart_parser().parse_args(inc)
    assert p.include == q.include == ["*.py", "*.pyi", "*.txt"]
    assert p.workers == q.workers == min(4, os.cpu_count() or 1)
    ev, gen = eval_parser().parse_args(["--checkpoint-dir", "r"]), generate_parser().parse_args(["--checkpoint-dir", "r", "--prompt", "x"])
    assert ev.device == gen.device == "auto" and "auto" in train_parser()._option_string_actions["--device"].choices
    assert BOOTSTRAP_ITERS == 100_000 and ev.bootstrap_iters is None           # None = lm-eval's default, standard errors on


def test_train_finds_the_checkpoints_of_a_run_directory(tmp_path, monkeypatch):
    "`train --checkpoint-dir runs/NAME` resumes the run in runs/NAME/checkpoints; a new folder is a new run; both absolute."
    from mamba3_lite.cli import _cli_config, train_parser
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "q" / "checkpoints").mkdir(parents=True)
    (tmp_path / "runs" / "q" / "checkpoints" / "meta_step_1.json").write_text("{}")
    for given, want in (("runs/q", "runs/q/checkpoints"), ("runs/q/checkpoints", "runs/q/checkpoints"), ("runs/new", "runs/new")):
        cfg = _cli_config(train_parser().parse_args(["--config", "tiny_cpu", "--checkpoint-dir", given, "--data-path", "d"]))
        assert (cfg.training.checkpoint_dir, cfg.data.data_path) == (str(tmp_path / want), str(tmp_path / "d")), given


def test_device_cuda_without_cuda_is_one_line(tmp_path, capsys):
    import torch
    from mamba3_lite.cli import main
    if torch.cuda.is_available(): pytest.skip("this torch sees a CUDA device")
    for cmd in (["eval", "--checkpoint-dir", str(tmp_path)], ["generate", "--checkpoint-dir", str(tmp_path), "--prompt", "x"]):
        assert main(cmd + ["--device", "cuda"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--device cuda:" in err and "sees no CUDA device" in err and "Traceback" not in err, err


def test_unknown_command_is_one_line():
    r = run(["fly"])
    assert r.returncode == 2
    assert "unknown command 'fly'" in r.stderr and "Traceback" not in r.stderr


def _no_network_env(tmp_path):
    "No ranks anywhere, tiktoken's download refused at once by a dead proxy, pip without any index or wheel dir."
    env = {k: v for k, v in os.environ.items() if k != "MAMBA3_LITE_GPT2_RANKS"}
    env.update(TIKTOKEN_CACHE_DIR=str(tmp_path / "cache"), HTTPS_PROXY="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9",
               PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(tmp_path))
    return env


@pytest.mark.parametrize("offline", [True, False])
def test_quickstart_without_ranks_says_how_to_provide_them(tmp_path, offline):
    args = ["quickstart", "--run-dir", str(tmp_path / "run")] + (["--offline"] if offline else [])
    r = run(args, env=_no_network_env(tmp_path), timeout=180)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert "37a91a3921809d9f44748ffc73c0a55c9f366c85a3ef5c2ae0cc09540432eb96" in r.stderr and "pip download" not in r.stderr
    assert "MAMBA3_LITE_GPT2_RANKS" in r.stderr and "install-tokenizer" in r.stderr
    assert ("openai-whisper source archive on PyPI" in r.stdout) != offline  # the PyPI fallback is tried unless --offline
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing was trained


def _python_corpus(root: Path, n_files: int = 80) -> Path:
    "A small corpus of Python-looking text (deterministic)."
    root.mkdir(parents=True)
    for i in range(n_files):
        lines = [line for j in range(12) for line in (
            f"def function_{i}_{j}(x, y={j}):", f'    """Return x scaled by {j} plus y."""', f"    return x * {j} + y", "")]
        (root / f"mod_{i:02d}.py").write_text("\n".join(lines))
    return root


@needs_ranks
def test_quickstart_end_to_end_on_a_small_corpus(tmp_path):
    data = _python_corpus(tmp_path / "texts")
    run_dir = tmp_path / "run"
    args = ["quickstart", "--data-path", str(data), "--include", "*.py", "--val-tokens", "4096", "--run-dir", str(run_dir), "--max-steps", "6",
            "--max-new-tokens", "8", "--seed", "3"]
    r = run(args, cwd=Path(__file__).resolve().parent.parent)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert "[quickstart] validation loss" in r.stdout and "[quickstart] sample:" in r.stdout
    assert (run_dir / "loss.png").stat().st_size > 1000
    assert (run_dir / "checkpoints" / "metrics.jsonl").exists()
    assert list((run_dir / "checkpoints").glob("meta_step_6.json"))
    assert (run_dir / "data" / "train").is_dir() and (run_dir / "data" / "val").is_dir()
    assert f"mamba3-lite eval --checkpoint-dir {run_dir}" in r.stdout           # the next commands take the run directory
    cfg = json.loads((run_dir / "checkpoints" / "meta_step_6.json").read_text())["config"]
    assert (cfg["data"]["data_path"], cfg["training"]["checkpoint_dir"]) == (str(run_dir / "data"), str(run_dir / "checkpoints"))
    # a second run resumes at step 6 instead of training again, and reuses the prepared shards
    r2 = run(args, cwd=Path(__file__).resolve().parent.parent)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert "resume" in r2.stdout.lower()
