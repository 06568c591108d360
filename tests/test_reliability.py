"""Reliability of a run directory end to end: one writer per run (a lock), config changes on resume, prepare's
commit protocol, integrity of metas and shards, one-line errors, explicit resume and rewind, metrics.jsonl after a
resume, quickstart's argument checks, and the tokenizer fetch that never runs package build code.
Tiny model on dummy tokens (vocab 256) unless a test needs the GPT-2 ranks."""
import hashlib
import http.server
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from mamba3_lite.testing import gpt2_available, run_captured, run_in_mounts
from mamba3_lite import cli as CLI
from mamba3_lite import config as Cfg
from mamba3_lite import optim as O
from mamba3_lite import train as T
from mamba3_lite.checkpoint import CheckpointManager, CheckpointWarning
from mamba3_lite.evaluate import load_trained
from mamba3_lite.logger import read_metrics

ROOT = Path(__file__).resolve().parents[1]
QUIET = lambda s: None  # noqa: E731
ENV = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")


def tiny_cfg(run_dir, **training):
    t = dict(micro_batch_size=2, gradient_accumulation_steps=1, max_steps=6, warmup_steps=2, lr=3e-3, eval_every=100,
             save_every=2, eval_batches=1, checkpoint_dir=str(run_dir), log_every=1, num_threads=1, seed=3,
             eval_at_start=False)
    t.update(training)
    return Cfg.config_from_dict({"model": {"preset": "tiny", "vocab_size": 256}, "data": {"dummy": True, "max_seq_len": 16},
                               "training": t})


def write_yaml(path, cfg):
    path.write_text(yaml.safe_dump(Cfg.config_to_dict(cfg)))
    return path


def one_line(err):
    "One line of error (the dummy-token warning lines, which the tiny config asks for, aside)."
    lines = [line for line in err.strip().splitlines() if "SEEDED RANDOM TOKENS" not in line]
    return len(lines) == 1 and "Traceback" not in err


def train_records(run_dir):
    return [r for r in read_metrics(run_dir) if r.get("kind") == "train"]


def rewrite_meta(path, change):
    "Edit a checkpoint meta and re-seal it with a valid digest (what only a deliberate forger could do)."
    from mamba3_lite.checkpoint import meta_digest
    meta = json.loads(Path(path).read_text())
    change(meta)
    meta["meta_sha256"] = meta_digest(meta)
    Path(path).write_text(json.dumps(meta, indent=2))




needs_gpt2 = pytest.mark.skipif(not gpt2_available(), reason="GPT-2 ranks not available offline (set MAMBA3_LITE_GPT2_RANKS)")


# 1 -- one writer per run directory ---------------------------------------------------------------------------
def test_second_trainer_on_a_run_dir_exits_2_and_a_killed_holder_leaves_no_stale_lock(tmp_path):
    run = tmp_path / "run"
    cfg_file = write_yaml(tmp_path / "c.yaml", tiny_cfg(run, max_steps=100_000, save_every=2))
    cmd = [sys.executable, "-m", "mamba3_lite.cli", "train", "--config", str(cfg_file)]
    first = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             start_new_session=True)
    try:
        deadline = time.time() + 120
        while not (run / "meta_step_2.json").exists():
            assert first.poll() is None and time.time() < deadline, first.stderr.read().decode()[-2000:]
            time.sleep(0.02)
        rc, _, err = run_captured(CLI.train_cli, ["--config", str(cfg_file)])          # a second trainer, same run directory
        assert rc == 2 and one_line(err), err
        assert str(run) in err and f"pid {first.pid}" in err and socket.gethostname() in err, err
        model, _, meta = load_trained(run, log=QUIET)  # read-only access (eval while training) still works
        assert meta["step"] >= 2 and first.poll() is None
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    res = T.run_training(tiny_cfg(run, max_steps=2), log=QUIET)  # the kernel released the killed holder's lock
    assert res["final_step"] >= 2


