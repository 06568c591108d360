"""Reliability of what the commands write: a run directory whose metas are gone is refused, not restarted over its
step files; nothing is written through a symbolic link; eval prints its result before it records it; every
filesystem failure (a read-only directory, a full disk, the file-size limit, a name too long) is one line, exit 2,
with the path and the reason, and nothing partial is committed; and the messages that misled: import's
pad_vocab_size_multiple, a config that is not UTF-8, a corpus prepare cannot split, a second signal during a long
torch call, the command import prints, option values that are not numbers, more threads than CPUs.
Real mounts (a private user and mount namespace) where this machine allows them; tiny models, a few steps each."""
import json
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mamba3_lite import cli as CLI
from mamba3_lite.checkpoint import CheckpointManager, CheckpointWarning
from mamba3_lite.testing import run_captured, run_in_mounts
from test_reliability import ENV, ROOT, one_line, tiny_cfg, write_yaml
from test_reliability_input import corpus, needs_gpt2, prepared  # noqa: F401  (prepared: a module-scoped fixture)
from test_reliability_run import snapshot

QUIET = lambda s: None  # noqa: E731
COMMANDS = ("import json, sys; from mamba3_lite.testing import run_commands; "
            "print(json.dumps(run_commands(json.loads(sys.argv[1]))))")


def trained(run, max_steps=4, **training):
    "A tiny run on dummy tokens trained to `max_steps` through the command line; its config file."
    f = write_yaml(run.parent / f"{run.name}.yaml", tiny_cfg(run, max_steps=max_steps, **training))
    rc, _, err = run_captured(CLI.train_cli, ["--config", str(f)])
    assert rc == 0, err
    return f


def no_temporaries(root):
    return [str(p) for p in Path(root).rglob("*.tmp")]


# B-1 -- a run directory that holds step files is a run -----------------------------------------------------------
def test_a_run_whose_metas_are_all_gone_is_refused_and_no_step_file_is_overwritten(tmp_path):
    run = tmp_path / "run"
    f = trained(run, max_steps=8, save_every=2)
    for p in run.glob("meta_step_*.json"): p.unlink()          # weights, optimizer state and metrics stay
    before = snapshot(run)
    rc, out, err = run_captured(CLI.train_cli, ["--config", str(f)])
    print(f"exit {rc}: {err.strip()}")
    assert rc == 1 and one_line(err) and "step=" not in out, (out, err)
    assert str(run / "meta_step_8.json") in err and str(run / "meta_step_2.json") in err and "move" in err, err
    assert snapshot(run) == before                             # steps 2-8 and metrics.jsonl as they were


def test_a_meta_that_is_a_directory_is_a_broken_step_skipped_and_kept(tmp_path):
    run = tmp_path / "run"
    f = trained(run, max_steps=6, save_every=2)
    (run / "meta_step_6.json").unlink()
    (run / "meta_step_6.json").mkdir()
    with pytest.warns(CheckpointWarning, match=re.escape(f"{run / 'meta_step_6.json'}")):
        rc, out, err = run_captured(CLI.train_cli, ["--config", str(f), "--max-steps", "8"])
    print(f"exit {rc}: {err.strip()}")
    assert rc == 0 and "[resume] from checkpoint step 4" in out, (out, err)
    (moved,) = (run / "abandoned").glob("after_4_*")
    assert (moved / "meta_step_6.json").is_dir() and (moved / "model_step_6.safetensors").is_file()
    assert CheckpointManager(run).latest_step() == 8


# B-2 -- nothing is written through a symbolic link -------------------------------------------------------------------
@pytest.mark.parametrize("name", [".lock", "metrics.jsonl"])
def test_a_symlinked_lock_or_metrics_file_is_refused_and_its_target_untouched(tmp_path, name):
    run = tmp_path / "run"
    f = trained(run, max_steps=2, save_every=2)
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    (run / name).unlink()
    (run / name).symlink_to(outside)
    rc, out, err = run_captured(CLI.train_cli, ["--config", str(f), "--max-steps", "4"])
    print(f"exit {rc}: {err.strip()}")
    assert rc == 2 and one_line(err) and f"{run / name}: is a symbolic link" in err, (out, err)
    assert outside.read_text() == "precious\n" and (run / name).is_symlink()
    assert CheckpointManager(run).list_steps() == [2]          # nothing trained into the run


