"""CheckpointManager: crash safety under kill -9, damage detection with fallback, tying, strictness, pruning,
meta refusal, RNG round trip. Notebook nbs/07_checkpoint.ipynb holds the derivations; this file holds the
multi-process and long-list cases."""
import importlib.util
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch

from mamba3_lite.checkpoint import (CheckpointCorruptError, CheckpointManager, CheckpointWarning, capture_rng_state,
                                    restore_rng_state)
from mamba3_lite.testing import TiedLM

REPO = Path(__file__).resolve().parents[1]
KILL_TRIALS = int(os.environ.get("CKPT_KILL_TRIALS", "24"))


def model_and_opt(vocab=64, d=16, tie=True):
    m = TiedLM(vocab, d, tie)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    m(torch.zeros(1, 2, dtype=torch.long)).sum().backward()
    opt.step()  # creates the exp_avg / exp_avg_sq / step state
    opt.zero_grad()
    return m, opt


@torch.no_grad()
def set_state(m, opt, step):
    "Deterministic weights + optimizer moments for `step`, so another process can rebuild the expected values."
    g = torch.Generator().manual_seed(step)
    for p in m.parameters():
        p.copy_(torch.randn(p.shape, generator=g))
        st = opt.state[p]
        st["exp_avg"].copy_(torch.randn(p.shape, generator=g))
        st["exp_avg_sq"].copy_(torch.randn(p.shape, generator=g).abs())
        st["step"].fill_(float(step))


def assert_exact(m, opt, m2, opt2):
    for k, v in m.state_dict().items():
        assert torch.equal(m2.state_dict()[k], v), k  # exact: a save/load round trip copies the bytes
    for p, p2 in zip(m.parameters(), m2.parameters()):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt.state[p][key], opt2.state[p2][key]), key  # exact: round trip


def quiet_latest(mgr):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        step = mgr.latest_step()
    return step, [str(x.message) for x in w]


# ---------------------------------------------------------------- kill -9 while saving
def zygote_main(save_dir):
    """Pre-imported process that forks one saving child per 'go START' line, so each trial costs no torch import.
    The child saves steps START, START+1, ... forever (keep_last=3) and prints 'ready S' after its first commit."""
    torch.set_num_threads(1)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped automatically
    m, opt = model_and_opt(vocab=1024, d=128)  # ~1 MB of weights, ~1 MB of moments: a save takes tens of ms
    mgr = CheckpointManager(save_dir, keep_last=3)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "quit":
            return
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            try:
                for step in range(int(cmd[1]), 10**9):
                    set_state(m, opt, step)
                    mgr.save(m, opt, step, extra_meta={"tokens_seen": step * 100})
                    if step == int(cmd[1]):
                        print("ready", step, flush=True)
            finally:
                os._exit(1)
        print("pid", pid, flush=True)


def _wait_gone(pid, timeout=10.0):
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.005)
    raise AssertionError(f"child {pid} still alive after SIGKILL")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork and SIGKILL")
