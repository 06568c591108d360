"""The shell commands of the README and of the usage guide (nbs/usage.md), run as a reader would run them, with a tiny budget.

README.md (rendered from nbs/index.ipynb) and the usage guide mark their fences: ```bash holds commands meant to run on a CPU, ```sh
holds commands that need a CUDA GPU. Every command of a ```bash fence (a `&&` chain counts as its parts) is either in
`RUN` — run here, in the order they are written (README first, then the guide), in one temporary directory, with the flags beside it appended to shrink its budget
— or in `NOT_RUN` with the reason it is not run here. A README command in neither fails the test, so a new or
changed command has to be classified. Each ```sh command must name the GPU it needs.

The `mamba3-lite` commands run in one Python process (`mamba3_lite.cli.main`, one torch import for all of them:
each console-script start imports torch anew, ~5 s on a 2-core machine); `.venv/bin/` is the running venv.
"""
import json
import os
import re
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
RANKS = os.environ.get("MAMBA3_LITE_GPT2_RANKS")
DOCS = ("README.md", "nbs/usage.md")   # the README, then the usage guide it links


def docs_text() -> str:
    "The README and the usage guide, in reading order."
    return "\n".join((ROOT / f).read_text(encoding="utf-8") for f in DOCS)

# command as written in the README (comments dropped, continuations joined) -> flags appended to shrink its budget
RUN = {
    ".venv/bin/mamba3-lite quickstart": ["--max-steps", "1", "--max-new-tokens", "8"],
    ".venv/bin/mamba3-lite quickstart --data-path my_texts/": ["--max-steps", "1", "--max-new-tokens", "4"],
    ".venv/bin/mamba3-lite prepare my_texts/ --out data/mine": ["--quiet"],
    ".venv/bin/mamba3-lite train --config configs/tiny_cpu.yaml --data-path data/mine": ["--max-steps", "1", "--set", "training.eval_batches=1"],
    ".venv/bin/mamba3-lite train --config tiny_cpu --data-path runs/quickstart/data --reset-at-eos":
        ["--max-steps", "1", "--set", "training.eval_batches=1"],
    ".venv/bin/mamba3-lite eval --checkpoint-dir runs/quickstart": ["--max-batches", "2"],
    '.venv/bin/mamba3-lite generate --checkpoint-dir runs/quickstart --prompt "def main():"': ["--max-new-tokens", "4"],
    ".venv/bin/mamba3-lite train --config runs/quickstart --max-steps 400": ["--max-steps", "2", "--set", "training.eval_batches=1"],
    ".venv/bin/mamba3-lite export runs/quickstart hf/tiny": [],
    ".venv/bin/mamba3-lite eval --checkpoint-dir hf/tiny --data-path runs/quickstart/data --seq-len 128": ["--max-batches", "1"],
    ".venv/bin/mamba3-lite import hf/tiny --out runs/imported --config tiny_cpu": [],
    '.venv/bin/mamba3-lite generate --checkpoint-dir runs/imported --prompt "def main():"': ["--max-new-tokens", "4"],
    ".venv/bin/mamba3-lite train --config runs/imported/config.yaml --data-path runs/quickstart/data":
        ["--max-steps", "1", "--set", "training.eval_batches=1"],
    ".venv/bin/mamba3-lite eval --checkpoint-dir runs/quickstart --tasks python_qa --include-path configs/lm_eval/":
        ["--limit", "3", "--bootstrap-iters", "0", "--batch-size", "4"],
}
# why the other CPU commands are not run here
NOT_RUN = {
    "python3 -m venv .venv": "creates the venv this test runs in (.ci/run does the same)",
    ".venv/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu":
        "network and minutes; .ci/run installs the same pin",
    ".venv/bin/pip install triton==3.7.1 -e .": "network and minutes; .ci/run installs the same pins",
    "bash .ci/run": "it is CI itself",
    ".venv/bin/pip install -e '.[dev]'": "network and minutes; .ci/run installs the dev extra",
    ".venv/bin/jupyter lab nbs/": "a notebook server for a person at a browser",
    ".venv/bin/mamba3-lite prepare my_texts/ --out data/mine-llama3 --tokenizer llama3/tokenizer.json":
        "a tokenizer file of the reader's; tests/test_cli_newcomer.py runs prepare, train, eval and generate with a tokenizer.json it builds",
    ".venv/bin/mamba3-lite train --config tiny_cpu --data-path data/mine-llama3": "needs the corpus of the command above",
    '.venv/bin/mamba3-lite generate --checkpoint-dir runs/tiny-mine-llama3 --prompt "def main():"': "needs the run of the command above",
    ".venv/bin/mamba3-lite import mamba3-siso-187m/ --out runs/mamba3-187m":
        "the official weights (downloads); tests/test_cli_newcomer.py imports an official-layout model with a tokenizer.json",
    '.venv/bin/mamba3-lite generate --checkpoint-dir runs/mamba3-187m --prompt "The capital of France is"': "needs the import above",
    "mkdir -p /tmp/whisper": "the offline tokenizer recipe downloads from PyPI (curl); no network in CI",
    "cd /tmp/whisper": "the offline tokenizer recipe (see mkdir)",
    "curl -LO https://files.pythonhosted.org/packages/35/8e/d36f8880bcf18ec026a55807d02fe4c7357da9f25aebd92f85178000c0dc/"
    "openai_whisper-20250625.tar.gz": "network",
    "echo '37a91a3921809d9f44748ffc73c0a55c9f366c85a3ef5c2ae0cc09540432eb96  openai_whisper-20250625.tar.gz' | sha256sum -c":
        "checks the downloaded archive (network)",
    "tar -xzf openai_whisper-20250625.tar.gz openai_whisper-20250625/whisper/assets/gpt2.tiktoken": "needs the download",
    "cd -": "the offline tokenizer recipe",
    ".venv/bin/mamba3-lite install-tokenizer /tmp/whisper/openai_whisper-20250625/whisper/assets/gpt2.tiktoken":
        "needs the download; tests/test_data.py runs install-tokenizer on a local file",
    ".venv/bin/mamba3-lite prepare /path/to/corpus --out data/corpus --workers 16": "a corpus of the reader's",
    ".venv/bin/python bench/doc_reset_cpu.py": "a benchmark of minutes (bench/, not CI)",
    ".venv/bin/mamba3-lite prepare fineweb-edu/sample/10BT/ --out data/fwe --workers 16": "a downloaded corpus",
    ".venv/bin/mamba3-lite prepare the-stack-py/ --text-field content --out data/stack": "a downloaded corpus",
    ".venv/bin/mamba3-lite prepare --hf-dataset HuggingFaceFW/fineweb-edu --hf-config sample-10BT --split train "
    "--max-tokens 2000000000 --out data/fwe-2b": "streams from the Hugging Face hub (network)",
    ".venv/bin/mamba3-lite prepare --hf-dataset my_dataset_saved_to_disk/ --out data/mine":
        "a dataset of the reader's; tests/test_prepare_sources.py prepares a save_to_disk directory",
}
GPU_MARKS = ("ENABLE_TRITON_KERNELS=1", "--device cuda", "--flags gpu", "torchrun")
norm = lambda c: shlex.join(shlex.split(c)).replace("'|'", "|")      # how readme_commands writes a command


