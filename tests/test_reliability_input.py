"""Bad input to the commands, met where a user meets it: a data path without the split layout, shards changed after
prepare, weight files that are not float tensors or not weight files at all, two prepares into one directory, and the
config values and flags that used to hang, train on or fail late. Each refusal is one line, exit 2, nothing written.
Signals in prepare and eval: one line, no temporary files left, exit 143 (SIGTERM) / 130 (SIGINT)."""
import json
import os
import pickle
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch
import yaml

from mamba3_lite import cli as CLI
from mamba3_lite import config as Cfg
from mamba3_lite.files import RunLock
from mamba3_lite.testing import gpt2_available, run_captured
from mamba3_lite.train import run_training

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
MAIN = [sys.executable, "-c", "import sys; from mamba3_lite.cli import main; sys.exit(main())"]
needs_gpt2 = pytest.mark.skipif(not gpt2_available(), reason="GPT-2 ranks not available offline (set MAMBA3_LITE_GPT2_RANKS)")


def one_line(err):
    "Exactly one line of error output and no traceback."
    return len(err.strip().splitlines()) == 1 and "Traceback" not in err


def tmp_files(root):
    return sorted(str(p.relative_to(root)) for p in Path(root).rglob("*.tmp"))


def tiny_cfg(run_dir, data_path=None, **training):
    t = dict(micro_batch_size=2, gradient_accumulation_steps=1, max_steps=2, warmup_steps=1, eval_every=100,
             save_every=2, eval_batches=1, checkpoint_dir=str(run_dir), log_every=1, num_threads=1, seed=3,
             eval_at_start=False, compile=False, device="cpu")
    t.update(training)
    data = {"dummy": True} if data_path is None else {"data_path": str(data_path)}
    return Cfg.config_from_dict({"model": {"preset": "tiny"}, "data": {**data, "max_seq_len": 16}, "training": t})


def write_yaml(path, cfg):
    path.write_text(yaml.safe_dump(Cfg.config_to_dict(cfg)))
    return path


def corpus(root, n=40, words_per_doc=300, seed=0):
    root.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    words = ["def", "return", "value", "import", "class", "self", "None", "for", "in", "range", "print", "x", "y"]
    for i in range(n):
        (root / f"d{i:03d}.txt").write_text(" ".join(rng.choice(words, words_per_doc)) + f"\n# doc {i}\n")
    return root


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    "(prepared corpus, a tiny run trained 2 steps on it, its export in the official layout)."
    if not gpt2_available():
        pytest.skip("GPT-2 ranks not available offline (set MAMBA3_LITE_GPT2_RANKS)")
    base = tmp_path_factory.mktemp("input")
    data = base / "data"
    rc, _, err = run_captured(CLI.prepare_cli, [str(corpus(base / "texts")), "--out", str(data), "--val-tokens", "1500",
                                                "--shard-size-tokens", "2000", "--workers", "1", "--quiet"])
    assert rc == 0, err
    run = base / "run"
    run_training(tiny_cfg(run, data), log=lambda s: None)
    assert run_captured(CLI.export_cli, [str(run), str(base / "hf")])[0] == 0
    return data, run, base / "hf"


# D3 -- a data path without the split layout --------------------------------------------------------------------
def test_a_split_directory_as_data_path_is_refused_by_eval_and_train(prepared, tmp_path):
    data, run, _ = prepared
    rc, out, err = run_captured(CLI.eval_cli, ["--checkpoint-dir", str(run), "--data-path", str(data / "train"),
                                               "--split", "val", "--max-batches", "1"])
    print(f"exit {rc}: {err.strip()}")
    assert rc == 2 and one_line(err) and not out, (out, err)
    assert f"{data / 'train'}: expected a prepared corpus" in err and "the 'train' split" in err, err
    assert f"pass {data}" in err, err
    f = write_yaml(tmp_path / "c.yaml", tiny_cfg(tmp_path / "run", data))
    rc, _, err = run_captured(CLI.train_cli, ["--config", str(f), "--data-path", str(data / "train")])
    print(f"exit {rc}: {err.strip()}")
    assert rc == 2 and one_line(err) and "expected a prepared corpus" in err, err
    assert not (tmp_path / "run").exists()                      # refused before the run directory was made
    rc, out, err = run_captured(CLI.eval_cli, ["--checkpoint-dir", str(run), "--data-path", str(data), "--max-batches", "1"])
    assert rc == 0 and "val_loss=" in out, err                  # the prepared root itself evaluates


