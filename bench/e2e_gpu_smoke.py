"""End-to-end smoke of Mamba-3-Lite on one GPU: six checks, each PASS/FAIL with its numbers and time.

1. kernel:     `ssd_triton` vs `ssd_chunked`, forward + backward (y, final state, every input gradient), fp32 and
               bf16 (against an fp32 `ssd_chunked` fed the same bf16-rounded inputs).
2. data:       a small prepared corpus (`prepare_corpus` on generated text when the GPT-2 ranks are available from
               $MAMBA3_LITE_GPT2_RANKS or tiktoken's cache, else synthetic token shards from `write_shard`) ->
               `PretrainDataset` + `WindowSampler` (and a DataLoader worker) -> (B, L) long batches on the device,
               checked token by token against the shards read back with `Shard`.
3. model:      tiny preset, bf16 autocast, ssd_dispatch="triton" (ENABLE_TRITON_KERNELS=1): finite loss and grads, the
               kernel really called, loss / logits / grads close to the same weights with ssd_dispatch="pytorch".
4. checkpoint: `CheckpointManager` save (through a torch.compile wrapper) -> load into a fresh model: weights and
               optimizer state bit-exact, the head still tied to the embedding, same logits.
5. train:      a 20-step `run_training` (tiny preset, triton dispatch, torch.compile) on the corpus of check 2: finite
               losses, checkpoints at steps 10 and 20, then a new `Pretrainer` discovers and resumes step 20 exactly.
6. generate:   the trained model of check 5 (`load_trained`): greedy `generate` with the O(1) cache equals greedy
               recompute over the whole prefix, token by token, and the step logits match.

    python bench/e2e_gpu_smoke.py                   # on a GPU (< 2 min on an H200), JSON to bench/results/
    python bench/e2e_gpu_smoke.py --cpu             # same checks on CPU: Triton interpreter, fp32, no compile
    python bench/e2e_gpu_smoke.py --checks 1,3      # a subset (checks 5 and 6 build what they need themselves)

--cpu runs check 5 with ssd_dispatch="pytorch": the interpreter needs ~10 s per tiny forward+backward (check 3
covers the Triton dispatch there). The exit status is 1 if any check fails, 2 on a usage error. The JSON is rewritten
after every check, so a run stopped by SIGINT (`timeout -s INT`, as bench/gpu_suite.sh does at a section's cap) or
killed keeps the checks it finished; on SIGINT the check it was in is added, failed, with `meta.interrupted`.
"""
import argparse
import datetime
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