def test_kill9_while_saving(tmp_path):
    rng = random.Random(1234)
    zyg = subprocess.Popen([sys.executable, "-c",
                            "import importlib.util,sys;s=importlib.util.spec_from_file_location('tc',sys.argv[1]);"
                            "t=importlib.util.module_from_spec(s);s.loader.exec_module(t);t.zygote_main(sys.argv[2])",
                            __file__, str(tmp_path)], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           text=True, bufsize=1)
    lines = queue.Queue()  # read on a thread, so a hung child fails the test after a timeout instead of blocking CI
    threading.Thread(target=lambda: [lines.put(x) for x in zyg.stdout], daemon=True).start()
    mgr = CheckpointManager(tmp_path, keep_last=3)
    m, opt = model_and_opt(vocab=1024, d=128)
    m2, opt2 = model_and_opt(vocab=1024, d=128)
    torn_seen, start, pid, reads, races = 0, 0, None, 0, 0
    try:
        for trial in range(KILL_TRIALS):
            zyg.stdin.write(f"go {start}\n")
            pid = int(lines.get(timeout=60).split()[1])
            ready = lines.get(timeout=60).split()
            assert ready[0] == "ready", ready
            deadline = time.time() + rng.uniform(0.0, 0.3)
            while time.time() < deadline:  # meanwhile, act as a concurrent reader (an eval process)
                step, _ = quiet_latest(mgr)
                try:
                    mgr.load(m2, step, optimizer=opt2)
                except (FileNotFoundError, CheckpointCorruptError):
                    races += 1  # pruned (keep_last) under our feet: allowed, the caller retries
                    continue
                set_state(m, opt, step)
                assert_exact(m, opt, m2, opt2)
                reads += 1
            os.kill(pid, signal.SIGKILL)
            _wait_gone(pid)
            pid = None

            names = [p.name for p in tmp_path.iterdir()]
            step, msgs = quiet_latest(mgr)
            torn = any(n.endswith(".tmp") for n in names) or bool(msgs)
            torn_seen += torn
            assert step is not None and step >= int(ready[1]), (trial, step, names)
            set_state(m, opt, step)
            meta = mgr.load(m2, step, optimizer=opt2)
            assert_exact(m, opt, m2, opt2)
            assert meta["tokens_seen"] == step * 100 and meta["step"] == step
            assert m2.lm_head.weight is m2.embed.weight

            fresh = max(mgr.list_steps()) + 1  # a fresh save on top of whatever the kill left
            set_state(m, opt, fresh)
            mgr.save(m, opt, fresh)
            assert quiet_latest(mgr)[0] == fresh
            mgr.load(m2, fresh, optimizer=opt2)
            assert_exact(m, opt, m2, opt2)
            assert not list(tmp_path.glob("*.tmp"))  # the fresh save cleared the dead child's temp files
            start = fresh + 1
    finally:
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        zyg.stdin.write("quit\n")
        zyg.stdin.close()
        try:
            zyg.wait(timeout=30)
        except subprocess.TimeoutExpired:
            zyg.kill()
    # the kills must actually land mid-save for the test to mean anything
    assert torn_seen >= 1, "no trial left a torn save behind; the kill timing does not exercise the protocol"
    print(f"{KILL_TRIALS} kills, {torn_seen} left a torn/uncommitted save behind; concurrent reads: {reads} exact, "
          f"{races} raced a prune")


# ---------------------------------------------------------------- damage after commit
def _flip(off):
    def hurt(p):
        b = bytearray(p.read_bytes())
        b[off(len(b))] ^= 0x40
        p.write_bytes(bytes(b))
    return hurt


def _reseal(p, change):
    "Edit a meta and give it a matching meta_sha256 (a forger's edit, which only the file digests can catch)."
    from mamba3_lite.checkpoint import meta_digest
    meta = json.loads(p.read_text())
    change(meta)
    meta["meta_sha256"] = meta_digest(meta)
    p.write_text(json.dumps(meta))


