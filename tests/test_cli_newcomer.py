"""The command line as a newcomer meets it, part two: a small corpus's split, a stop request heard at once, a GPU
config refused on a CPU, runs that do not share a directory, a resumed run's continuous schedule, validation losses
that say what they cover, Jupyter from the dev extra, tokenizers beyond GPT-2 (an official-layout model included),
and the small things (one warning, nothing written into a model directory, the options in the banner)."""
import configparser
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from mamba3_lite.cli import main
from mamba3_lite.logger import read_metrics
from mamba3_lite.testing import run_captured

ROOT = Path(__file__).resolve().parent.parent
RANKS = os.environ.get("MAMBA3_LITE_GPT2_RANKS")
needs_ranks = pytest.mark.skipif(not RANKS, reason="MAMBA3_LITE_GPT2_RANKS not set (.ci/run provides the GPT-2 ranks offline)")
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}
CLI = [sys.executable, "-m", "mamba3_lite.cli"]


def installed_or_skip(module: str, extra: str):
    "Skip where `module` is missing, except under CI (`.ci/run` installs the extra, so missing there is a failure)."
    import importlib.util
    if importlib.util.find_spec(module) is None:
        if os.environ.get("CI"): pytest.fail(f"{module} is not installed: .ci/run installs it with the {extra} extra")
        pytest.skip(f"{module} not installed (pip install -e '.[{extra}]')")


def tiny_yaml(path: Path, **training) -> Path:
    "A tiny run on dummy tokens (vocabulary 256, 2 windows of 16 per step): seconds on a CPU."
    t = dict(micro_batch_size=2, gradient_accumulation_steps=1, max_steps=6, warmup_steps=2, lr=3e-3, eval_every=100,
             save_every=100, eval_batches=1, log_every=1, num_threads=1, seed=3, device="cpu", compile=False)
    t.update(training)
    cfg = {"model": {"preset": "tiny", "vocab_size": 256}, "data": {"dummy": True, "max_seq_len": 16}, "training": t}
    path.write_text(yaml.safe_dump(cfg))
    return path


def cli(argv, cwd):
    "(exit code, stdout, stderr) of `mamba3-lite ARGV` run in this process from `cwd`."
    old = os.getcwd()
    os.chdir(cwd)
    try: return run_captured(main, [str(a) for a in argv])
    finally: os.chdir(old)