def readme_commands(text: str) -> dict:
    "{'bash': [...], 'sh': [...]}: each fence's commands, comments dropped, `\\` continuations joined, `&&` chains split."
    out = {"bash": [], "sh": []}
    for lang, body in re.findall(r"^```(bash|sh)\n(.*?)^```", text, flags=re.S | re.M):
        for line in body.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if not words: continue
            part = []
            for w in words + ["&&"]:
                if w == "&&": out[lang].append(shlex.join(part).replace("'|'", "|")); part = []
                else: part.append(w)
    return out


def test_extraction_joins_continuations_and_splits_chains():
    text = "```bash\na x && b 'y z'   # note\n# only a comment\nc \\\n    --d\n```\n```python\nnot shell\n```\n```sh\ne\n```\n"
    assert readme_commands(text) == {"bash": ["a x", "b 'y z'", "c --d"], "sh": ["e"]}


def test_every_readme_command_is_run_or_has_a_reason():
    cmds = readme_commands(docs_text())
    known = {norm(c) for c in [*RUN, *NOT_RUN]}
    assert not (unknown := [c for c in cmds["bash"] if c not in known]), f"README commands neither run nor listed: {unknown}"
    assert not (gone := sorted(known - set(cmds["bash"]))), f"listed here but no longer in the README: {gone}"
    assert not (cpu := [c for c in cmds["sh"] if not any(m in c for m in GPU_MARKS)]), f"```sh commands naming no GPU: {cpu}"