DAMAGE = {
    "flip-header-model": ("model_step_2.safetensors", _flip(lambda n: 10), "digest differs"),
    "flip-mid-model": ("model_step_2.safetensors", _flip(lambda n: n // 2), "digest differs"),
    "flip-last-model": ("model_step_2.safetensors", _flip(lambda n: n - 1), "digest differs"),
    "flip-mid-optim": ("optim_step_2.pt", _flip(lambda n: n // 2), "digest differs"),
    "truncate-model": ("model_step_2.safetensors", lambda p: p.write_bytes(p.read_bytes()[:100]), "truncated"),
    "truncate-optim": ("optim_step_2.pt", lambda p: p.write_bytes(p.read_bytes()[:-1]), "truncated"),
    "extend-model": ("model_step_2.safetensors", lambda p: p.write_bytes(p.read_bytes() + b"\0"), "size"),
    "missing-model": ("model_step_2.safetensors", lambda p: p.unlink(), "missing"),
    "missing-optim": ("optim_step_2.pt", lambda p: p.unlink(), "missing"),
    "missing-meta": ("meta_step_2.json", lambda p: p.unlink(), "never committed"),
    "empty-meta": ("meta_step_2.json", lambda p: p.write_bytes(b""), "not valid JSON"),
    "torn-meta": ("meta_step_2.json", lambda p: p.write_bytes(p.read_bytes()[:40]), "not valid JSON"),
    "binary-meta": ("meta_step_2.json", lambda p: p.write_bytes(b"\xff\xfe\x00"), "not valid JSON"),
    # a meta whose recorded hash is wrong (and re-sealed): the mismatch is reported against the file it vouches for
    "meta-wrong-hash": ("meta_step_2.json", lambda p: _reseal(p, lambda m: m["files"]["model"].update(blake3="0" * 64)),
                        "digest differs", "model_step_2.safetensors"),
    # an edited meta that is still a commit record: its own digest catches it
    "meta-edited": ("meta_step_2.json", lambda p: p.write_text(p.read_text().replace('"step": 2,', '"step": 2, "x": 1,', 1)),
                    "meta_sha256"),
    "meta-other-name": ("meta_step_2.json", lambda p: p.write_text(p.read_text().replace("optim_step_2", "optim_step_1")),
                        "not a commit record"),
    "meta-no-files": ("meta_step_2.json", lambda p: p.write_text('{"step": 2}'), "not a commit record"),
    "meta-list": ("meta_step_2.json", lambda p: p.write_text("[1, 2]"), "not a commit record"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_damage_falls_back(tmp_path, case):
    fname, hurt, expect, *named = DAMAGE[case]
    named = named[0] if named else fname
    mgr = CheckpointManager(tmp_path)
    m, opt = model_and_opt()
    set_state(m, opt, 1)
    mgr.save(m, opt, 1)
    set_state(m, opt, 2)
    mgr.save(m, opt, 2)
    hurt(tmp_path / fname)
    step, msgs = quiet_latest(mgr)
    assert step == 1
    assert any(named in s and expect in s for s in msgs), msgs
    m2, opt2 = model_and_opt()
    if case not in ("missing-optim", "missing-meta"):
        with pytest.raises((CheckpointCorruptError, FileNotFoundError), match=named):
            mgr.load(m2, 2, optimizer=opt2)
    set_state(m, opt, 1)
    mgr.load(m2, 1, optimizer=opt2)
    assert_exact(m, opt, m2, opt2)


def test_missing_optim_load_warns_and_continues(tmp_path):
    mgr = CheckpointManager(tmp_path)
    m, opt = model_and_opt()
    mgr.save(m, opt, 5)
    (tmp_path / "optim_step_5.pt").unlink()
    m2, opt2 = model_and_opt()
    with pytest.warns(CheckpointWarning, match="optimizer starts from scratch"):
        mgr.load(m2, 5, optimizer=opt2)
    assert torch.equal(m2.mix.weight, m.mix.weight)  # exact: round trip


def test_no_checkpoint(tmp_path):
    mgr = CheckpointManager(tmp_path / "absent")
    assert mgr.latest_step() is None and mgr.list_steps() == []
    with pytest.raises(FileNotFoundError, match="meta_step_3.json"):
        mgr.load(TiedLM(64, 16), 3)
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError):
        CheckpointManager(tmp_path / "f")


# ---------------------------------------------------------------- tying, strictness, compile, pruning, meta
def test_tied_round_trip_keeps_storage(tmp_path):
    mgr = CheckpointManager(tmp_path)
    m, opt = model_and_opt()
    set_state(m, opt, 3)
    mgr.save(m, opt, 3)
    f = safetensors.torch.load_file(tmp_path / "model_step_3.safetensors")
    assert {"embed.weight", "lm_head.weight"} <= set(f) and torch.equal(f["embed.weight"], f["lm_head.weight"])  # exact: a copy
    m2, opt2 = model_and_opt()
    ptr = m2.embed.weight.data_ptr()
    mgr.load(m2, 3, optimizer=opt2)
    assert m2.lm_head.weight is m2.embed.weight and m2.embed.weight.data_ptr() == ptr
    assert_exact(m, opt, m2, opt2)
    with torch.no_grad():
        m2.embed.weight.add_(1)  # still one tensor after load
    assert torch.equal(m2.lm_head.weight, m2.embed.weight)  # exact: round trip


def test_untied_model_reads_tied_file_and_back(tmp_path):
    mgr = CheckpointManager(tmp_path)
    m, _ = model_and_opt()
    mgr.save(m, None, 1)
    u = TiedLM(64, 16, tie=False)
    mgr.load(u, 1)
    assert torch.equal(u.embed.weight, m.embed.weight) and torch.equal(u.lm_head.weight, m.embed.weight)  # exact: round trip
    with torch.no_grad():
        u.lm_head.weight.add_(1)
    mgr.save(u, None, 2)
    t = TiedLM(64, 16)
    with pytest.warns(CheckpointWarning, match="differ in the file"):
        mgr.load(t, 2)


def test_strict_and_lenient(tmp_path):
    mgr = CheckpointManager(tmp_path)
    m, opt = model_and_opt()
    mgr.save(m, opt, 1)

    class Extra(TiedLM):
        def __init__(self):
            super().__init__(64, 16)
            self.extra = torch.nn.Linear(2, 2)

    class Fewer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mix = torch.nn.Linear(16, 16)

    with pytest.raises(RuntimeError, match="missing key"):
        mgr.load(Extra(), 1)
    with pytest.raises(RuntimeError, match="2 unexpected key"):
        mgr.load(Fewer(), 1)
    with pytest.warns(CheckpointWarning, match="unexpected key"):
        f = Fewer()
        mgr.load(f, 1, strict=False)
    assert torch.equal(f.mix.weight, m.mix.weight)  # exact: round trip


def test_compiled_module_saves_plain_keys(tmp_path):
    mgr = CheckpointManager(tmp_path)
    m, opt = model_and_opt()
    cm = torch.compile(m)  # lazy: nothing compiles unless called
    mgr.save(cm, opt, 1)
    keys = set(safetensors.torch.load_file(tmp_path / "model_step_1.safetensors"))
    assert keys == set(m.state_dict()) and not any("_orig_mod" in k for k in keys)
    mgr.save(None, opt, 2, state_dict=cm.state_dict())  # an explicit compiled state_dict is stripped too
    assert set(safetensors.torch.load_file(tmp_path / "model_step_2.safetensors")) == keys
    c2 = torch.compile(TiedLM(64, 16))
    mgr.load(c2, 1)
    assert torch.equal(c2._orig_mod.mix.weight, m.mix.weight)  # exact: round trip


def test_keep_last_prunes_only_after_commit(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=2)
    m, opt = model_and_opt()
    for s in range(1, 6):
        mgr.save(m, opt, s)
        assert mgr.list_steps() == list(range(max(1, s - 1), s + 1))
    # a failing save (unserializable state) must not prune anything
    with pytest.raises(ValueError):
        mgr.save(m, opt, 6, extra_meta={"bad": object()})
    assert mgr.list_steps() == [4, 5]
    with pytest.raises(ValueError, match="keep_last"):
        CheckpointManager(tmp_path, keep_last=0)


@pytest.mark.parametrize("bad,where", [
    ({"x": torch.ones(2)}, "extra_meta['x']"),
    ({"sched": {"lrs": [1.0, np.float32(2.0)]}}, "extra_meta['sched']['lrs'][1]"),
    ({"loss": float("inf")}, "extra_meta['loss']"),
    ({"cfg": {1: "a"}}, "dict key 1"),
    ({"s": {1, 2}}, "extra_meta['s']"),
    ({"b": b"x"}, "extra_meta['b']"),
])
def test_non_json_meta_refused(tmp_path, bad, where):
    mgr = CheckpointManager(tmp_path)
    m, opt = model_and_opt()
    with pytest.raises(ValueError, match=where.replace("[", r"\[").replace("]", r"\]")):
        mgr.save(m, opt, 1, extra_meta=bad)
    assert mgr.list_steps() == []


def test_meta_contents_and_step_override(tmp_path):
    mgr = CheckpointManager(tmp_path)
    m, opt = model_and_opt()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5)
    cfg = {"lr": 3e-4, "betas": [0.9, 0.95], "preset": "tiny"}
    with pytest.warns(CheckpointWarning, match="step argument"):
        mgr.save(m, opt, 7, extra_meta={"step": 1, "scheduler": sched.state_dict(), "opt_steps": 3,
                                        "tokens_seen": 4096, "data_position": 17, "config": cfg})
    meta = json.loads((tmp_path / "meta_step_7.json").read_text())
    import mamba3_lite
    assert meta["step"] == 7 and meta["version"] == mamba3_lite.__version__ and meta["config"] == cfg
    assert set(meta["files"]) == {"model", "optim"} and set(meta["rng"]) >= {"python", "numpy", "torch"}
    sched.load_state_dict(meta["scheduler"])  # JSON round trip is usable
    with pytest.raises(ValueError, match="reserved"):
        mgr.save(m, opt, 8, extra_meta={"version": "x"})


def test_rng_round_trip_reproduces_draws():
    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    snap = json.loads(json.dumps(capture_rng_state(), allow_nan=False))
    a = (random.random(), np.random.randn(3).tolist(), torch.randn(4).tolist(), torch.randint(0, 9, (5,)).tolist())
    b = (random.random(), np.random.randn(3).tolist(), torch.randn(4).tolist(), torch.randint(0, 9, (5,)).tolist())
    assert a != b
    restore_rng_state(snap)
    assert a == (random.random(), np.random.randn(3).tolist(), torch.randn(4).tolist(),
                 torch.randint(0, 9, (5,)).tolist())  # exact: the same generator states replay the same draws


def test_rng_saved_by_checkpoint_resumes_exactly(tmp_path):
    mgr = CheckpointManager(tmp_path)
    m, opt = model_and_opt()
    torch.manual_seed(11)
    np.random.seed(11)
    mgr.save(m, opt, 1)
    expect = (torch.rand(3).tolist(), np.random.rand(2).tolist())
    torch.rand(100)
    np.random.rand(7)
    restore_rng_state(mgr.load(TiedLM(64, 16), 1)["rng"])
    assert (torch.rand(3).tolist(), np.random.rand(2).tolist()) == expect  # exact: the same generator states


# ---------------------------------------------------------------- the project's LM
def test_tiny_lm_round_trip(tmp_path):
    mod = importlib.util.find_spec("mamba3_lite.model")
    if mod is None:
        pytest.skip("mamba3_lite.model not exported yet")
    from mamba3_lite.model import Mamba3Transformer, ModelConfig
    torch.manual_seed(0)
    lm = Mamba3Transformer(ModelConfig.from_preset("tiny"))
    opt = torch.optim.AdamW(lm.parameters())
    mgr = CheckpointManager(tmp_path)
    mgr.save(lm, opt, 1)
    torch.manual_seed(1)
    lm2 = Mamba3Transformer(ModelConfig.from_preset("tiny"))
    opt2 = torch.optim.AdamW(lm2.parameters())
    mgr.load(lm2, 1, optimizer=opt2)
    assert lm2.lm_head.weight is lm2.embed.weight
    for k, v in lm.state_dict().items():
        assert torch.equal(lm2.state_dict()[k], v), k  # exact: round trip
    ids = torch.randint(0, lm.config.vocab_size, (1, 8))
    with torch.no_grad():
        assert torch.equal(lm2.lm_head(lm2.embed(ids)), lm.lm_head(lm.embed(ids)))  # exact: equal weights, the same ops