def test_a_symlinked_loss_png_is_replaced_not_followed(tmp_path):
    run = tmp_path / "run"
    f = trained(run, max_steps=2, save_every=2)
    outside = tmp_path / "outside.png"
    outside.write_bytes(b"precious")
    (run / "loss.png").unlink()
    (run / "loss.png").symlink_to(outside)
    rc, out, err = run_captured(CLI.train_cli, ["--config", str(f), "--max-steps", "4"])
    assert rc == 0, err
    assert outside.read_bytes() == b"precious"
    assert not (run / "loss.png").is_symlink() and (run / "loss.png").read_bytes()[:4] == b"\x89PNG"


# B-3 (and B-2's eval.jsonl) -- eval prints its result first; a record it cannot write is a one-line warning ---------
def _eval_args(run, data):
    return ["eval", "--checkpoint-dir", str(run), "--data-path", str(data), "--max-batches", "1", "--quiet"]


def _kept_result(rc, out, err, record):
    print(f"exit {rc}: {out.strip()} / {err.strip()}")
    assert rc == 0 and "val_loss=" in out and "bits_per_byte=" in out, (out, err)
    assert one_line(err) and "warning" in err and str(record) in err and "Traceback" not in err, err


@pytest.mark.parametrize("what", ["directory", "symlink"])
def test_eval_keeps_its_result_when_eval_jsonl_is_a_directory_or_a_link(prepared, tmp_path, what):
    data, run, _ = prepared
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    record, outside = copy / "eval.jsonl", tmp_path / "outside.jsonl"
    outside.write_text("precious\n")
    record.unlink(missing_ok=True)
    record.mkdir() if what == "directory" else record.symlink_to(outside)
    with pytest.warns(UserWarning) as caught:
        rc, out, err = run_captured(CLI.main, _eval_args(copy, data))
    err += "".join(f"mamba3-lite eval: warning: {w.message} ({w.category.__name__})\n" for w in caught)   # pytest holds them
    _kept_result(rc, out, err, record)
    assert outside.read_text() == "precious\n"


def test_eval_on_a_read_only_run_prints_its_result_and_warns_in_one_line(prepared, tmp_path):
    data, run, _ = prepared
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    r = run_in_mounts([sys.executable, "-m", "mamba3_lite.cli", *_eval_args(copy, data)], [(copy, "ro")],
                      cwd=ROOT, env=ENV)
    if r is None: pytest.skip("no user and mount namespace for a read-only mount")
    _kept_result(r.returncode, r.stdout, r.stderr, copy / "eval.jsonl")
    assert "Read-only file system" in r.stderr and not (copy / "eval.jsonl").exists()


# B-4, B-5 -- read-only, full and size-limited targets: one line, exit 2, the path, the reason, nothing committed -----
def _targets(root):
    return {"train": root / "train" / "run", "prepare": root / "prepare" / "data", "export": root / "export" / "hf",
            "import": root / "import" / "run"}


def _commands(prepared, cfg, t):
    data, run, hf = prepared
    return {"train": ["train", "--config", str(cfg), "--checkpoint-dir", str(t["train"])],
            "prepare": ["prepare", str(data.parent / "texts"), "--out", str(t["prepare"]), "--val-tokens", "1500",
                        "--shard-size-tokens", "1000000", "--workers", "1", "--quiet"],
            "export": ["export", str(run), str(t["export"])],
            "import": ["import", str(hf), "--out", str(t["import"])]}


def _committed(t):
    "The commit records each command would have left in its target."
    return {"train": sorted(t["train"].glob("meta_step_*.json")), "prepare": sorted(t["prepare"].glob("*/manifest.json")),
            "export": [p for p in ("config.json", "model.safetensors", "pytorch_model.bin") if (t["export"] / p).exists()],
            "import": sorted(t["import"].glob("meta_step_*.json")) + sorted(t["import"].glob("config.yaml"))}


LIMIT = 16384


@pytest.mark.parametrize("kind,reason", [("read-only", "Read-only file system"), ("full", "disk full writing"),
                                         ("file-size limit", f"file-size limit (ulimit -f) of {LIMIT} bytes reached writing")])