def _my_texts(root: Path):
    "A reader's folder of text: stdlib sources as .txt, the first file big enough for a validation batch of its own."
    from mamba3_lite.prepare import stdlib_corpus_files
    root.mkdir()
    files = sorted(stdlib_corpus_files(), key=lambda f: -f.stat().st_size)[:12]
    for i, f in enumerate(files): (root / f"{i:02d}_{f.stem}.txt").write_text(f.read_text(encoding="utf-8", errors="replace"))


DRIVER = """
import json, os, shlex, sys, time
from mamba3_lite.cli import main
for cmd, extra in json.loads(sys.argv[1]):
    t = time.time(); words = shlex.split(cmd)
    rc = main(words[1:] + extra)
    print(f"README-CMD rc={rc} {time.time() - t:.1f}s: {cmd}", flush=True)
    if rc != 0: sys.exit(rc)
"""


@pytest.mark.skipif(not RANKS, reason="needs the GPT-2 ranks (MAMBA3_LITE_GPT2_RANKS)")
def test_readme_cpu_commands_run_in_order(tmp_path):
    run = {norm(c): extra for c, extra in RUN.items()}
    cmds = [c for c in readme_commands(docs_text())["bash"] if c in run]
    assert len(cmds) == len(run)
    _my_texts(tmp_path / "my_texts")
    (tmp_path / "configs").symlink_to(ROOT / "configs")        # the commands run from a clone's root
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for c in cmds: assert c.startswith(".venv/bin/mamba3-lite "), c
    r = subprocess.run([sys.executable, "-c", DRIVER, json.dumps([[c, run[c]] for c in cmds])], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=900)
    done = [l for l in r.stdout.splitlines() if l.startswith("README-CMD")]
    assert r.returncode == 0, ("\n".join(done), r.stdout[-2000:], r.stderr[-3000:])
    assert len(done) == len(cmds), done
    q = tmp_path / "runs" / "quickstart"
    assert (q / "checkpoints" / "metrics.jsonl").is_file() and (q / "loss.png").is_file() and (q / "data" / "val").is_dir()
    assert (tmp_path / "hf" / "tiny" / "model.safetensors").is_file()
    assert list((tmp_path / "runs" / "imported").glob("meta_step_1.json")), "train on the imported run made no step 1"
    # the newcomer path on runs/NAME: eval, generate and train found the run's checkpoints, config and data from it
    (ev,) = [json.loads(l) for l in (q / "checkpoints" / "eval.jsonl").read_text().splitlines()]
    assert (ev["step"], ev["split"], ev["batches"], Path(ev["data_path"]).resolve()) == (1, "val", 2, (q / "data").resolve()), ev
    assert (q / "checkpoints" / "meta_step_2.json").is_file(), "train --config runs/quickstart did not continue the run"
    assert not (tmp_path / "hf" / "tiny" / "eval.jsonl").exists(), "eval wrote into a model directory"   # read as it is, never written
    evals = [l for l in r.stdout.splitlines() if l.startswith("model=hf/tiny")]
    assert len(evals) == 1 and "tokens=1,024" in evals[0] and "not saved" in evals[0], evals
    # the README's runs do not collide: each corpus and preset has its own run directory, each trained its step
    for run_dir in ("runs/quickstart-my_texts/checkpoints", "runs/tiny-mine", "runs/tiny-quickstart"):
        assert (tmp_path / run_dir / "meta_step_1.json").is_file(), run_dir
    assert list((q / "checkpoints").glob("lm_eval_step2_python_qa.json")), "the example lm-eval task left no results"
    (done,) = [l for l in r.stdout.splitlines() if l.startswith("done: ") and "runs/imported" in l]
    assert " at step 1 (" in done and " -> " not in done.split(" | ")[1], done    # one evaluation: one loss, not "x -> x"
    imported = yaml.safe_load((tmp_path / "runs" / "imported" / "config.yaml").read_text())["training"]["checkpoint_dir"]
    assert Path(imported).is_absolute() and Path(imported).resolve() == (tmp_path / "runs" / "imported").resolve()


def test_the_quoted_validation_coverage_is_the_quickstart_configs():
    "The usage guide's count of validation tokens an in-training evaluation covers is tiny_cpu's eval_batches × micro-batch × length."
    from mamba3_lite.config import load_config
    t = load_config("tiny_cpu")
    n = t.training.eval_batches * t.training.micro_batch_size * t.data.max_seq_len
    docs = " ".join(docs_text().split())
    assert f"covers the first {n:,} validation tokens" in docs, f"the usage guide should say an evaluation covers {n:,} tokens"
