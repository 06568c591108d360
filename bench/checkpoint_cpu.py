"""Checkpoint save/load time of the 434M preset (weights + AdamW state) against a plain write/read of the same bytes.

Builds the a100-400m model on CPU (`Mamba3Transformer(ModelConfig.from_preset("a100-400m"))` when
`mamba3_lite.model` exists, else a stand-in module with exactly the same tensor shapes: 434,359,040 parameters
with the tied embedding/LM head, as `03_model` counts them) and an AdamW state (fp32 exp_avg and exp_avg_sq per parameter). Then,
in one run, side by side:

* save  = `CheckpointManager.save` (safetensors + torch.save + meta, BLAKE3 while writing, 3 fsyncs + dir fsyncs)
  vs raw write = writing the two resulting files' bytes from memory to new files + fsync each;
* load  = `CheckpointManager.load` into the model and a fresh AdamW (read, digest verify, deserialize, copy)
  vs raw read = reading the same two files into memory;
* verify = `latest_step()` (hashes both files: BLAKE3 on every core) vs raw read of the same files, and the same
  check with SHA-256 (what format /1 checkpoints record; a thread per file) for comparison.

Both sides read from a warm page cache (nothing drops caches). Ratios are raw_time / our_time (1.0 = as fast as
raw I/O; the aim is >= 0.5).

    python bench/checkpoint_cpu.py [--dir /tmp/ckpt_bench] [--repeats 2] [--layers 28] [--threads 2]
"""
import argparse
import gc
import os
import shutil
import time
import warnings
from pathlib import Path

import torch

from concurrent.futures import ThreadPoolExecutor

from mamba3_lite.checkpoint import CheckpointManager

try:
    from mamba3_lite.files import file_digest
except ImportError:                             # before the files module existed
    from mamba3_lite.checkpoint import file_digest

V, D, D_IN, N, H, D_FF = 50257, 1024, 2048, 128, 32, 2272
N_PARAMS_434M = 434_359_040


class StandInBlock(torch.nn.Module):
    "A Mamba-3 block's parameter shapes (`03_model`'s count): mixer 6,693,184 + SwiGLU 6,979,584 + two norms 2,048."
    def __init__(self):
        super().__init__()
        e = lambda *s: torch.nn.Parameter(torch.empty(*s))
        self.in_proj = e(2 * D_IN + 2 * N + 4 * H, D)    # 4096 + 256 + 96 + 32 = 4480 rows
        self.out_proj = e(D, D_IN)
        self.dt_bias, self.D = e(H), e(H)
        self.B_bias, self.C_bias = e(H, N), e(H, N)
        self.B_norm, self.C_norm = e(N), e(N)
        self.w1, self.w3, self.w2 = e(D_FF, D), e(D_FF, D), e(D, D_FF)
        self.norm1, self.norm2 = e(D), e(D)


class StandInLM(torch.nn.Module):
    "Same tensors as the 434M preset, tied embedding / LM head included; no forward (only its state is saved)."
    def __init__(self, n_layers=28):
        super().__init__()
        self.embed = torch.nn.Embedding(V, D)
        self.blocks = torch.nn.ModuleList(StandInBlock() for _ in range(n_layers))
        self.norm_f = torch.nn.Parameter(torch.empty(D))
        self.lm_head = torch.nn.Linear(D, V, bias=False)
        self.lm_head.weight = self.embed.weight


def build(n_layers):
    try:
        from mamba3_lite.model import Mamba3Transformer, ModelConfig
        if n_layers != 28:
            raise ImportError("stand-in requested for a reduced layer count")
        model, kind = Mamba3Transformer(ModelConfig.from_preset("a100-400m")), "Mamba3Transformer(a100-400m)"
    except ImportError:
        model, kind = StandInLM(n_layers), f"stand-in with the preset's tensor shapes ({n_layers} layers)"
    gen = torch.Generator().manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02, generator=gen)      # random bytes: nothing compresses, nothing is all-zero
            opt.state[p] = {"step": torch.tensor(1.0), "exp_avg": torch.randn(p.shape, generator=gen) * 1e-3,
                            "exp_avg_sq": torch.rand(p.shape, generator=gen) * 1e-6}
    return model, opt, kind