# D4 -- eval verifies the shard digests ---------------------------------------------------------------------------
def test_eval_refuses_a_shard_changed_at_the_same_size(prepared, tmp_path):
    data, run, _ = prepared
    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    shard = copy / "val" / "shard_000000.bin"
    b = bytearray(shard.read_bytes()); b[-2:] = b"\x00\x00"; shard.write_bytes(bytes(b))
    rc, out, err = run_captured(CLI.eval_cli, ["--checkpoint-dir", str(run), "--data-path", str(copy), "--max-batches", "1"])
    print(f"exit {rc}: {err.strip()}")
    assert rc == 2 and one_line(err) and not out, (out, err)
    assert str(shard) in err and "sha256" in err, err


# D5, D12 -- weight files that are not float tensors, or not weight files ------------------------------------------
def _import(hf, out):
    return run_captured(CLI.import_cli, [str(hf), "--out", str(out)])


def _edited_export(prepared, tmp_path, edit):
    hf = tmp_path / "hf"
    shutil.copytree(prepared[2], hf)
    (hf / "pytorch_model.bin").unlink()
    sd = safetensors.torch.load_file(hf / "model.safetensors")
    edit(sd)
    safetensors.torch.save_file(sd, hf / "model.safetensors")
    return hf


@pytest.mark.parametrize("what", ["int32", "nan", "inf"])
def test_import_refuses_integer_and_non_finite_weights_naming_the_tensor(prepared, tmp_path, what):
    key = "backbone.layers.1.mlp.fc2.weight"
    def edit(sd):
        if what == "int32": sd[key] = sd[key].to(torch.int32)
        else: sd[key][3, 5] = float(what)
    hf = _edited_export(prepared, tmp_path, edit)
    rc, out, err = _import(hf, tmp_path / "run")
    print(f"exit {rc}: {err.strip()}")
    assert rc == 2 and one_line(err) and f"{hf / 'model.safetensors'}: {key}: " in err, (out, err)
    assert ("floating-point" in err and "torch.int32" in err) if what == "int32" else "non-finite" in err, err
    assert not (tmp_path / "run").exists()


def _safetensors_bytes(prepared):
    return (prepared[2] / "model.safetensors").read_bytes()


@pytest.mark.parametrize("kind,match", [
    ("huge_header", "header too large"), ("garbage_header", "invalid JSON in header"),
    ("truncated", "not fully covered"), ("empty", "header too small")])
