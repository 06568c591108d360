"""The `mamba3-lite` console script and the quickstart main job, run as a user would (subprocesses)."""
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
    # a second run resumes at step 6 instead of training again, and reuses the prepared shards
    r2 = run(args, cwd=Path(__file__).resolve().parent.parent)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert "resume" in r2.stdout.lower()
