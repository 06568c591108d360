"""Data parallelism on CPU: 2 processes (torchrun, gloo) with micro-batch b each must match 1 process with
micro-batch 2b — the same global batch — in every step's loss and in the final weights."""
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file

from mamba3_lite import train as T

ROOT = Path(__file__).resolve().parents[1]


def cfg_file(path, run_dir, micro_batch, parallel="ddp"):
    cfg = T.config_from_dict({
        "model": {"preset": "tiny", "vocab_size": 256},
        "data": {"dummy": True, "max_seq_len": 16, "shuffle": False},
        "training": dict(micro_batch_size=micro_batch, gradient_accumulation_steps=2, max_steps=4, warmup_steps=1,
                         lr=2e-3, eval_every=100, save_every=100, eval_batches=1, checkpoint_dir=str(run_dir),
                         log_every=1, num_threads=1, seed=5, parallel=parallel)})
    path.write_text(yaml.safe_dump(T.config_to_dict(cfg)))
    return path


def losses(run_dir):
    out = {}
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("kind", "train") == "train" and "loss" in r:
            out[r["step"]] = r["loss"]
    return out


def test_two_gloo_ranks_match_one_process(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    one = cfg_file(tmp_path / "one.yaml", tmp_path / "one", micro_batch=4)
    two = cfg_file(tmp_path / "two.yaml", tmp_path / "two", micro_batch=2)
    r1 = subprocess.run([sys.executable, "-m", "mamba3_lite.train", "--config", str(one)], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)
    assert r1.returncode == 0, r1.stderr[-3000:]
    r2 = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=0",
                         "-m", "mamba3_lite.train", "--config", str(two)], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)
    assert r2.returncode == 0, r2.stderr[-3000:]
    a, b = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    for s in a:
        assert abs(a[s] - b[s]) <= 1e-5 * abs(a[s]), (s, a[s], b[s])
    wa, wb = load_file(tmp_path / "one" / "model_step_4.safetensors"), load_file(tmp_path / "two" / "model_step_4.safetensors")
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=2e-5, msg=k)
    # rank 0 alone wrote the run: one metrics file, one set of checkpoint files, data positions of both ranks
    meta = json.loads((tmp_path / "two" / "meta_step_4.json").read_text())
    assert [p["rank"] for p in meta["data_position"]] == [0, 1]