def test_each_writing_command_on_a_failing_filesystem_is_one_line(prepared, tmp_path, kind, reason):
    root = tmp_path / "target"
    t = _targets(root)
    for d in t.values(): d.parent.mkdir(parents=True)
    cfg = write_yaml(tmp_path / "c.yaml", tiny_cfg(t["train"], max_steps=2, save_every=2))
    argvs = _commands(prepared, cfg, t)
    cmd = [sys.executable, "-c", COMMANDS, json.dumps(list(argvs.values()))]
    env = dict(ENV, PYTHONDONTWRITEBYTECODE="1")
    if kind == "file-size limit":
        limit = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))  # noqa: E731
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, preexec_fn=limit)
    else:
        mounts = [(root, "ro")] if kind == "read-only" else [(d.parent, "tmpfs", "1m", 16384) for d in t.values()]
        r = run_in_mounts(cmd, mounts, cwd=ROOT, env=env)
        if r is None: pytest.skip("no user and mount namespace for a read-only or small mount")
    assert r.returncode == 0, r.stderr[-3000:]
    results = dict(zip(argvs, json.loads(r.stdout.strip().splitlines()[-1])))
    for name, (rc, out, err) in results.items():
        print(f"{name}: exit {rc}: {err.strip()[-600:]}")
    for name, (rc, out, err) in results.items():
        assert rc == 2 and one_line(err), (name, rc, err)
        assert reason in err and str(root / name) in err, (name, err)
    assert not any(_committed(t).values()), _committed(t)       # nothing partial committed
    assert not no_temporaries(root), no_temporaries(root)


# B-6 -- a path component over 255 bytes -------------------------------------------------------------------------------
def test_a_name_too_long_is_one_line_in_every_command(prepared, tmp_path):
    data, run, hf = prepared
    long = tmp_path / ("x" * 300)
    cfg = write_yaml(tmp_path / "c.yaml", tiny_cfg(tmp_path / "run", max_steps=2))
    argvs = {"train": ["train", "--config", str(cfg), "--checkpoint-dir", str(long / "run")],
             "prepare": ["prepare", str(data.parent / "texts"), "--out", str(long), "--quiet"],
             "export": ["export", str(run), str(long)],
             "import": ["import", str(hf), "--out", str(long)],
             "eval": ["eval", "--checkpoint-dir", str(long)]}
    for name, argv in argvs.items():
        rc, out, err = run_captured(CLI.main, argv)
        print(f"{name}: exit {rc}: {err.strip()[:80]}...{err.strip()[-60:]}")
        assert rc == 2 and one_line(err) and f"{long}" in err and "File name too long" in err, (name, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml"]


# B-7 -- import: pad_vocab_size_multiple is checked, naming the field ---------------------------------------------------
@pytest.mark.parametrize("value", [0, -3, 10**12, 2.5, True])
def test_import_refuses_a_bad_pad_vocab_size_multiple_naming_it(prepared, tmp_path, value):
    hf = tmp_path / "hf"
    shutil.copytree(prepared[2], hf)
    config = json.loads((hf / "config.json").read_text())
    config["pad_vocab_size_multiple"] = value
    (hf / "config.json").write_text(json.dumps(config))
    rc, out, err = run_captured(CLI.import_cli, [str(hf), "--out", str(tmp_path / "run")])
    print(f"exit {rc}: {err.strip()}")
    assert rc == 2 and one_line(err), (out, err)
    assert f"{hf / 'config.json'}: pad_vocab_size_multiple: expected an integer from 1 to vocab_size" in err, err
    assert "embedding" not in err and not (tmp_path / "run").exists()


# B-8 -- a config file that is not UTF-8 ----------------------------------------------------------------------------------
def test_a_config_that_is_not_utf8_is_one_line_naming_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"training:\n  lr: 0.001  # \x85\n")
    rc, out, err = run_captured(CLI.train_cli, ["--config", str(bad)])
    print(f"exit {rc}: {err.strip()}")
    assert rc == 2 and one_line(err) and f"{bad}: not UTF-8 text" in err and "0x85" in err, err


# B-9 -- prepare says what is wrong with a corpus it cannot split --------------------------------------------------------
@needs_gpt2
@pytest.mark.parametrize("case", ["empty", "one document"])
def test_prepare_names_the_corpus_problem_not_the_val_setting(tmp_path, case):
    texts = tmp_path / "texts"
    texts.mkdir()
    if case == "empty":
        (texts / "a.txt").write_text("")
        (texts / "b.jsonl").write_text("")
        argv = [str(texts), "--out", str(tmp_path / "out"), "--quiet"]
        says = ["no documents", "a.txt", "empty"]
    else:
        (texts / "a.txt").write_text("def f(x):\n    return x\n" * 50)
        argv = [str(texts), "--out", str(tmp_path / "out"), "--val-fraction", "0.000001", "--quiet"]
        says = ["one document", "cannot be split", "at least two documents"]
    rc, out, err = run_captured(CLI.prepare_cli, argv)
    print(f"exit {rc}: {err.strip()}")
    assert rc == 2 and one_line(err) and all(s in err for s in says), err
    assert "smaller --val-tokens" not in err and not list((tmp_path / "out").glob("*/manifest.json"))