# 2 -- config changes on resume --------------------------------------------------------------------------------
def test_resume_applies_a_new_lr_and_refuses_a_new_shape(tmp_path):
    run = tmp_path / "run"
    T.run_training(tiny_cfg(run, max_steps=4), log=QUIET)
    msgs = []
    new = tiny_cfg(run, max_steps=6, lr=1e-5, weight_decay=0.5)
    T.run_training(new, log=msgs.append)
    rec = {r["step"]: r for r in train_records(run)}
    # the new peak lr scales the schedule; the two more steps continue it from where the finished run left it (its end value)
    want = 1e-5 * O.lr_factor(4, warmup_steps=2, max_steps=4, min_lr_ratio=new.training.min_lr_ratio)
    assert abs(rec[5]["lr"] - want) < 1e-12, (rec[5]["lr"], want)
    assert sum("training.lr: 0.003 -> 1e-05" in m for m in msgs) == 1, msgs
    assert any("training.weight_decay: 0.1 -> 0.5" in m for m in msgs), msgs
    meta = CheckpointManager(run).read_meta(6)
    assert meta["config"]["training"]["lr"] == 1e-5
    with pytest.raises(Cfg.ConfigError, match=r"data.max_seq_len.*16 -> 32"):
        T.run_training(Cfg.apply_overrides(new, {"data.max_seq_len": 32, "training.max_steps": 8}), log=QUIET)
    with pytest.raises(Cfg.ConfigError, match=r"model.n_layers"):
        T.run_training(Cfg.apply_overrides(new, {"model.n_layers": 1, "training.max_steps": 8}), log=QUIET)