# The interpreter must be chosen before triton / mamba3_lite.ssd_triton are imported; the smoke tests the opt-in path.
if "--cpu" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"
os.environ["ENABLE_TRITON_KERNELS"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # this checkout's mamba3_lite, installed or not

import numpy as np  # noqa: E402
import torch  # noqa: E402

from mamba3_lite.files import atomic_write  # noqa: E402
from mamba3_lite.ssd import nmax  # noqa: E402

TRAIN_STEPS = 20


# ---------------------------------------------------------------- metrics and bookkeeping
def p95_clamped(a, b) -> float:
    """95th percentile of the elementwise relative error |a - b| / max(|b|, 1% of max|b|). Unlike
    `mamba3_lite.ssd.p95`, which drops entries below an absolute floor, this keeps every entry."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    floor = 1e-2 * b.abs().max().clamp_min(1e-30)
    return float(np.percentile(((a - b).abs() / b.abs().clamp_min(floor)).numpy(), 95))


class Check:
    "One check's rows (name, value, bound, ok), details, time and error."
    def __init__(self, num: int, name: str):
        self.num, self.name, self.rows, self.details, self.error, self.seconds = num, name, [], {}, None, 0.0

    def at_most(self, name: str, value, bound):
        "A number that must be <= bound (NaN fails)."
        value = float(value)
        self.rows.append(dict(name=name, value=value, bound=bound, op="<=", ok=bool(value <= bound)))

    def equal(self, name: str, value, expected):
        self.rows.append(dict(name=name, value=value, bound=expected, op="==", ok=bool(value == expected)))

    def true(self, name: str, value: bool, note: str = ""):
        self.rows.append(dict(name=name, value=note or bool(value), bound=None, op="is true", ok=bool(value)))

    @property
    def ok(self) -> bool: return self.error is None and bool(self.rows) and all(r["ok"] for r in self.rows)

    def to_json(self) -> dict:
        return dict(num=self.num, name=self.name, ok=self.ok, seconds=round(self.seconds, 2), rows=self.rows,
                    details=self.details, error=self.error)


def fmt(v) -> str:
    if isinstance(v, float): return f"{v:.3e}" if v != 0 and (abs(v) < 1e-2 or abs(v) >= 1e4) else f"{v:.4g}"
    return str(v)


def report(c: Check):
    number = "no result"
    if c.rows:
        head = c.rows[0]
        number = f"{head['name']} = {fmt(head['value'])}"
        if head["bound"] is not None: number += f" ({head['op']} {fmt(head['bound'])})"
    print(f"{'PASS' if c.ok else 'FAIL'} [{c.num}] {c.name}: {number}  ({c.seconds:.1f}s)", flush=True)
    for r in c.rows:
        bound = "" if r["bound"] is None else f" {r['op']} {fmt(r['bound'])}"
        print(f"       {'ok ' if r['ok'] else 'BAD'} {r['name']}: {fmt(r['value'])}{bound}")
    if c.error: print(f"       error: {c.error.splitlines()[-1]}")


def sync(device):
    if device.type == "cuda": torch.cuda.synchronize(device)


# ---------------------------------------------------------------- check 1: kernel vs reference
def check_kernel(ctx, c: Check):
    from mamba3_lite.ssd import SSDState, ssd_chunked, ssd_random_inputs, ssd_random_state
    from mamba3_lite.ssd_triton import ssd_triton

    dev = ctx.device
    sh = dict(b=1, T=40, H=2, P=16, N=16, S=4) if ctx.cpu else dict(b=2, T=200, H=4, P=64, N=64, S=16)
    L = 16 if ctx.cpu else 64
    c.details.update(shape=sh, chunk_size=L, initial_state=True)
    kw = ssd_random_inputs(**sh, dtype=torch.float32, seed=0, device=dev)
    st = ssd_random_state(b=sh["b"], H=sh["H"], P=sh["P"], N=sh["N"], S=sh["S"], dtype=torch.float32, seed=1, device=dev)

    def run(fn, inputs, state):
        "Forward + backward of a fixed random projection of y and the final state; returns y, state, grads."
        inputs = {k: v.detach().clone().requires_grad_(True) for k, v in inputs.items()}
        state = SSDState(*(t.detach().clone().requires_grad_(True) for t in state))
        y, out = fn(**inputs, initial_state=state, chunk_size=L)
        g = torch.Generator().manual_seed(2)
        loss = sum((o.float() * torch.randn(o.shape, generator=g).to(dev)).sum() for o in (y, *out) if o.numel())
        loss.backward()
        leaves = {**inputs, **{f"state.{k}": v for k, v in state._asdict().items()}}
        return y, out, {k: v.grad for k, v in leaves.items() if v.numel()}

    def worst_grad(ga, gr):
        errs = {k: (nmax(ga[k], gr[k]) if ga[k] is not None and gr[k] is not None else
                    0.0 if ga[k] is None and gr[k] is None else float("inf")) for k in gr}
        k = max(errs, key=errs.get)
        return errs[k], k

    rows = []
    if not ctx.cpu:   # bf16 first: the headline on a GPU
        kw16 = {k: (v.to(torch.bfloat16) if k in ("x", "B", "C") else v) for k, v in kw.items()}
        kw32 = {k: v.float() for k, v in kw16.items()}
        y16, s16, g16 = run(ssd_triton, kw16, st)
        y32, s32, g32 = run(ssd_chunked, kw32, st)
        gerr, gname = worst_grad(g16, g32)
        rows += [("bf16 y nmax vs fp32 ref", nmax(y16, y32), 2e-2), ("bf16 y p95 rel err", p95_clamped(y16, y32), 5e-2),
                 ("bf16 final h nmax", nmax(s16.h, s32.h), 2e-2), (f"bf16 worst grad nmax ({gname})", gerr, 5e-2)]
    y_r, s_r, g_r = run(ssd_chunked, kw, st)
    y_t, s_t, g_t = run(ssd_triton, kw, st)
    gerr, gname = worst_grad(g_t, g_r)
    rows += [("fp32 y nmax vs ssd_chunked", nmax(y_t, y_r), 1e-4), ("fp32 final h nmax", nmax(s_t.h, s_r.h), 1e-4),
             ("fp32 final angle nmax", nmax(s_t.angle, s_r.angle), 1e-4),
             (f"fp32 worst grad nmax ({gname})", gerr, 1e-3)]
    for name, value, bound in rows: c.at_most(name, value, bound)


# ---------------------------------------------------------------- check 2: data pipeline
WORDS = dict(adj="quick lazy bright silent ancient hollow crimson gentle rapid frozen".split(),
             noun="fox river engine garden signal window market tower forest kernel".split(),
             verb="jumps over|flows past|drives into|grows near|points at|opens onto|leans on|hides behind".split("|"))


def synthetic_text(rng, n_sentences: int) -> str:
    "Grammar-generated English: a tiny language a model can start to learn in 20 steps."
    pick = lambda k: WORDS[k][rng.integers(len(WORDS[k]))]
    out = []
    for i in range(n_sentences):
        out.append(f"The {pick('adj')} {pick('noun')} {pick('verb')} the {pick('adj')} {pick('noun')}.")
        if i % 8 == 7: out.append("\n\n")
    return " ".join(out)


def synthetic_tokens(rng, n_tokens: int, eos: int) -> np.ndarray:
    "A Markov stream over 512 GPT-2 ids (each has 4 likely successors), documents of 50-400 tokens split by EOS."
    ids = rng.choice(eos, 512, replace=False)
    succ = rng.integers(0, 512, size=(512, 4))
    out, s, left = np.empty(n_tokens, dtype=np.int64), 0, int(rng.integers(50, 400))
    for i in range(n_tokens):
        if left == 0:
            out[i], left = eos, int(rng.integers(50, 400)); continue
        s = succ[s, rng.integers(4)] if rng.random() < 0.9 else int(rng.integers(512))
        out[i], left = ids[s], left - 1
    return out


def gpt2_ranks_source():
    "Where prepare_corpus would read the GPT-2 ranks from without a download, or None."
    from mamba3_lite.tokenizer import RANKS_ENV, r50k_cache_path
    if os.environ.get(RANKS_ENV): return f"${RANKS_ENV}={os.environ[RANKS_ENV]}"
    try: cached = r50k_cache_path()
    except ValueError: return None
    return f"tiktoken cache {cached}" if cached.is_file() else None


def ensure_corpus(ctx) -> Path:
    "Write the smoke corpus once (ctx.corpus: dir with train/ and val/ shards) and return it."
    if ctx.corpus is not None: return ctx.corpus
    from mamba3_lite.data import DTYPE_NAMES, token_dtype_code, write_shard
    from mamba3_lite.prepare import prepare_corpus
    from mamba3_lite.tokenizer import GPT2_EOS_ID, GPT2_VOCAB_SIZE
    out = ctx.workdir / "corpus"
    rng = np.random.default_rng(0)
    src = gpt2_ranks_source()
    if src is not None:
        n_files, n_sent = (4, 250) if ctx.cpu else (8, 800)
        text_dir = ctx.workdir / "text"
        text_dir.mkdir(parents=True, exist_ok=True)
        for i in range(n_files): (text_dir / f"doc_{i}.txt").write_text(synthetic_text(rng, n_sent))
        man = prepare_corpus([text_dir], out, shard_size_tokens=2_000 if ctx.cpu else 10_000,
                             val_tokens=1_024 if ctx.cpu else 4_096, progress=False)
        ctx.corpus_info = dict(kind="prepare_corpus (GPT-2 BPE) on generated text", ranks=src,
                               train_tokens=man["train"]["n_tokens"], val_tokens=man["val"]["n_tokens"],
                               train_shards=len(man["train"]["shards"]))
    else:
        print("  [note] GPT-2 ranks not available offline (no $MAMBA3_LITE_GPT2_RANKS, no tiktoken cache): "
              "check 2 writes SYNTHETIC token shards with write_shard instead of running prepare_corpus", flush=True)
        n_train, n_val = (3_000, 1_024) if ctx.cpu else (12_000, 4_096)
        stream = synthetic_tokens(rng, 2 * n_train + n_val, GPT2_EOS_ID)
        for split, parts in (("train", [stream[:n_train], stream[n_train:2 * n_train]]), ("val", [stream[2 * n_train:]])):
            (out / split).mkdir(parents=True, exist_ok=True)
            shards = [dict(file=f"shard_{k:06d}.bin", n_tokens=int(toks.size),
                           dtype=DTYPE_NAMES[token_dtype_code(GPT2_VOCAB_SIZE)],
                           sha256=write_shard(out / split / f"shard_{k:06d}.bin", toks, vocab_size=GPT2_VOCAB_SIZE,
                                              eos_id=GPT2_EOS_ID)) for k, toks in enumerate(parts)]
            manifest = dict(format="mamba3-lite-shards", tokenizer="synthetic (no BPE)", vocab_size=GPT2_VOCAB_SIZE,
                            eos_id=GPT2_EOS_ID, n_tokens=sum(s["n_tokens"] for s in shards), shards=shards)
            (out / split / "manifest.json").write_text(json.dumps(manifest, indent=1))   # what prepare commits last
        ctx.corpus_info = dict(kind="synthetic Markov token shards (write_shard)", ranks=None,
                               train_tokens=2 * n_train, val_tokens=n_val, train_shards=2)
    ctx.corpus = out
    return out


def check_data(ctx, c: Check):
    from torch.utils.data import DataLoader
    from mamba3_lite.data import PretrainDataset, Shard, WindowSampler
    from mamba3_lite.tokenizer import GPT2_VOCAB_SIZE

    dev, L, B = ctx.device, ctx.seq_len, ctx.batch
    corpus = ensure_corpus(ctx)
    c.details.update(ctx.corpus_info, seq_len=L, batch=B)
    ds = PretrainDataset(corpus, L, GPT2_VOCAB_SIZE, split="train")
    raw = np.concatenate([Shard(p).tokens for p in sorted((corpus / "train").glob("shard_*.bin"))]).astype(np.int64)
    c.details["windows"] = len(ds)
    sampler = WindowSampler(len(ds), B, shuffle=True, seed=0)
    index_batches = list(itertools.islice(iter(sampler), 3))
    pin = dev.type == "cuda"
    got = []
    for idx in index_batches[:2]:                                # the trainer's path: get_batch -> device
        b = ds.get_batch(idx)
        x, y = b.x, b.y
        if pin: x, y = x.pin_memory(), y.pin_memory()
        got.append((idx, x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)))
    loader = DataLoader(ds, batch_sampler=index_batches[2:], num_workers=1, pin_memory=pin)
    for x, y in loader:                                          # a worker process (the dataset pickles as its constructor)
        got.append((index_batches[2], x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)))
    sync(dev)
    mismatched, shapes_ok, dtype_ok, device_ok, shift_ok = 0, True, True, True, True
    for idx, x, y in got:
        want = torch.from_numpy(np.stack([raw[i * L:i * L + L + 1] for i in idx]))
        mismatched += int((x.cpu() != want[:, :-1]).sum() + (y.cpu() != want[:, 1:]).sum())
        shapes_ok &= tuple(x.shape) == (B, L) and tuple(y.shape) == (B, L)
        dtype_ok &= x.dtype == torch.long and y.dtype == torch.long
        device_ok &= x.device.type == dev.type and y.device.type == dev.type
        shift_ok &= bool(torch.equal(y[:, :-1], x[:, 1:]))
    c.equal("tokens differing from the shards read back", mismatched, 0)
    c.equal("batches checked (2 get_batch + 1 DataLoader worker)", len(got), 3)
    c.true(f"shapes (B, L) = ({B}, {L})", shapes_ok)
    c.true("dtype torch.long", dtype_ok)
    c.true(f"on {dev.type}", device_ok)
    c.true("y[:, j] == x[:, j + 1]", shift_ok)
    c.equal("windows = (tokens - 1) // L", len(ds), (raw.size - 1) // L)


# ---------------------------------------------------------------- check 3: model forward/backward, triton dispatch
def check_model(ctx, c: Check):
    import mamba3_lite.ssd_triton as kernel_mod
    from mamba3_lite.model import Mamba3Transformer, ModelConfig

    dev = ctx.device
    B, T = (1, 32) if ctx.cpu else (4, 256)
    amp = None if ctx.cpu else torch.bfloat16
    c.details.update(batch=B, seq_len=T, autocast=str(amp), preset="tiny")
    torch.manual_seed(0)
    m_tri = Mamba3Transformer(ModelConfig.from_preset("tiny", ssd_dispatch="triton")).to(dev)
    m_pt = Mamba3Transformer(ModelConfig.from_preset("tiny", ssd_dispatch="pytorch")).to(dev)
    m_pt.load_state_dict(m_tri.state_dict())
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, m_tri.config.vocab_size, (B, T + 1), generator=g).to(dev)
    inp, tgt = ids[:, :-1], ids[:, 1:]

    def fwd_bwd(model):
        with torch.autocast(dev.type, dtype=amp) if amp is not None else torch.autocast(dev.type, enabled=False):
            out = model(inp, targets=tgt)
        out.loss.backward()
        return out.loss.detach().float(), out.logits.detach().float(), {n: p.grad for n, p in model.named_parameters()}

    calls = [0]
    real = kernel_mod.ssd_triton
    def counted(*a, **k):
        calls[0] += 1
        return real(*a, **k)
    kernel_mod.ssd_triton = counted                              # the block imports it from the module at call time
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loss_t, logits_t, grads_t = fwd_bwd(m_tri)
    finally:
        kernel_mod.ssd_triton = real
    fallbacks = [str(w.message)[:160] for w in caught if "Triton" in str(w.message) or "ENABLE_TRITON" in str(w.message)]
    loss_p, logits_p, grads_p = fwd_bwd(m_pt)
    sync(dev)
    no_grad = [n for n, gr in grads_t.items() if gr is None]
    bad = [n for n, gr in grads_t.items() if gr is not None and not torch.isfinite(gr).all()]
    both = [n for n in grads_p if grads_t[n] is not None and grads_p[n] is not None]
    flat = lambda grads: torch.cat([grads[n].detach().double().flatten() for n in both])
    g_t, g_p = flat(grads_t), flat(grads_p)
    rel_l2 = ((g_t - g_p).norm() / g_p.norm().clamp_min(1e-30)).item()
    worst = max(((nmax(grads_t[n], grads_p[n]), n) for n in both), default=(float("inf"), "none"))
    tol = dict(loss=1e-5, logits=1e-4, grad=1e-4) if ctx.cpu else dict(loss=1e-2, logits=5e-2, grad=5e-2)
    c.details.update(loss_triton=loss_t.item(), loss_pytorch=loss_p.item(), fallback_warnings=fallbacks,
                     worst_param_grad_nmax=dict(param=worst[1], value=worst[0]))
    c.at_most("|loss_triton - loss_pytorch| / loss", abs(loss_t - loss_p).item() / loss_p.abs().item(), tol["loss"])
    c.true("loss finite", bool(torch.isfinite(loss_t)), f"{loss_t.item():.4f}")
    c.equal("ssd_triton calls in the forward (one per layer)", calls[0], m_tri.config.n_layers)
    c.equal("fallback warnings", len(fallbacks), 0)
    c.equal("parameters without a grad", len(no_grad), 0)
    c.equal("parameters with non-finite grads", len(bad), 0)
    c.at_most("logits nmax vs pytorch dispatch", nmax(logits_t, logits_p), tol["logits"])
    c.at_most("all grads: relative L2 error vs pytorch dispatch", rel_l2, tol["grad"])


# ---------------------------------------------------------------- check 4: checkpoint round trip
def check_checkpoint(ctx, c: Check):
    import safetensors.torch
    from mamba3_lite.checkpoint import CheckpointManager
    from mamba3_lite.model import Mamba3Transformer, ModelConfig

    dev = ctx.device
    cfg = ModelConfig.from_preset("tiny")

    def trained_once(seed):
        torch.manual_seed(seed)
        m = Mamba3Transformer(cfg).to(dev)
        opt = torch.optim.AdamW(m.param_groups(0.1), lr=1e-3)
        ids = torch.randint(0, cfg.vocab_size, (2, 33), generator=torch.Generator().manual_seed(seed)).to(dev)
        m(ids[:, :-1], targets=ids[:, 1:]).loss.backward()
        opt.step(); opt.zero_grad(set_to_none=True)
        return m, opt

    m, opt = trained_once(1)
    mgr = CheckpointManager(ctx.workdir / "ckpt")
    mgr.save(torch.compile(m), opt, 1, extra_meta={"note": "e2e smoke"})     # the wrapper is not run, only saved
    keys = list(safetensors.torch.load_file(mgr.paths(1)["model"]))
    m2, opt2 = trained_once(2)
    mgr.load(m2, 1, device=str(dev), optimizer=opt2)
    sd, sd2 = m.state_dict(), m2.state_dict()
    diff = [k for k in sd if not torch.equal(sd[k], sd2[k])]
    max_abs = max((sd[k].float() - sd2[k].float()).abs().max().item() for k in sd)
    o, o2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    odiff = sum(1 for i in o for k in o[i] if not torch.equal(torch.as_tensor(o[i][k]).cpu(), torch.as_tensor(o2[i][k]).cpu()))
    m.eval(); m2.eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(4)).to(dev)
    with torch.no_grad():
        logits_err = nmax(m2(ids).logits, m(ids).logits)
    c.details.update(file_keys=len(keys), step_files=sorted(p.name for p in mgr.checkpoint_dir.iterdir()))
    c.at_most("max |w_saved - w_loaded|", max_abs, 0.0)
    c.equal("weight tensors not bit-exact", len(diff), 0)
    c.equal("optimizer state tensors not bit-exact", odiff, 0)
    c.equal("optimizer states restored", len(o2), len(o))
    c.true("head tied to the embedding after load", m2.lm_head.weight is m2.embed.weight
           and m2.lm_head.weight.data_ptr() == m2.embed.weight.data_ptr())
    c.true("file stores the tied weight once, no '_orig_mod.' keys",
           not any("lm_head" in k or "_orig_mod" in k for k in keys) and "embed.weight" in keys)
    c.equal("latest_step()", mgr.latest_step(), 1)
    c.equal("problems(1)", len(mgr.problems(1)), 0)
    c.at_most("logits nmax, loaded vs saved model", logits_err, 1e-6)


# ---------------------------------------------------------------- check 5: 20-step Pretrainer run with compile
def train_config(ctx):
    from mamba3_lite.config import DataConfig, LoopConfig, TrainingConfig
    return TrainingConfig(
        model={"preset": "tiny", "ssd_dispatch": "pytorch" if ctx.cpu else "triton"},
        data=DataConfig(data_path=str(ensure_corpus(ctx)), max_seq_len=ctx.seq_len, shuffle=True),
        training=LoopConfig(seed=0, lr=3e-3, warmup_steps=2, max_steps=TRAIN_STEPS, micro_batch_size=ctx.batch,
                            gradient_accumulation_steps=1, log_every=5, eval_every=10, eval_batches=2,
                            save_every=10, checkpoint_dir=str(ctx.checkpoint_dir), compile=not ctx.cpu,
                            compile_mode=ctx.compile_mode, precision="fp32" if ctx.cpu else "bf16",
                            device=ctx.device.type))


class patched_env:
    "Set / unset environment variables for a block, restoring them afterwards."
    def __init__(self, **values): self.values, self.saved = values, {}
    def __enter__(self):
        for k, v in self.values.items():
            self.saved[k] = os.environ.get(k)
            if v is None: os.environ.pop(k, None)
            else: os.environ[k] = v
    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None: os.environ.pop(k, None)
            else: os.environ[k] = v


def check_train(ctx, c: Check):
    import safetensors.torch
    from mamba3_lite.checkpoint import CheckpointManager
    from mamba3_lite.logger import read_metrics
    from mamba3_lite.train import Pretrainer, run_training

    cfg = train_config(ctx)
    log = lambda s: print(f"    | {s}", flush=True)
    c.details.update(model=cfg.model, seq_len=ctx.seq_len, micro_batch=ctx.batch, compile=cfg.training.compile,
                     compile_mode=ctx.compile_mode)
    if os.environ.get("WANDB_PROJECT"): print("  [note] WANDB_PROJECT is unset for this check (no smoke runs in WandB)")
    with patched_env(TORCH_COMPILE_MODE=ctx.compile_mode, WANDB_PROJECT=None):
        t0 = time.perf_counter()
        res = run_training(cfg, log=log)
        sync(ctx.device)
        train_s = time.perf_counter() - t0
        train_losses = [r["loss"] for r in read_metrics(ctx.checkpoint_dir) if r.get("kind") == "train"]
        mgr = CheckpointManager(ctx.checkpoint_dir)
        steps, latest = mgr.list_steps(), mgr.latest_step()
        trainer = Pretrainer(cfg, log=log)                     # a new process would see exactly this directory
        resumed = trainer.train()
    saved = safetensors.torch.load_file(mgr.paths(TRAIN_STEPS)["model"])
    live = trainer.raw_model.state_dict()
    not_exact = [k for k in saved if not torch.equal(saved[k], live[k].cpu())]
    meta = mgr.read_meta(TRAIN_STEPS)
    first, final = res["first_eval_loss"], res["final_eval_loss"]
    if trainer.compiled:                                       # information: where dynamo split the graph
        from torch._dynamo.utils import counters
        c.details["graph_breaks"] = {str(k)[:160]: v for k, v in counters["graph_break"].items()}
    c.details.update(train_wall_s=round(train_s, 1), first_eval_loss=first, final_eval_loss=final,
                     train_losses=train_losses, checkpoint_steps=steps, tokens_seen=res["tokens_seen"])
    c.equal("final step", res["final_step"], TRAIN_STEPS)
    c.true("train losses finite", bool(train_losses) and all(v is not None and math.isfinite(v) for v in train_losses),
           f"{len(train_losses)} logged, last {train_losses[-1] if train_losses else None}")
    c.true("eval losses finite", first is not None and final is not None and math.isfinite(first) and math.isfinite(final),
           f"{first} -> {final}")
    c.true("validation loss went down", first is not None and final is not None and final < first, f"{first} -> {final}")
    c.true("torch.compile used", trainer.compiled or ctx.cpu, "compiled" if trainer.compiled else "off (--cpu)")
    c.equal("checkpoint steps on disk", steps, [10, TRAIN_STEPS])
    c.equal("latest_step() (resume discovery)", latest, TRAIN_STEPS)
    c.equal("new Pretrainer resumed at step", resumed["first_step"], TRAIN_STEPS)
    c.equal("resumed weights not bit-exact to the file", len(not_exact), 0)
    c.true("data position restored", trainer.train_stream.state_dict() == meta["data_position"][0])


# ---------------------------------------------------------------- check 6: generation with the cache
def check_generate(ctx, c: Check):
    from mamba3_lite.checkpoint import CheckpointManager
    from mamba3_lite.model import Mamba3Transformer, ModelConfig
    from mamba3_lite.evaluate import load_trained

    dev = ctx.device
    if CheckpointManager(ctx.checkpoint_dir).latest_step() is not None:
        model, _, meta = load_trained(ctx.checkpoint_dir, device=str(dev), log=lambda s: print(f"    | {s}"))
        c.details["model"] = f"trained, checkpoint step {meta['step']} of check 5 ({model.config.ssd_dispatch} dispatch)"
    else:
        torch.manual_seed(0)
        model = Mamba3Transformer(ModelConfig.from_preset("tiny", ssd_dispatch="pytorch" if ctx.cpu else "triton")).to(dev).eval()
        c.details["model"] = "fresh init (check 5 left no checkpoint)"
    print(f"  model: {c.details['model']}")
    b, T0, n = (2, 12, 6) if ctx.cpu else (2, 20, 8)
    prompt = torch.randint(0, model.config.vocab_size, (b, T0), generator=torch.Generator().manual_seed(5)).to(dev)
    with torch.no_grad():
        logits, cache = model.prefill(prompt)
        seq, cached_tokens, errs, margins = prompt, [], [], []
        for i in range(n):
            full = model(seq, num_last_tokens=1).logits[:, -1]   # greedy recompute over the whole prefix
            errs.append(nmax(logits, full))
            top2 = full.float().topk(2, dim=-1).values
            margins.append((top2[:, 0] - top2[:, 1]).min().item())
            nxt = logits.argmax(-1)
            recomputed = full.argmax(-1)
            cached_tokens.append(nxt)
            seq = torch.cat([seq, recomputed[:, None]], 1)
            if i < n - 1: logits = model.step(nxt, cache)
        cached = torch.cat([prompt, torch.stack(cached_tokens, 1)], 1)
    gen = model.generate(prompt, max_new_tokens=n, temperature=0)
    c.details.update(prompt_len=T0, new_tokens=n, smallest_top2_margin=min(margins), generated=gen[:, T0:].tolist())
    c.equal("tokens differing: cached greedy vs recompute", int((cached != seq).sum()), 0)
    c.equal("tokens differing: generate() vs recompute", int((gen != seq).sum()), 0)
    c.at_most("worst step-logits nmax vs recompute", max(errs), 1e-3)


# ---------------------------------------------------------------- driver
CHECKS = [(1, "kernel vs reference (ssd_triton vs ssd_chunked, fwd+bwd)", check_kernel),
          (2, "data pipeline to device batches", check_data),
          (3, "model fwd/bwd, triton dispatch" + " (bf16 autocast on GPU)", check_model),
          (4, "checkpoint round trip", check_checkpoint),
          (5, f"{TRAIN_STEPS}-step Pretrainer run + resume", check_train),
          (6, "generation: cache vs greedy recompute", check_generate)]


class Context:
    "What the checks share: device, mode, sizes, the work directory, the corpus and run directory once made."
    def __init__(self, a, device, workdir):
        self.cpu, self.device, self.workdir = a.cpu, device, workdir
        self.seq_len, self.batch = (32, 4) if a.cpu else (128, 8)
        self.compile_mode = a.compile_mode
        self.corpus, self.corpus_info = None, {}
        self.checkpoint_dir = workdir / "run"


def git_commit():
    try: return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError): return None


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true", help="CPU at tiny scale: Triton interpreter, fp32, no compile")
    p.add_argument("--smoke", action="store_true", help="accepted for bench/gpu_suite.sh; this script is always a smoke")
    p.add_argument("--out", default="bench/results/e2e_gpu_smoke.json",
                   help="JSON results file (a path not ending in .json is a directory: <dir>/e2e_gpu_smoke.json)")
    p.add_argument("--checks", default="1,2,3,4,5,6", help="comma-separated check numbers to run (default all)")
    p.add_argument("--workdir", default=None, help="keep corpus/checkpoints/run here (default: a temp dir, removed)")
    p.add_argument("--compile-mode", default="default",
                   help="torch.compile mode for check 5 (sets TORCH_COMPILE_MODE for it; max-autotune takes minutes)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads in --cpu mode")
    a = p.parse_args(argv)
    try: a.checks = sorted({int(s) for s in a.checks.split(",") if s.strip()})
    except ValueError: p.error(f"--checks: expected comma-separated numbers 1-6, got {a.checks!r}")
    if not a.checks or any(n not in range(1, 7) for n in a.checks):
        p.error(f"--checks: expected numbers in 1-6, got {a.checks}")
    if not a.cpu and not torch.cuda.is_available():
        p.error("no CUDA device visible; run with --cpu for the CPU / Triton-interpreter version of the smoke")
    out = Path(a.out)
    a.out = out if out.suffix == ".json" else out / "e2e_gpu_smoke.json"
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    torch.set_flush_denormal(True)
    if a.cpu: torch.set_num_threads(a.threads)
    device = torch.device("cpu") if a.cpu else torch.device("cuda", torch.cuda.current_device())
    import triton
    dev_name = "CPU (Triton interpreter)" if a.cpu else torch.cuda.get_device_name(device)
    meta = dict(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), device=dev_name,
                mode="cpu" if a.cpu else "gpu", torch=torch.__version__, triton=triton.__version__, commit=git_commit(),
                checks=a.checks, compile_mode=a.compile_mode, python=sys.version.split()[0])
    print(f"e2e smoke on {dev_name} (torch {torch.__version__}, triton {triton.__version__}); checks {a.checks}", flush=True)
    tmp = None
    if a.workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="m3l_e2e_")
        workdir = Path(tmp.name)
    else:
        workdir = Path(a.workdir)
        if workdir.exists() and any(workdir.iterdir()):
            print(f"e2e_gpu_smoke: --workdir {workdir} is not empty; give a new or empty directory", file=sys.stderr)
            return 2
        workdir.mkdir(parents=True, exist_ok=True)
    ctx = Context(a, device, workdir)
    results, t_all = [], time.perf_counter()
    a.out.parent.mkdir(parents=True, exist_ok=True)

    def write() -> bool:
        "Rewrite the JSON with the checks finished so far (after each one, and on the way out); True if all passed."
        meta["wall_s"] = round(time.perf_counter() - t_all, 1)
        meta["corpus"] = ctx.corpus_info
        ok = bool(results) and all(c.ok for c in results) and len(results) == len(a.checks)
        text = json.dumps(dict(meta=meta, ok=ok, checks=[c.to_json() for c in results]), indent=1, default=str)
        atomic_write(a.out, lambda tmp_path: tmp_path.write_text(text), sync_dir=False)
        return ok

    try:
        for num, name, fn in CHECKS:
            if num not in a.checks: continue
            c, t0 = Check(num, name), time.perf_counter()
            try:
                print(f"--- [{num}] {name}", flush=True)
                fn(ctx, c)
                sync(device)
            except Exception:
                c.error = traceback.format_exc()
                print(c.error, file=sys.stderr, flush=True)
            except KeyboardInterrupt:   # SIGINT (the GPU suite's cap): the check it stopped is kept as failed
                c.error = meta["interrupted"] = f"interrupted (SIGINT) during check [{num}] {name}"
                c.seconds = time.perf_counter() - t0
                results.append(c)
                raise
            c.seconds = time.perf_counter() - t0
            report(c)
            results.append(c)
            write()
    finally:
        ok = write()
        if tmp is not None: tmp.cleanup()
    passed = sum(c.ok for c in results)
    print(f"\n{'PASS' if ok else 'FAIL'}: {passed}/{len(a.checks)} checks passed in {meta['wall_s']}s; wrote {a.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    import sigint_once
    sigint_once.install()
    sys.exit(main())