def raw_write(src: Path, dst: Path) -> float:
    "Write `src`'s bytes (already in memory) to `dst` + fsync; returns seconds (the read into memory is not timed)."
    data = src.read_bytes()
    t = time.perf_counter()
    with open(dst, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    dt = time.perf_counter() - t
    del data
    return dt


def raw_read(path: Path) -> float:
    t = time.perf_counter()
    data = path.read_bytes()
    dt = time.perf_counter() - t
    del data
    return dt


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/tmp/ckpt_bench", help="scratch directory (removed at the end)")
    ap.add_argument("--repeats", type=int, default=2, help="best-of-N for each timing")
    ap.add_argument("--layers", type=int, default=28, help="fewer layers for a quick smoke run (stand-in only)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    root = Path(a.dir)
    shutil.rmtree(root, ignore_errors=True)
    (root / "raw").mkdir(parents=True)

    t = time.perf_counter()
    model, opt, kind = build(a.layers)
    n = sum(p.numel() for p in model.parameters())
    print(f"model: {kind}: {n:,} parameters (unique){'' if n == N_PARAMS_434M or a.layers != 28 else '  != 434,359,040!'}"
          f", built in {time.perf_counter() - t:.1f} s")

    mgr = CheckpointManager(root / "ckpt")
    res = {k: [] for k in ("save", "raw_write", "verify", "verify_sha256", "load", "raw_read")}
    for r in range(a.repeats):
        t = time.perf_counter()
        mgr.save(model, opt, r)
        res["save"].append(time.perf_counter() - t)
        files = [mgr.paths(r)["model"], mgr.paths(r)["optim"]]
        res["raw_write"].append(sum(raw_write(f, root / "raw" / f.name) for f in files))
        for f in files:
            (root / "raw" / f.name).unlink()
        if r:                                   # keep only the newest checkpoint on disk
            for f in mgr.paths(r - 1).values():
                f.unlink()
    sizes = {f.name: f.stat().st_size for f in files}
    total = sum(sizes.values())

    step = a.repeats - 1
    for r in range(a.repeats):
        t = time.perf_counter()
        mgr._digests.clear()                    # measure a cold verification each time
        assert mgr.latest_step() == step
        res["verify"].append(time.perf_counter() - t)
        t = time.perf_counter()                 # the same check with SHA-256 (format /1 checkpoints), a thread per file
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(file_digest, files))
        res["verify_sha256"].append(time.perf_counter() - t)
    opt.state.clear()                           # resume: a fresh optimizer, the model's parameters exist
    gc.collect()
    for r in range(a.repeats):
        fresh = torch.optim.AdamW(model.parameters(), lr=1e-4)
        mgr._digests.clear()                    # a resume's load: verification included, nothing cached
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            mgr.load(model, step, optimizer=fresh)
        res["load"].append(time.perf_counter() - t)
        del fresh
        gc.collect()
        res["raw_read"].append(sum(raw_read(f) for f in files))

    best = {k: min(v) for k, v in res.items()}
    gb = total / 1e9
    print(f"files: " + ", ".join(f"{k} {v / 1e9:.3f} GB" for k, v in sizes.items()) + f"  (total {gb:.3f} GB)")
    print(f"best of {a.repeats}, warm page cache, {a.threads} threads\n")
    print(f"{'operation':<40}{'seconds':>9}{'GB/s':>8}{'raw/ours':>10}")
    rows = [("save  (CheckpointManager.save)", "save", "raw_write"),
            ("raw write + fsync", "raw_write", None),
            ("load  (CheckpointManager.load, verified)", "load", "raw_read"),
            ("raw read", "raw_read", None),
            ("verify (latest_step: the meta's digest)", "verify", "raw_read"),
            ("verify with SHA-256 (format /1)", "verify_sha256", "raw_read")]
    for label, k, ref in rows:
        ratio = f"{best[ref] / best[k]:>9.2f}x" if ref else ""
        print(f"{label:<40}{best[k]:>9.2f}{gb / best[k]:>8.2f}{ratio:>10}")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