def test_import_of_a_broken_safetensors_file_is_one_line(prepared, tmp_path, kind, match):
    good = _safetensors_bytes(prepared)
    body = {"huge_header": struct.pack("<Q", 2**62) + good[8:], "garbage_header": struct.pack("<Q", 64) + b"x" * 200,
            "truncated": good[:len(good) // 2], "empty": b""}[kind]
    hf = tmp_path / "hf"
    hf.mkdir()
    shutil.copy(prepared[2] / "config.json", hf)
    (hf / "model.safetensors").write_bytes(body)
    rc, out, err = _import(hf, tmp_path / "run")
    print(f"exit {rc}: {err.strip()}")
    assert rc == 2 and one_line(err), (out, err)
    assert f"{hf / 'model.safetensors'}: not a readable safetensors file" in err and match in err, err


class _Payload:
    "Unpickling this runs its payload: it creates the file `path`."
    def __init__(self, path): self.path = str(path)
    def __reduce__(self): return (exec, (f"open({self.path!r}, 'w').close()",))


@pytest.mark.parametrize("kind", ["garbage", "raw_pickle", "torch_save"])
def test_import_of_a_garbage_or_pickled_torch_bin_is_one_line_and_runs_nothing(prepared, tmp_path, kind):
    marker = tmp_path / "payload_ran"
    hf = tmp_path / "hf"
    hf.mkdir()
    shutil.copy(prepared[2] / "config.json", hf)
    dest = hf / "pytorch_model.bin"
    if kind == "garbage": dest.write_bytes(np.random.default_rng(0).bytes(4096))
    elif kind == "raw_pickle": dest.write_bytes(pickle.dumps({"backbone.norm_f.weight": _Payload(marker)}))
    else: torch.save({"backbone.norm_f.weight": _Payload(marker)}, dest)
    rc, out, err = _import(hf, tmp_path / "run")
    print(f"exit {rc}: {err.strip()}")
    assert rc == 2 and one_line(err), (out, err)
    assert f"{dest}: not a readable PyTorch weights file" in err, err
    assert not marker.exists() and not (tmp_path / "run").exists()
    exec(_Payload(marker).__reduce__()[1][0])                   # the check above can fail: run, the payload makes it
    assert marker.exists()


# D6, D16 -- one prepare per output directory; stale temporaries go ---------------------------------------------
def _prepare_cmd(texts, out, *extra):
    return MAIN + ["prepare", str(texts), "--out", str(out), "--val-tokens", "2000", "--shard-size-tokens", "2000",
                   "--workers", "1", "--quiet", *extra]


def _wait_for(p, cond, what, timeout=120):
    deadline = time.time() + timeout
    while not cond():
        assert p.poll() is None and time.time() < deadline, f"{what}: {p.stderr.read().decode()[-2000:] if p.stderr else ''}"
        time.sleep(0.005)


@needs_gpt2
def test_a_second_prepare_into_the_same_directory_is_refused(tmp_path):
    texts, out = corpus(tmp_path / "texts", n=120), tmp_path / "tok"
    first = subprocess.Popen(_prepare_cmd(texts, out), cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, start_new_session=True)
    try:
        _wait_for(first, lambda: (out / "train" / "shard_000000.bin").exists(), "first prepare")
        os.kill(first.pid, signal.SIGSTOP)                      # holds its lock while stopped
        rc, stdout, err = run_captured(CLI.prepare_cli, [str(texts), "--out", str(out), "--val-tokens", "2000",
                                                         "--shard-size-tokens", "2000", "--workers", "1", "--quiet"])
        print(f"exit {rc}: {err.strip()}")
        assert rc == 2 and one_line(err) and not stdout, (stdout, err)
        assert f"{out} is in use by another writer (pid {first.pid}" in err, err
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert first.wait(timeout=120) == 0, first.stderr.read().decode()[-2000:]
    from mamba3_lite.data import PretrainDataset
    for split in ("train", "val"):                              # the first run's output is whole
        PretrainDataset(out, 16, 50257, split=split).verify_digests()


@needs_gpt2
def test_a_rerun_of_a_killed_prepare_removes_its_stale_temporaries(tmp_path):
    texts, out = corpus(tmp_path / "texts", n=60), tmp_path / "tok"
    p = subprocess.Popen(_prepare_cmd(texts, out), cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, start_new_session=True)
    _wait_for(p, lambda: (out / "train" / "shard_000001.bin").exists(), "prepare")
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    # what a SIGKILL between a temp file's creation and its rename leaves (pid of the killed process)
    stale = [out / "train" / f".shard_000002.bin.{p.pid}.tmp", out / "val" / f".manifest.json.{p.pid}.tmp"]
    for f in stale: f.write_bytes(b"\0" * 1000)
    keep = out / "train" / "notes.tmp"                          # not a name prepare writes: left alone
    keep.write_text("mine")
    rc, _, err = run_captured(CLI.prepare_cli, _prepare_cmd(texts, out)[4:])
    assert rc == 0, err
    assert tmp_files(out) == ["train/notes.tmp"], tmp_files(out)


# D7, D9 -- config values -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("setting,shown", [("training.lr=.inf", "training.lr"), ("training.eps=.inf", "training.eps"),
                                           ("training.max_grad_norm=.nan", "training.max_grad_norm"),
                                           ("training.betas=[0.9, .nan]", "training.betas[1]"),
                                           ("model.dt_max=-.inf", "model.dt_max")])
