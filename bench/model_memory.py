"""What training the Mamba-3 LM holds in GPU memory, counted without a GPU: whether a configuration fits a card.

One forward of the model on fake tensors (`FakeTensorMode`: shapes and dtypes, no storage), under bf16 autocast, with
the training loss (`lm_loss`: the chunked loss, no logits kept) and the Triton SSD's launches stubbed out (its output
and saved tensors are allocated as on a GPU, nothing is computed), counts every tensor autograd saves for the backward
(`saved_tensors_hooks`), each storage once, parameters left out, attributed to the layer that saved it:

    saved, no checkpointing   = every saved tensor
    saved, checkpointing      = each layer's input (what a checkpoint keeps) + what lies outside the layers
                                + the largest layer's own saved tensors (its recompute in the backward)
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
    """Bytes autograd saves in one training forward of `cfg` (grad_checkpoint off) at batch x seq_len:
    dict(layers=[bytes saved inside each layer], inputs=[bytes of each layer's input], outside=bytes, params=count)."""
    import dataclasses
    from torch._subclasses.fake_tensor import FakeTensorMode
    from mamba3_lite.data import Batch
    from mamba3_lite.evaluate import lm_loss
    from mamba3_lite.model import Mamba3Transformer

    cfg = dataclasses.replace(cfg, grad_checkpoint=False)
    triton = cfg.ssd_dispatch == "triton"
    with (stubbed_triton_ssd() if triton else contextlib.nullcontext()), own_constants(), FakeTensorMode():
        model = Mamba3Transformer(cfg).train()
        params = {p.untyped_storage()._cdata for p in model.parameters()}
        owner, seen, inputs = [None], {}, []
        for i, layer in enumerate(model.layers):
            def enter(mod, args, i=i):
                owner[0] = i
                inputs.append(args[0].untyped_storage().nbytes())
            layer.register_forward_pre_hook(enter)
            layer.register_forward_hook(lambda mod, args, out: owner.__setitem__(0, None))

        def pack(t):
            s = t.untyped_storage()
            if s._cdata not in params:
                seen.setdefault(s._cdata, (owner[0], s.nbytes()))
            return t

        ids = torch.randint(0, cfg.vocab_size, (batch, seq_len + 1))
        amp = torch.autocast("cpu", dtype=dtype) if dtype != torch.float32 else contextlib.nullcontext()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), amp:
            lm_loss(model, Batch(ids[:, :-1], ids[:, 1:]))
        n_params = model.num_parameters()
    layers = [sum(b for o, b in seen.values() if o == i) for i in range(cfg.n_layers)]
    return dict(layers=layers, inputs=inputs, outside=sum(b for o, b in seen.values() if o is None), params=n_params)


def training_memory(cfg, batch, seq_len, optimizer=True, dtype=torch.bfloat16):
    """The floor of a training step's GPU memory (module docstring) in bytes, by part: dict(saved, states, floor,
    grad_checkpoint, count_s)."""
    t0 = time.perf_counter()
    s = saved_bytes(cfg, batch, seq_len, dtype)
    if cfg.grad_checkpoint:
        saved = s["outside"] + sum(s["inputs"]) + max(s["layers"])
    else:
        saved = s["outside"] + sum(s["layers"])
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