def cli_process(argv, cwd, timeout=600):
    "(exit code, stdout, stderr) of `mamba3-lite ARGV` as its own process: warnings reach stderr as a user sees them."
    r = subprocess.run(CLI + [str(a) for a in argv], env=ENV, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def documents(root: Path, n: int, reps: int = 148) -> Path:
    "`n` text files of Python-looking text, about 4,000 GPT-2 tokens each at the default `reps`."
    root.mkdir(parents=True)
    for i in range(n):
        (root / f"doc_{i:02d}.txt").write_text("".join(f"def f_{i}_{j}(x, y={j}):\n    return x * {j} + y  # {i}\n\n"
                                                       for j in range(reps)))
    return root


def manifest(d: Path, split: str) -> dict:
    return json.loads((d / split / "manifest.json").read_text())


# ------------------------------------------------------------------------------------------ 1. a small corpus's split
@needs_ranks
def test_a_small_corpus_keeps_most_of_itself_for_training_and_a_large_val_split_is_said_loudly(tmp_path):
    texts = documents(tmp_path / "my_texts", 18)               # 18 documents, ~74k tokens
    rc, out, err = cli_process(["quickstart", "--data-path", "my_texts", "--max-steps", "1", "--max-new-tokens", "4",
                                "--run-dir", "runs/q"], tmp_path)
    assert rc == 0, err[-2000:]
    data = tmp_path / "runs" / "q" / "data"
    n = {s: manifest(data, s)["n_documents"] for s in ("train", "val")}
    assert n == {"train": 17, "val": 1}, n                     # 1% of the corpus, at least one batch: one document
    assert "are held out for validation" in out and "[quickstart] train: " in out and "evaluated on " in out, out
    assert "the training split holds only" not in err, err
    # a fixed validation size that takes most of a small corpus is said, in one line
    rc, out, err = cli_process(["prepare", texts, "--out", tmp_path / "fixed", "--val-tokens", "65536", "--quiet"], tmp_path)
    assert rc == 0, err
    lines = [l for l in err.splitlines() if "the training split holds only" in l]
    assert len(lines) == 1 and "less than twice the validation split" in lines[0], err
    # prepare's default scales too: 1%, at least one batch of the tiny_cpu config
    rc, out, err = cli(["prepare", texts, "--out", tmp_path / "default", "--quiet"], tmp_path)
    assert rc == 0 and manifest(tmp_path / "default", "val")["n_tokens"] >= 2049, err
    assert manifest(tmp_path / "default", "train")["n_documents"] == 17


# ------------------------------------------------------------------------------------------ 2. a stop request, heard at once
def _reader(stream, lines: list):
    for line in iter(stream.readline, ""): lines.append((time.monotonic(), line.rstrip("\n")))


def _wait_for(lines, text, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        hit = next((t for t, l in lines if text in l), None)
        if hit is not None: return hit
        time.sleep(0.02)
    return None


def test_a_stop_request_is_answered_at_once_and_a_step_that_outlasts_the_grace_is_abandoned(tmp_path):
    "SIGTERM during a step of minutes: one line at once, a repeat named, the step abandoned after the grace, step 0 saved."
    cfg = tiny_yaml(tmp_path / "slow.yaml", max_steps=3, gradient_accumulation_steps=20_000, eval_at_start=False,
                    stop_grace_s=2.0, checkpoint_dir=str(tmp_path / "run"))      # one step: minutes
    p = subprocess.Popen(CLI + ["train", "--config", cfg], env=ENV, cwd=tmp_path, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = [], []
    for stream, lines in ((p.stdout, out), (p.stderr, err)): threading.Thread(target=_reader, args=(stream, lines), daemon=True).start()
    try:
        assert _wait_for(out, "[train] lr ", 120), (out, err)   # the banner's last line: the loop starts
        time.sleep(1.0)
        sent = time.monotonic()
        p.send_signal(signal.SIGTERM); time.sleep(0.02); p.send_signal(signal.SIGTERM)
        said = _wait_for(err, "SIGTERM: stopping after step 1 (in progress)", 10)
        assert said is not None and said - sent < 3, err        # at once, not when the step ends
        assert _wait_for(err, "SIGTERM again within 0.1 s: the same request", 5), err
        rc = p.wait(timeout=120)
    finally:
        if p.poll() is None: p.kill(); p.wait()
    time.sleep(0.2)
    text = "\n".join(l for _, l in err)
    assert rc == 128 + signal.SIGTERM, (rc, text)
    assert "step 1 did not finish within 2 s of the request: abandoned; checkpoint step 0 saved" in text, text
    meta = json.loads((tmp_path / "run" / "meta_step_0.json").read_text())
    assert meta["tag"] == "abandoned" and meta["data_position"][0], meta
    # the saved step resumes (a short step now)
    rc, out2, err2 = cli(["train", "--config", cfg, "--max-steps", "1", "--set", "training.gradient_accumulation_steps=1"], tmp_path)
    assert rc == 0 and "[resume] from checkpoint step 0" in out2, err2[-2000:]


# ------------------------------------------------------------------------------------------ 3. a GPU config on a CPU
def test_a_gpu_config_on_a_cpu_is_refused_in_one_line_unless_told_device_cpu(tmp_path):
    import torch
    if torch.cuda.is_available(): pytest.skip("this torch sees a GPU")
    want = ("asks for the Triton SSD kernels (model.ssd_dispatch: triton) and bf16 autocast (training.precision: bf16), "
            "which need a CUDA GPU, and torch sees none; pass --device cpu")
    for argv in (["quickstart", "--config", "pretrain_a100_400m", "--max-steps", "1"],
                 ["train", "--config", "pretrain_a100_400m", "--data-path", "nowhere", "--max-steps", "1"]):
        try: r = subprocess.run(CLI + argv, env=ENV, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired: pytest.fail(f"{argv[0]} started the 434M config on a CPU (still running after 120 s)")
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and want in r.stderr, (argv, r.stderr[-2000:])
    assert not (tmp_path / "runs").exists()                     # nothing prepared, nothing trained


def test_the_first_step_time_is_printed_as_soon_as_it_is_known(tmp_path):
    rc, out, err = cli(["train", "--config", tiny_yaml(tmp_path / "c.yaml", max_steps=3, log_every=100),
                        "--checkpoint-dir", tmp_path / "run"], tmp_path)
    assert rc == 0, err
    first = [l for l in out.splitlines() if l.startswith("[train] step 1 took ")]
    assert len(first) == 1 and "2 to go: about" in first[0], out
    assert out.index(first[0]) < out.index("done: ")            # before the run ends (no log line until step 100)


# ------------------------------------------------------------------------------------------ 4. runs that do not collide
@needs_ranks
def test_two_corpora_trained_from_one_directory_get_a_run_directory_each(tmp_path):
    for name in ("mine", "other"):
        documents(tmp_path / f"{name}_texts", 4, reps=148 if name == "mine" else 150)
        assert cli(["prepare", f"{name}_texts", "--out", f"data/{name}", "--quiet"], tmp_path)[0] == 0
    outs = []
    for name in ("mine", "other", "mine"):                      # the second "mine" continues its own run
        rc, out, err = cli(["train", "--config", "tiny_cpu", "--data-path", f"data/{name}", "--max-steps", "1",
                            "--set", "training.eval_batches=1"], tmp_path)
        assert rc == 0, err[-2000:]
        outs.append(out)
    for name, out in zip(("mine", "other", "mine"), outs):
        assert f"[train] run directory {tmp_path / 'runs' / ('tiny-' + name)}" in out, out
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["tiny-mine", "tiny-other"]
    assert "already finished: step 1" in outs[-1]               # the rerun found its own run


# ------------------------------------------------------------------------------------------ 5. a resumed run's schedule
def _lrs(run: Path) -> dict:
    return {r["step"]: r["lr"] for r in read_metrics(run) if r["kind"] == "train"}


def test_more_steps_on_a_finished_run_keep_the_learning_rate_continuous(tmp_path):
    cfg = tiny_yaml(tmp_path / "c.yaml", max_steps=6, warmup_steps=2, min_lr_ratio=0.05)
    assert cli(["train", "--config", cfg, "--checkpoint-dir", tmp_path / "run"], tmp_path)[0] == 0
    shutil.copytree(tmp_path / "run", tmp_path / "rescaled")
    rc, out, err = cli(["train", "--config", cfg, "--checkpoint-dir", tmp_path / "run", "--max-steps", "10"], tmp_path)
    assert rc == 0, err
    lr = _lrs(tmp_path / "run")
    assert all(lr[s] == pytest.approx(3e-3 * 0.05) for s in (7, 8, 9, 10)), lr     # the end value, as the run left it
    line = next(l for l in out.splitlines() if l.startswith("[schedule] max_steps 6 -> 10"))
    assert "the lr stays 1.50e-04 at step 6" in line and "--rescale-schedule would rebuild it" in line, line
    assert "[train] lr cosine: warmup 2 steps to 3.00e-03, continued from 1.50e-04 at step 6" in out, out
    rc, out, err = cli(["train", "--config", cfg, "--checkpoint-dir", tmp_path / "rescaled", "--max-steps", "10",
                        "--rescale-schedule"], tmp_path)
    assert rc == 0, err
    assert _lrs(tmp_path / "rescaled")[7] > 4 * 3e-3 * 0.05     # asked for: the whole cosine stretched to 10 steps


# ------------------------------------------------------------------------------------------ 6. losses that say what they cover
def test_the_in_training_validation_loss_says_how_many_tokens_it_covers(tmp_path):
    rc, out, err = cli(["train", "--config", tiny_yaml(tmp_path / "c.yaml", max_steps=4, eval_every=2),
                        "--checkpoint-dir", tmp_path / "run"], tmp_path)
    assert rc == 0, err
    done = next(l for l in out.splitlines() if l.startswith("done: "))
    assert "val_loss " in done and " -> " in done and done.split(" | ")[1].endswith("(first 32 of 4,096 val tokens)"), done
    evals = [r for r in read_metrics(tmp_path / "run") if r["kind"] == "eval"]
    assert {(r["tokens"], r["split_tokens"]) for r in evals} == {(32, 4096)}
    from mamba3_lite.logger import metrics_figure
    legend = [t.get_text() for t in metrics_figure(tmp_path / "run").axes[0].get_legend().get_texts()]
    assert legend == ["train", "eval (first 32 of 4,096 val tokens)"], legend
    # one evaluation in a call (a fresh run without the one at step 0): one number, not "x -> x"
    rc, out, err = cli(["train", "--config", tiny_yaml(tmp_path / "d.yaml", max_steps=2, eval_at_start=False),
                        "--checkpoint-dir", tmp_path / "one"], tmp_path)
    done = next(l for l in out.splitlines() if l.startswith("done: "))
    assert " at step 2 (first 32 of 4,096 val tokens)" in done and " -> " not in done.split(" | ")[1], done
    # the banner: the options in effect
    assert "[train] ssd pytorch | reset_at_eos off | compile off | grad_checkpoint off | tokenizer gpt2" in out, out
    assert "device cpu, fp32, 1 CPU thread" in out


# ------------------------------------------------------------------------------------------ 7. notebooks one command away
def test_the_dev_extra_brings_jupyter_and_a_notebook_runs_through_nbconvert(tmp_path):
    cfg = configparser.ConfigParser(delimiters=["="]); cfg.read(ROOT / "settings.ini")
    dev = cfg["DEFAULT"]["dev_requirements"].split()
    assert "jupyter" in dev and "nbconvert" in dev, dev
    assert ".venv/bin/jupyter lab nbs/" in (ROOT / "README.md").read_text()
    installed_or_skip("nbconvert", "dev")
    if not RANKS: pytest.skip("the notebook tokenizes: MAMBA3_LITE_GPT2_RANKS not set")
    env = {**ENV, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    r = subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
                        str(ROOT / "nbs" / "05_tokenizer.ipynb"), "--output-dir", str(tmp_path)],
                       env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    cells = json.loads((tmp_path / "05_tokenizer.ipynb").read_text())["cells"]
    printed = "".join(o.get("text", "") if isinstance(o.get("text"), str) else "".join(o.get("text", []))
                      for c in cells if c["cell_type"] == "code" for o in c.get("outputs", []))
    assert "50,257 ids, EOS 50256" in printed, printed[:2000]


# ------------------------------------------------------------------------------------------ 8. tokenizers beyond GPT-2
def build_tokenizer(path: Path, texts, vocab_size: int, exact: bool = False) -> Path:
    "A byte-level BPE tokenizer.json trained on `texts`, with <|endoftext|>; `exact`: padded with added tokens to `vocab_size`."
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer, tk.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tk.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if exact: tk.add_tokens([f"<extra_{i}>" for i in range(vocab_size - tk.get_vocab_size())])
    assert not exact or tk.get_vocab_size() == vocab_size
    path.parent.mkdir(parents=True, exist_ok=True)
    tk.save(str(path))
    return path


def test_a_tokenizer_json_goes_through_prepare_train_eval_generate_export_told_once(tmp_path):
    installed_or_skip("tokenizers", "tokenizers")
    texts = documents(tmp_path / "texts", 12, reps=40)
    tok = build_tokenizer(tmp_path / "tok" / "tokenizer.json", [f.read_text() for f in sorted(texts.iterdir())], 400)
    rc, out, err = cli(["prepare", "texts", "--out", "data", "--tokenizer", tok, "--quiet"], tmp_path)
    assert rc == 0, err
    name = manifest(tmp_path / "data", "train")["tokenizer"]
    assert name.startswith("hf-") and (tmp_path / "data" / "tokenizer.json").read_bytes() == tok.read_bytes()
    tok.unlink()                                                # from here on, nobody is told
    rc, out, err = cli(["train", "--config", "tiny_cpu", "--data-path", "data", "--checkpoint-dir", "run", "--max-steps", "2",
                        "--set", "training.eval_batches=1"], tmp_path)
    assert rc == 0, err[-2000:]
    cfg = json.loads((tmp_path / "run" / "meta_step_2.json").read_text())["config"]
    from tokenizers import Tokenizer
    n_vocab = Tokenizer.from_file(str(tmp_path / "data" / "tokenizer.json")).get_vocab_size()
    assert cfg["model"]["vocab_size"] == n_vocab and cfg["data"]["tokenizer"] == str(tmp_path / "run" / "tokenizer.json"), cfg
    assert f"tokenizer {tmp_path / 'run' / 'tokenizer.json'}" in out
    rc, out, err = cli(["eval", "--checkpoint-dir", "run", "--max-batches", "1", "--batch-size", "2"], tmp_path)
    assert rc == 0 and "bits_per_byte=" in out, err
    gen = ["--prompt", "def f_3_7(x", "--max-new-tokens", "6", "--seed", "1"]
    rc, sample, err = cli(["generate", "--checkpoint-dir", "run", *gen], tmp_path)
    assert rc == 0 and sample.startswith("def f_3_7(x"), (sample, err)
    assert cli(["export", "run", "hf"], tmp_path)[0] == 0
    assert (tmp_path / "hf" / "tokenizer.json").is_file()
    rc, again, err = cli(["generate", "--checkpoint-dir", "hf", *gen], tmp_path)
    assert rc == 0 and again == sample, (again, sample, err)    # the model directory brought its tokenizer
    rc, out, err = cli(["eval", "--checkpoint-dir", "hf", "--data-path", "data", "--seq-len", "128", "--max-batches", "1"], tmp_path)
    assert rc == 0 and "not saved (a model directory is never written into" in out, (out, err)
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["config.json", "model.safetensors", "pytorch_model.bin",
                                                                    "tokenizer.json"]
    rc, out, err = cli(["eval", "--checkpoint-dir", "hf", "--data-path", "data", "--seq-len", "128", "--max-batches", "1",
                        "--output", "hf_eval.jsonl"], tmp_path)
    assert rc == 0 and json.loads((tmp_path / "hf_eval.jsonl").read_text())["tokens"] == 2 * 128 * 0 + 8 * 128
    rc, out, err = cli(["train", "--config", "tiny_cpu", "--data-path", "data", "--tokenizer", "gpt2", "--checkpoint-dir", "run2"],
                       tmp_path)
    assert rc == 2 and "was prepared with another tokenizer" in err and len(err.splitlines()) == 1, err


def test_an_official_model_without_mlp_and_with_an_untied_head_generates_with_its_tokenizer(tmp_path):
    "A model directory the official code wrote (d_intermediate 0, tie_embeddings false) plus its tokenizer.json."
    installed_or_skip("tokenizers", "tokenizers")
    model = tmp_path / "mamba3-tiny"
    shutil.copytree(ROOT / "tests" / "fixtures" / "mamba_ssm_e9594ce" / "siso_bare", model)
    config = json.loads((model / "config.json").read_text())
    assert (config["d_intermediate"], config["tie_embeddings"]) == (0, False)
    text = [f"def main():\n    print('hello {i}')\n    return {i}\n" for i in range(200)]
    build_tokenizer(model / "tokenizer.json", text, config["vocab_size"], exact=True)
    gen = ["--prompt", "def main():", "--max-new-tokens", "8", "--seed", "0"]
    rc, direct, err = cli(["generate", "--checkpoint-dir", model, *gen], tmp_path)     # stdout: the text alone
    assert rc == 0 and direct.startswith("def main():") and len(direct) > len("def main():\n"), (direct, err)
    rc, out, err = cli(["import", model, "--out", "runs/m"], tmp_path)
    assert rc == 0, err
    run_cfg = yaml.safe_load((tmp_path / "runs" / "m" / "config.yaml").read_text())
    assert (run_cfg["model"]["d_ff"], run_cfg["model"]["tie_embeddings"]) == (0, False), run_cfg["model"]
    assert run_cfg["data"]["tokenizer"] == str(tmp_path / "runs" / "m" / "tokenizer.json")
    rc, imported, err = cli(["generate", "--checkpoint-dir", "runs/m", *gen], tmp_path)
    assert rc == 0 and imported == direct, (imported, direct, err)   # the run recorded its tokenizer


# ------------------------------------------------------------------------------------------ 9. small things
def test_hf_export_folder_is_ignored_by_git():
    assert "/hf/" in (ROOT / ".gitignore").read_text().split()


def test_a_weights_only_resume_says_so_once(tmp_path):
    "Training on from an imported run: the [resume] line says the optimizer starts fresh; no warning says it again."
    rc, out, err = cli(["train", "--config", tiny_yaml(tmp_path / "c.yaml", max_steps=1), "--checkpoint-dir", "run"], tmp_path)
    assert rc == 0 and cli(["export", "run", "hf"], tmp_path)[0] == 0, err
    assert cli(["import", "hf", "--out", "imported", "--config", tmp_path / "c.yaml"], tmp_path)[0] == 0
    rc, out, err = cli_process(["train", "--config", "imported/config.yaml", "--max-steps", "2"], tmp_path)
    assert rc == 0, err
    assert out.count("holds weights only: optimizer, schedule and data order start fresh") == 1, out
    assert "optimizer starts from scratch" not in err and "warning" not in err, err
    done = next(l for l in out.splitlines() if l.startswith("done: "))
    assert "val_loss " in done and " -> " not in done.split(" | ")[1], done      # one evaluation: one number