def test_non_finite_numbers_are_refused_at_config_load(tmp_path, setting, shown):
    f = write_yaml(tmp_path / "c.yaml", tiny_cfg(tmp_path / "run"))
    rc, _, err = run_captured(CLI.train_cli, ["--config", str(f), "--set", setting])
    print(f"exit {rc}: {err.strip()}")
    assert rc == 2 and one_line(err) and f"{shown} must be a finite number" in err, err
    assert not (tmp_path / "run").exists()
    key, _, value = setting.partition("=")
    sec, name = key.split(".")
    d = Cfg.config_to_dict(tiny_cfg(tmp_path / "run"))
    d[sec][name] = yaml.load(value, Loader=Cfg.ConfigLoader)
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(d))         # the same value in a config file
    with pytest.raises(Cfg.ConfigError, match=re.escape(f"bad.yaml: {shown} must be a finite number")):
        Cfg.load_config(tmp_path / "bad.yaml")


@pytest.mark.parametrize("value", ["[1,", "{a: 1", "'open", "a: b: c"])
def test_a_set_value_that_is_not_yaml_is_one_line(tmp_path, value):
    f = write_yaml(tmp_path / "c.yaml", tiny_cfg(tmp_path / "run"))
    rc, _, err = run_captured(CLI.train_cli, ["--config", str(f), "--set", f"training.lr={value}"])
    print(f"exit {rc}: {err.strip()}")
    assert rc == 2 and one_line(err) and f"--set {f'training.lr={value}'!r}" in err and "not valid YAML" in err, err


# D8, D15 -- models that cannot fit are refused before anything is allocated ---------------------------------------
def _capped(args, timeout=90):
    "The command in a subprocess with 6 GiB of address space and a time limit (the old behaviour grew without end)."
    import resource
    cap = lambda: resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))  # noqa: E731
    try:
        r = subprocess.run(MAIN + [str(a) for a in args], cwd=ROOT, env=ENV, capture_output=True, text=True,
                           timeout=timeout, preexec_fn=cap)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {timeout} s")
    return r.returncode, r.stdout, r.stderr


def test_train_refuses_a_model_too_big_for_the_machine_with_its_parameter_count(tmp_path):
    from mamba3_lite.model import ModelConfig, closed_form_num_parameters
    f = write_yaml(tmp_path / "c.yaml", tiny_cfg(tmp_path / "run"))
    rc, _, err = _capped(["train", "--config", f, "--set", "model.n_layers=10000000"])
    n = closed_form_num_parameters(ModelConfig.from_preset("tiny", n_layers=10_000_000))
    print(f"exit {rc}: {err.strip()}")
    assert rc == 2 and one_line(err) and f"{n:,} parameters" in err and "n_layers=10000000" in err, err
    assert "memory" in err and not (tmp_path / "run").exists()


@pytest.mark.parametrize("field,value", [("n_layer", 10**9), ("d_model", 10**9)])
def test_import_refuses_a_config_too_big_for_the_machine(prepared, tmp_path, field, value):
    hf = tmp_path / "hf"
    shutil.copytree(prepared[2], hf)
    config = json.loads((hf / "config.json").read_text())
    config[field] = value
    (hf / "config.json").write_text(json.dumps(config))
    rc, out, err = _capped(["import", hf, "--out", tmp_path / "run"])
    ours = {"n_layer": "n_layers", "d_model": "d_model"}[field]
    print(f"exit {rc}: {err.strip()}")
    assert rc == 2 and one_line(err) and f"{ours}={value}" in err and " parameters" in err, (out, err)
    assert str(hf / "config.json") in err and "Storage" not in err and not (tmp_path / "run").exists(), err


