"""Data parallelism on CPU: 2 processes (torchrun, gloo) with micro-batch b each must match 1 process with
micro-batch 2b — the same global batch — in every step's loss and in the final weights."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file

from mamba3_lite import config as Cfg
from mamba3_lite.logger import read_metrics

ROOT = Path(__file__).resolve().parents[1]


def cfg_file(path, run_dir, micro_batch, parallel="ddp"):
    cfg = Cfg.config_from_dict({
        "model": {"preset": "tiny", "vocab_size": 256},
        "data": {"dummy": True, "max_seq_len": 16, "shuffle": False},
        "training": dict(micro_batch_size=micro_batch, gradient_accumulation_steps=2, max_steps=4, warmup_steps=1,
                         lr=2e-3, eval_every=100, save_every=100, eval_batches=1, checkpoint_dir=str(run_dir),
                         log_every=1, num_threads=1, seed=5, parallel=parallel)})
    path.write_text(yaml.safe_dump(Cfg.config_to_dict(cfg)))
    return path


def losses(run_dir):
    "{step: training loss} from the run's metrics.jsonl."
    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if r.get("kind", "train") == "train" and "loss" in r}


def run(args, env, timeout=300):
    "Run `python -m args` in its own process group; on a timeout kill the whole group (torchrun and its workers)."
    p = subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        raise AssertionError(f"{' '.join(args)} timed out after {timeout}s:\n{err[-3000:]}")
    assert p.returncode == 0, err[-3000:]
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def assert_same_run(one, two):
    a, b = losses(one), losses(two)
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    for s in a:
        assert abs(a[s] - b[s]) <= 1e-5 * abs(a[s]), (s, a[s], b[s])
    wa, wb = load_file(one / "model_step_4.safetensors"), load_file(two / "model_step_4.safetensors")
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=2e-5, msg=k)


def test_two_gloo_ranks_match_one_process(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    run(["mamba3_lite.cli", "train", "--config", str(cfg_file(tmp_path / "one.yaml", tmp_path / "one", micro_batch=4))], env)
    for engine in ("ddp", "fsdp"):
        f = cfg_file(tmp_path / f"{engine}.yaml", tmp_path / engine, micro_batch=2, parallel=engine)
        run(["torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "mamba3_lite.cli", "train", "--config", str(f)], env)
        assert_same_run(tmp_path / "one", tmp_path / engine)
        # rank 0 alone wrote the run, with the data positions of both ranks
        meta = json.loads((tmp_path / engine / "meta_step_4.json").read_text())
        assert [p["rank"] for p in meta["data_position"]] == [0, 1]
    # an FSDP run resumes from its own (full-tensor) checkpoint
    r = run(["torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "mamba3_lite.cli", "train", "--config",
             str(tmp_path / "fsdp.yaml"), "--max-steps", "5"], env)
    assert "[resume] from checkpoint step 4" in r.stdout and "done: steps 4->5" in r.stdout