# B-10 -- a second signal during one long torch call exits at once ---------------------------------------------------------
LONG_CALL = """
import sys, time, torch
from pathlib import Path
from mamba3_lite import train as T
marks, real, calls = Path(sys.argv[1]), T.train_step, []
a = torch.eye(2048)
t = time.perf_counter(); torch.mm(a, a); one = time.perf_counter() - t
k = max(2, min(62, int(60 / max(one, 1e-3) / 2) + 1))       # 2k - 1 products of 2048 x 2048: about 60 s, one torch call
def step(*args, **kwargs):
    calls.append(1)
    if len(calls) == 3:
        (marks / "in_call").touch()
        torch.linalg.matrix_power(a, 2 ** k - 1)
        (marks / "call_done").touch()
    return real(*args, **kwargs)
T.train_step = step
from mamba3_lite.cli import train_cli
sys.exit(train_cli(sys.argv[2:]))
"""


def test_a_second_signal_during_a_long_torch_call_exits_at_once(tmp_path):
    run, marks = tmp_path / "run", tmp_path / "marks"
    marks.mkdir()
    f = write_yaml(tmp_path / "c.yaml", tiny_cfg(run, max_steps=100, save_every=1000))
    p = subprocess.Popen([sys.executable, "-c", LONG_CALL, str(marks), "--config", str(f)], cwd=ROOT, env=ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 180
        while not (marks / "in_call").exists():
            assert p.poll() is None and time.time() < deadline, p.communicate()[1][-3000:]
            time.sleep(0.02)
        time.sleep(0.2)
        p.send_signal(signal.SIGINT)                        # Ctrl-C ...
        time.sleep(0.3)
        t = time.time()
        p.send_signal(signal.SIGINT)                        # ... and Ctrl-C again, 0.3 s later, while the call still runs
        _, err = p.communicate(timeout=120)
        waited = time.time() - t
    finally:
        if p.poll() is None: os.killpg(p.pid, signal.SIGKILL); p.wait()
    print(f"exit {p.returncode} {waited:.2f} s after the second signal: {err.strip()[-300:]}")
    assert p.returncode == 130 and "second SIGINT: exiting now, without a checkpoint" in err, err[-3000:]
    assert not (marks / "call_done").exists() and CheckpointManager(run).list_steps() == []


# B-11 -- the command import prints is one a shell runs as printed ---------------------------------------------------------
def test_import_prints_a_shell_quoted_command(prepared, tmp_path):
    out = tmp_path / "dir with spaces" / "run"
    rc, stdout, err = run_captured(CLI.import_cli, [str(prepared[2]), "--out", str(out)])
    assert rc == 0, err
    command = re.search(r"continue training with: (.+)$", stdout.strip()).group(1)
    print(command)
    assert shlex.split(command) == ["mamba3-lite", "train", "--config", str(out / "config.yaml")], command


# B-12 -- an option value that is not a number names the option and what it expects -------------------------------------------
@pytest.mark.parametrize("command,option,expects", [
    ("train", "--eval-every", "a positive integer"), ("train", "--resume", "a checkpoint step (an integer >= 0)"),
    ("train", "--seed", "an integer in [0, 2**32 - 1]"), ("eval", "--bootstrap-iters", "an integer >= 0"),
    ("eval", "--limit", "a number > 0"), ("quickstart", "--max-steps", "a positive integer")])
def test_an_option_value_that_is_not_a_number_names_the_option(tmp_path, command, option, expects):
    base = {"train": ["--config", "tiny_cpu"], "eval": ["--checkpoint-dir", str(tmp_path)], "quickstart": []}[command]
    rc, out, err = run_captured(CLI.main, [command, *base, option, "abc"])
    print(f"exit {rc}: {err.strip()}")
    assert rc == 2 and one_line(err) and f"argument {option}: expected {expects}, got 'abc'" in err, err
    assert "invalid" not in err and "_" not in err.split(option)[1], err


# B-13 -- more threads than CPUs -------------------------------------------------------------------------------------------------
def test_more_threads_than_cpus_is_refused_in_one_line(tmp_path):
    f = write_yaml(tmp_path / "c.yaml", tiny_cfg(tmp_path / "run", max_steps=2))
    r = subprocess.run([sys.executable, "-m", "mamba3_lite.cli", "train", "--config", str(f), "--set",
                        "training.num_threads=100000"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    cpus = len(os.sched_getaffinity(0))
    print(f"exit {r.returncode}: {r.stderr.strip()}")
    assert r.returncode == 2 and one_line(r.stderr), r.stderr[-3000:]
    assert "training.num_threads=100000" in r.stderr and f"{cpus} CPU" in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()