# D13 -- --seed is checked with the other arguments ------------------------------------------------------------------
@pytest.mark.parametrize("seed", ["-1", str(2**40)])
def test_a_seed_out_of_range_is_refused_first_naming_the_option(tmp_path, seed):
    f = write_yaml(tmp_path / "c.yaml", tiny_cfg(tmp_path / "run"))
    rc, _, err = run_captured(CLI.train_cli, ["--config", str(f), "--seed", seed])
    print(f"exit {rc}: {err.strip()}")
    assert rc == 2 and one_line(err) and "argument --seed" in err and "2**32 - 1" in err, err
    assert not (tmp_path / "run").exists()
    t = time.time()
    rc, _, err = run_captured(CLI.quickstart_cli, ["--seed", seed, "--run-dir", str(tmp_path / "q")])
    print(f"exit {rc}: {err.strip()}")
    assert rc == 2 and one_line(err) and "argument --seed" in err, err
    assert not (tmp_path / "q").exists() and time.time() - t < 30    # the corpus was not prepared
    with pytest.raises(Cfg.ConfigError, match="training.seed must be"):
        Cfg.config_from_dict({"training": {"seed": int(seed)}})


# D17 -- SIGTERM / SIGINT in prepare and eval ---------------------------------------------------------------------
def _sigint_as_default():
    """In the child: SIGINT back to its default, so Python turns it into KeyboardInterrupt even when the test runner was
    started in the background (a non-interactive shell's `cmd &` ignores SIGINT, and the ignore is inherited)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@needs_gpt2
@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_prepare_stopped_by_a_signal_is_one_line_and_leaves_no_temporaries(tmp_path, sig, code):
    texts, out = corpus(tmp_path / "texts", n=200), tmp_path / "tok"
    p = subprocess.Popen(_prepare_cmd(texts, out), cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True, preexec_fn=_sigint_as_default)
    _wait_for(p, lambda: (out / "train" / "shard_000001.bin").exists(), "prepare")
    os.kill(p.pid, signal.SIGSTOP)
    os.kill(p.pid, sig)
    os.kill(p.pid, signal.SIGCONT)
    stdout, err = (s.decode() for s in p.communicate(timeout=120))
    print(f"exit {p.returncode}: {err.strip()}")
    assert p.returncode == code and one_line(err), (p.returncode, err)
    assert f"nothing committed in {out}" in err and "rerun" in err, err
    assert tmp_files(out) == [] and not list(out.glob("*/manifest.json"))


def _mapped(pid, name):
    try: return name in Path(f"/proc/{pid}/maps").read_text()
    except OSError: return False


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_eval_stopped_by_a_signal_is_one_line(prepared, tmp_path, sig, code):
    data, run, _ = prepared
    p = subprocess.Popen(MAIN + ["eval", "--checkpoint-dir", str(run), "--data-path", str(data), "--split", "train",
                                 "--batch-size", "1"], cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True, preexec_fn=_sigint_as_default)
    _wait_for(p, lambda: _mapped(p.pid, "shard_000000.bin"), "eval")   # the shards are open: evaluating
    os.kill(p.pid, signal.SIGSTOP)
    os.kill(p.pid, sig)
    os.kill(p.pid, signal.SIGCONT)
    stdout, err = (s.decode() for s in p.communicate(timeout=120))
    print(f"exit {p.returncode}: {err.strip()}")
    assert p.returncode == code and one_line(err) and "loss=" not in stdout, (p.returncode, stdout, err)
    assert ("terminated" if sig == signal.SIGTERM else "interrupted") in err, err
