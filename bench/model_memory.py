"""What training the Mamba-3 LM holds in GPU memory, counted without a GPU: whether a configuration fits a card.

One forward of the model on fake tensors (`FakeTensorMode`: shapes and dtypes, no storage), under bf16 autocast, with
the training loss (`lm_loss`: the chunked loss, no logits kept) and the Triton SSD's launches stubbed out (its output
and saved tensors are allocated as on a GPU, nothing is computed), counts every tensor autograd saves for the backward
(`saved_tensors_hooks`), each storage once, parameters left out:

    saved, no checkpointing   = every saved tensor
    saved, checkpointing      = every saved tensor of the checkpointed forward (each layer's input, which its
                                checkpoint keeps, and what lies outside the layers) + one layer's own saved tensors
                                without checkpointing, its input left out (its recompute in the backward)
    weights, gradients, AdamW = params x (4 + 4 [+ 8 with the optimizer]) bytes, fp32
    floor                     = weights, gradients, AdamW + saved

The floor leaves out the backward's transient gradients, the allocator's fragmentation and the CUDA context, so a run
needs more: `fits` asks for the floor to be at most 90% of the card. Autocast is the CPU's (the matrix products in
bf16, as on CUDA).

    python bench/model_memory.py                                     # the 434M preset at 16 x 2048, both ways
    python bench/model_memory.py --preset tiny --batch 2 --seq-len 64
"""
import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # this checkout's mamba3_lite, installed or not
import torch  # noqa: E402

FIT_FRACTION = 0.9   # of the card's memory that the floor may take


@contextlib.contextmanager
def stubbed_triton_ssd():
    "ssd_dispatch='triton' on CPU fake tensors: the kernel path taken, launches stubbed, bf16 operands as on a GPU."
    import mamba3_lite.block as block
    import mamba3_lite.ssd_triton as st
    saved = (block._triton_ssd_or_reason, st._require_cuda, st._launch, st._dot_dtype,
             os.environ.get("ENABLE_TRITON_KERNELS"))
    block._triton_ssd_or_reason = lambda *a, **k: (st.ssd_triton, None)
    st._require_cuda = lambda x: None
    st._launch = lambda *a, **k: None
    st._dot_dtype = lambda d: st._TL_DTYPES[d]
    os.environ["ENABLE_TRITON_KERNELS"] = "1"
    try:
        yield
    finally:
        block._triton_ssd_or_reason, st._require_cuda, st._launch, st._dot_dtype, env = saved
        if env is None: os.environ.pop("ENABLE_TRITON_KERNELS")
        else: os.environ["ENABLE_TRITON_KERNELS"] = env


@contextlib.contextmanager
def own_constants():
    "mamba3_lite.ssd's cache of 0-dim constants emptied for the fake forward and given back after (fake tensors stay out of it)."
    import mamba3_lite.ssd as ssd
    kept = dict(ssd._CONSTS)
    ssd._CONSTS.clear()
    try:
        yield
    finally:
        ssd._CONSTS.clear()
        ssd._CONSTS.update(kept)


def saved_bytes(cfg, batch, seq_len, dtype=torch.bfloat16):
    """Bytes autograd saves for the backward in one training forward of `cfg` at batch x seq_len (each storage once,
    parameters left out): dict(total=all of them, as configured (with gradient checkpointing: what the checkpoints
    keep and what lies outside the layers), layer=one layer's own saved tensors without checkpointing, its input
    left out (what its recompute adds in the backward), params=count)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from mamba3_lite.data import Batch
    from mamba3_lite.evaluate import lm_loss
    from mamba3_lite.model import Mamba3Transformer

    triton = cfg.ssd_dispatch == "triton"
    amp = (lambda: torch.autocast("cpu", dtype=dtype)) if dtype != torch.float32 else contextlib.nullcontext
    with (stubbed_triton_ssd() if triton else contextlib.nullcontext()), own_constants(), FakeTensorMode():
        model = Mamba3Transformer(cfg).train()
        skip = {p.untyped_storage()._cdata for p in model.parameters()}
        seen = {}

        def pack(t):
            s = t.untyped_storage()
            if s._cdata not in skip:
                seen.setdefault(s._cdata, s.nbytes())
            return t

        ids = torch.randint(0, cfg.vocab_size, (batch, seq_len + 1))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), amp():
            lm_loss(model, Batch(ids[:, :-1], ids[:, 1:]))
        total, seen = sum(seen.values()), {}
        x = torch.randn(batch, seq_len, cfg.d_model, requires_grad=True)   # the fp32 residual stream
        skip.add(x.untyped_storage()._cdata)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), amp():
            model.layers[0]._forward_impl(x)
        n_params = model.num_parameters()
    return dict(total=total, layer=sum(seen.values()), params=n_params)


def training_memory(cfg, batch, seq_len, optimizer=True, dtype=torch.bfloat16):
    """The floor of a training step's GPU memory (module docstring) in bytes, by part: dict(saved, states, floor,
    grad_checkpoint, params, count_s)."""
    t0 = time.perf_counter()
    s = saved_bytes(cfg, batch, seq_len, dtype)
    saved = s["total"] + (s["layer"] if cfg.grad_checkpoint else 0)
    states = s["params"] * (16 if optimizer else 8)
    return dict(saved=saved, states=states, floor=saved + states, grad_checkpoint=cfg.grad_checkpoint,
                params=s["params"], count_s=time.perf_counter() - t0)


def fits(mem, capacity_bytes):
    "(ok, one line): whether the floor of `mem` (training_memory) is at most FIT_FRACTION of `capacity_bytes`."
    gib = lambda b: f"{b / 2**30:.1f} GiB"
    what = (f"needs at least {gib(mem['floor'])} ({gib(mem['saved'])} saved for backward + {gib(mem['states'])} of "
            f"weights, gradients{' and AdamW' if mem['states'] >= 16 * mem['params'] else ''})")
    ok = mem["floor"] <= FIT_FRACTION * capacity_bytes
    return ok, f"{what}, {'within' if ok else 'more than'} {FIT_FRACTION:.0%} of {gib(capacity_bytes)}"


def main(argv=None):
    from mamba3_lite.model import ModelConfig
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="a100-400m")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--ssd-dispatch", default="triton", choices=["triton", "pytorch"])
    p.add_argument("--no-optimizer", action="store_true", help="weights and gradients only (bench/model_gpu.py's step)")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    print(f"{a.preset} at {a.batch} x {a.seq_len}, bf16 autocast, ssd_dispatch={a.ssd_dispatch}"
          f"{', no optimizer' if a.no_optimizer else ', AdamW'} (fake tensors; GiB = 2^30 bytes)")
    print(f"{'grad_checkpoint':>16} {'saved GiB':>10} {'states GiB':>11} {'floor GiB':>10} {'floor GB':>9} {'count s':>8}")
    for ckpt in (False, True):
        cfg = ModelConfig.from_preset(a.preset, grad_checkpoint=ckpt, ssd_dispatch=a.ssd_dispatch)
        m = training_memory(cfg, a.batch, a.seq_len, optimizer=not a.no_optimizer)
        print(f"{str(ckpt):>16} {m['saved'] / 2**30:>10.1f} {m['states'] / 2**30:>11.1f} {m['floor'] / 2**30:>10.1f} "
              f"{m['floor'] / 1e9:>9.1f} {m['count_s']:>8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