# 3 -- prepare commits each split with its manifest, last ----------------------------------------------------------
def _corpus(root, n=60, size=4000):
    root.mkdir()
    rng = np.random.default_rng(0)
    words = ["def", "return", "value", "import", "class", "self", "None", "for", "in", "range", "print", "x", "y"]
    for i in range(n):
        (root / f"d{i:03d}.txt").write_text(" ".join(rng.choice(words, size // 5)) + f"\n# doc {i}\n")
    return root


@needs_gpt2
def test_interrupted_or_failed_prepare_is_refused_and_a_rerun_rechecks_content(tmp_path):
    from mamba3_lite.cli import prepare_cli
    corpus, out = _corpus(tmp_path / "corpus", n=200), tmp_path / "tok"
    cmd = [sys.executable, "-c", "import sys; from mamba3_lite.cli import main; sys.exit(main())", "prepare", str(corpus),
           "--out", str(out), "--val-tokens", "2000", "--shard-size-tokens", "2000", "--workers", "1", "--quiet"]
    p = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + 120
    while not (out / "train" / "shard_000003.bin").exists():
        assert p.poll() is None and time.time() < deadline, p.stderr.read().decode()[-2000:]
        time.sleep(0.005)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert not (out / "train" / "manifest.json").exists()   # killed midway: nothing committed
    assert list((out / "val").glob("shard_*.bin"))          # (both splits have shards: it would train)
    f = write_yaml(tmp_path / "c.yaml", Cfg.apply_overrides(tiny_cfg(tmp_path / "run", max_steps=1),
                                                          {"model.vocab_size": 50257, "data.dummy": False}))
    rc, _, err = run_captured(CLI.train_cli, ["--config", str(f), "--data-path", str(out)])
    assert rc == 2 and one_line(err) and "manifest" in err and "prepare" in err, err
    # a prepare that fails (more validation tokens than the corpus) commits nothing, also when run again
    bad = tmp_path / "bad"
    for _ in range(2):
        rc, _, err = run_captured(prepare_cli, [str(corpus), "--out", str(bad), "--val-tokens", str(10**9), "--quiet"])
        assert rc == 2 and one_line(err) and "no training tokens" in err and "smaller --val-tokens or --val-fraction" in err, err
        assert not list(bad.glob("*/manifest.json"))
    # the rerun finishes the interrupted one; a shard changed at the same size is rewritten on the next rerun
    assert run_captured(prepare_cli, cmd[4:])[0] == 0
    m = json.loads((out / "train" / "manifest.json").read_text())
    shard = out / "train" / m["shards"][1]["file"]
    b = bytearray(shard.read_bytes()); b[100], b[101] = b[101], b[100] ^ 1; shard.write_bytes(bytes(b))
    rc, stdout, err = run_captured(prepare_cli, cmd[4:])
    assert rc == 0 and "(1 written" in stdout, stdout
    assert hashlib.sha256(shard.read_bytes()).hexdigest() == m["shards"][1]["sha256"]


# 4 -- integrity: the meta's own digest, shard digests during training -------------------------------------------
def test_an_edited_meta_is_refused_and_resume_falls_back(tmp_path):
    run = tmp_path / "run"
    T.run_training(tiny_cfg(run, max_steps=4), log=QUIET)
    p = run / "meta_step_4.json"
    meta = json.loads(p.read_text())
    meta["data_position"][0]["position"] += 3                # still valid JSON, still a commit record
    p.write_text(json.dumps(meta, indent=2))
    mgr = CheckpointManager(run)
    with pytest.warns(CheckpointWarning, match="meta_step_4.json.*digest"):
        assert mgr.latest_step() == 2


@needs_gpt2
def test_a_shard_changed_at_the_same_size_stops_training_naming_it(tmp_path):
    from mamba3_lite.cli import prepare_cli
    out = tmp_path / "tok"
    assert run_captured(prepare_cli, [str(_corpus(tmp_path / "corpus", n=20)), "--out", str(out), "--val-tokens", "500",
                             "--quiet"])[0] == 0
    shard = out / "train" / "shard_000000.bin"
    b = bytearray(shard.read_bytes()); b[-2:] = b"\x00\x00"; shard.write_bytes(bytes(b))
    f = write_yaml(tmp_path / "c.yaml", Cfg.apply_overrides(tiny_cfg(tmp_path / "run", max_steps=2),
                                                          {"model.vocab_size": 50257, "data.dummy": False}))
    rc, _, err = run_captured(CLI.train_cli, ["--config", str(f), "--data-path", str(out)])
    assert rc == 2 and one_line(err) and "shard_000000.bin" in err and "sha256" in err, err


# 5 -- one line where a traceback was --------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["eval_every", "save_every", "log_every", "max_steps", "micro_batch_size",
                                 "gradient_accumulation_steps", "eval_batches", "nan_guard_max_consecutive"])
def test_cadence_and_size_fields_must_be_positive(key):
    with pytest.raises(Cfg.ConfigError, match=f"training.{key} must be >= 1, got 0"):
        Cfg.config_from_dict({"training": {key: 0}})
    with pytest.raises(Cfg.ConfigError, match="data.max_seq_len must be >= 1"):
        Cfg.config_from_dict({"data": {"max_seq_len": 0}})


def test_bad_manifest_is_one_line(tmp_path):
    from mamba3_lite.data import PretrainDataset, write_shard
    d = tmp_path / "d"
    d.mkdir()
    write_shard(d / "shard_000000.bin", np.arange(100), vocab_size=128, eos_id=127)
    for body, match in (("[]", "not a JSON object"), ('{"vocab_size": 128}', "missing key.*'shards'"),
                        ('{"vocab_size": 128, "eos_id": 127, "n_tokens": 100, "shards": [{"file": "shard_000000.bin"}]}',
                         "shards\\[0\\] missing key.*'n_tokens'")):
        (d / "manifest.json").write_text(body)
        with pytest.raises(ValueError, match=f"manifest.json.*{match}"):
            PretrainDataset(d, 8, 128)


@pytest.mark.parametrize("change,match", [
    (lambda m: m.pop("scheduler"), "missing 'scheduler'"),
    (lambda m: m.pop("rng"), "missing 'rng'"),
    (lambda m: m.__setitem__("data_position", {"epoch": 0}), "'data_position' must be a list"),
])
def test_meta_missing_or_mistyped_resume_keys_is_one_line(tmp_path, change, match):
    run = tmp_path / "run"
    T.run_training(tiny_cfg(run, max_steps=2), log=QUIET)
    rewrite_meta(run / "meta_step_2.json", change)
    f = write_yaml(tmp_path / "c.yaml", tiny_cfg(run, max_steps=4))
    rc, _, err = run_captured(CLI.train_cli, ["--config", str(f)])
    assert rc == 2 and one_line(err) and "meta_step_2.json" in err and match in err, err


@pytest.mark.parametrize("what", ["model", "optim"])
def test_checkpoint_that_matches_its_hashes_but_does_not_load_falls_back(tmp_path, what):
    run = tmp_path / "run"
    T.run_training(tiny_cfg(run, max_steps=4), log=QUIET)
    mgr = CheckpointManager(run)
    bad = mgr.paths(4)[what]
    if what == "model":
        bad.write_bytes(os.urandom(4096))
    else:
        torch.save({"state": {}, "param_groups": [], "evil": np.dtype("float64")}, bad)  # weights_only refuses it
    from mamba3_lite.checkpoint import checkpoint_digest
    rec = checkpoint_digest(bad)
    rewrite_meta(mgr.paths(4)["meta"], lambda m: m["files"][what].update(size=rec["size"], blake3=rec["blake3"]))
    assert not mgr.problems(4)  # hashes match
    msgs = []
    with pytest.warns(CheckpointWarning, match=f"{bad.name}.*does not load"):
        res = T.run_training(tiny_cfg(run, max_steps=6), log=msgs.append)
    assert res["first_step"] == 2 and res["final_step"] == 6


def test_disk_full_while_saving_is_one_line(tmp_path):
    run = tmp_path / "small"
    run.mkdir()
    cfg = write_yaml(tmp_path / "c.yaml", tiny_cfg(run, max_steps=4, save_every=1))
    r = run_in_mounts([sys.executable, "-m", "mamba3_lite.cli", "train", "--config", cfg], [(run, "tmpfs", "4m", 4 << 20)],
                      cwd=ROOT, env=ENV, timeout=120)
    if r is None: pytest.skip("no unprivileged mount namespace for a small tmpfs")
    assert r.returncode == 2, r.stderr[-2000:]
    assert one_line(r.stderr) and "disk full writing" in r.stderr and "bytes free" in r.stderr, r.stderr
    assert "checkpoints up to step" in r.stderr and "are intact" in r.stderr, r.stderr


def test_skipped_steps_of_a_nan_abort_reach_metrics(tmp_path):
    cfg = tiny_cfg(tmp_path / "run", max_steps=8, save_every=100, log_every=4, nan_guard_max_consecutive=2)
    tr = T.Pretrainer(cfg, log=QUIET)
    tr.raw_model.embed.register_forward_hook(lambda mod, i, out: out * float("nan") if mod.training and tr.step >= 1 else None)
    with pytest.raises(RuntimeError, match="no valid checkpoint"):
        tr.train()
    assert sum(r.get("skipped", 0) for r in read_metrics(cfg.training.checkpoint_dir)) == 2


# 6 -- explicit resume is as strict as auto-resume ---------------------------------------------------------------
def test_explicit_resume_without_optimizer_state_is_refused_unless_reset(tmp_path):
    run = tmp_path / "run"
    T.run_training(tiny_cfg(run, max_steps=4), log=QUIET)
    (run / "optim_step_2.pt").unlink()
    f = write_yaml(tmp_path / "c.yaml", tiny_cfg(run, max_steps=4))
    rc, _, err = run_captured(CLI.train_cli, ["--config", str(f), "--resume", "2"])
    assert rc == 2 and one_line(err) and "optim_step_2.pt" in err and "--reset-optimizer" in err, err
    rc, out, err = run_captured(CLI.train_cli, ["--config", str(f), "--resume", "2", "--reset-optimizer"])
    assert rc == 0 and "done: steps 2->4" in out, err


# 7 -- a rewind moves the abandoned branch out of the way --------------------------------------------------------
def test_rewind_moves_newer_steps_to_abandoned(tmp_path):
    run = tmp_path / "run"
    T.run_training(tiny_cfg(run, max_steps=8), log=QUIET)
    msgs = []
    T.run_training(tiny_cfg(run, max_steps=4), resume_step=2, log=msgs.append)   # the rewound run stops at 4
    mgr = CheckpointManager(run)
    assert mgr.list_steps() == [2, 4] and mgr.latest_step() == 4
    assert sorted(p.name for p in (run / "abandoned").rglob("meta_step_*.json")) == [
        "meta_step_4.json", "meta_step_6.json", "meta_step_8.json"]
    assert any("abandoned" in m for m in msgs), msgs


# 8 -- metrics.jsonl after a resume -----------------------------------------------------------------------------
def test_metrics_after_resume_one_record_per_step_and_torn_tail(tmp_path):
    run = tmp_path / "run"
    T.run_training(tiny_cfg(run, max_steps=6), log=QUIET)
    for s in (4, 6):                                             # as if killed after step 6 was logged but before 4 was saved
        CheckpointManager(run).paths(s)["meta"].unlink()
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write('{"kind": "train", "step": 7, "lo')            # a torn last line
    T.run_training(tiny_cfg(run, max_steps=6), log=QUIET)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    raw = [json.loads(line) for line in lines]                   # every line is JSON again
    assert [r["step"] for r in raw if r["kind"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in train_records(run)] == [1, 2, 3, 4, 5, 6]


# 9 -- quickstart checks its arguments before any work ----------------------------------------------------------
@pytest.mark.parametrize("argv,match", [(["--prompt", ""], "--prompt"), (["--max-new-tokens", "-5"], "--max-new-tokens"),
                                        (["--max-steps", "-3"], "--max-steps"), (["--val-tokens", "-1"], "--val-tokens"),
                                        (["--workers", "0"], "--workers")])
def test_quickstart_validates_arguments_first(tmp_path, argv, match):
    from mamba3_lite.cli import quickstart_cli
    t = time.time()
    rc, _, err = run_captured(quickstart_cli, argv + ["--run-dir", str(tmp_path / "q")])
    assert rc == 2 and one_line(err) and match in err, err
    assert not (tmp_path / "q").exists() and time.time() - t < 30


# 10 -- the GPT-2 ranks from the package index, without running package code --------------------------------------
def _crafted_sdist(path, ranks: bytes):
    with tarfile.open(path, "w:gz") as tar:
        for name, data in (("../escaped.txt", b"outside"), ("openai_whisper-20250625/setup.py", b"raise SystemExit(9)"),
                           ("openai_whisper-20250625/whisper/assets/gpt2.tiktoken", ranks)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


@needs_gpt2
def test_ranks_from_the_index_check_the_archive_and_run_no_code(tmp_path, monkeypatch):
    from mamba3_lite import tokenizer as D
    from mamba3_lite.tokenizer import GPT2_RANKS_SHA256
    ranks = Path(os.environ.get(D.RANKS_ENV, "")).read_bytes() if os.environ.get(D.RANKS_ENV) else None
    if ranks is None:
        pytest.skip("needs the ranks file itself")
    served = tmp_path / "served"
    served.mkdir()
    digest = _crafted_sdist(served / "openai_whisper-20250625.tar.gz", ranks)
    listing = {"files": [{"filename": "openai_whisper-20250625.tar.gz", "url": "../../openai_whisper-20250625.tar.gz",
                          "hashes": {"sha256": digest}}]}
    (served / "simple" / "openai-whisper").mkdir(parents=True)
    (served / "simple" / "openai-whisper" / "index.json").write_text(json.dumps(listing))

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **k): super().__init__(*a, directory=str(served), **k)
        def log_message(self, *a): pass
        def do_GET(self):
            if self.path.rstrip("/").endswith("simple/openai-whisper"):
                self.path = "/simple/openai-whisper/index.json"
            return super().do_GET()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    index = f"http://127.0.0.1:{srv.server_address[1]}/simple/"
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("ran a subprocess"))
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("ran a subprocess"))
    try:
        work = tmp_path / "w" / "x"
        out = D.ranks_from_index(work, index_url=index, archive_sha256=digest)
        assert hashlib.sha256(out.read_bytes()).hexdigest() == GPT2_RANKS_SHA256
        assert not (tmp_path / "w" / "escaped.txt").exists() and not list(tmp_path.rglob("setup.py"))
        with pytest.raises(ValueError, match="sha256"):
            D.ranks_from_index(tmp_path / "w2", index_url=index)   # the pinned hash of the real sdist differs
    finally:
        srv.shutdown()
    assert D.WHISPER_SDIST_SHA256 == "37a91a3921809d9f44748ffc73c0a55c9f366c85a3ef5c2ae0cc09540432eb96"
