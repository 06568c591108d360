"""Count the work of every launch of the Triton SSD, per kernel and phase, without a GPU: its global-memory traffic,
its programs (the grid), the serial steps of a program (the trips of its innermost loops, which a program runs one
after another, counted with a line tracer as the programs run), its dot FLOPs, and from them a modelled time on an
A100-80GB, H100 SXM and H200 (`bench/gpu_model.py`: the largest of the memory, math and latency terms).

The kernels of `mamba3_lite.ssd_triton` run under the Triton interpreter with every global load and store counted
at the one place all of them pass through (`triton.runtime.interpreter.interpreter_builder`: `create_masked_load` /
`create_masked_store`, which the plain, block-pointer and descriptor loads and stores all call; atomics count as a
read and a write). A row's bytes are the bytes the programs touch: active lanes x element size, masked-off lanes
excluded. Re-reads count each time (e.g. a B/C row shared by the heads of a group is read once per head), so this
is an upper bound on DRAM traffic; `unique` is the size of the set of distinct addresses (the compulsory traffic).
The PyTorch ops the wrapper runs around the kernels (casts, copies, reductions, the scan scalars and their
autograd) are counted from their tensors' sizes: inputs read, outputs written (views and `empty` move nothing).

The operands travel in the dtype a GPU launch uses (bf16 dots: the interpreter's own fp32 upcast is turned off
here; only bytes are counted, the values are not checked). Every count is a sum of terms that are products of
subsets of (b, T, H) (T a multiple of the chunk), so counting the 8 corners of a box of two sizes of each fixes
it; a 9th count at other sizes checks the fit exactly; the 434M shape is then read off the fit.

`--official` counts the official Mamba-3 SISO kernels (https://github.com/state-spaces/mamba,
`mamba_ssm/ops/triton/mamba3/`, through `mamba3_siso_combined`, as the official `Mamba3` module calls it; the SISO
kernels of mamba_ssm 2.3.2.post1 are those of commit e9594ce but for an autotune prune on Blackwell) the same way,
at the same shape: shared B/C (one group) with per-head biases, D, no gate (our op leaves the gate to the block too),
angle rates per head in fp32 as that module hands them over, ΔA and Δ computed outside the op (ours computes ΔA, γ, σ
in its `scalars` kernels, which are counted). It needs `mamba_ssm` (the package, e.g. an unpacked sdist on
PYTHONPATH: `bench/official_source.py` fetches one) and einops. Five things the interpreter cannot run are replaced, none of
which moves a byte: the four inline-PTX approximations of `utils.py` (cos, sin, tanh and sech² from tanh) by
`tl.cos`, `tl.sin` and tanh from `tl.sigmoid`; the host asserts that the tensors are on CUDA; every autotuned kernel
held to its first config (the interpreter cannot benchmark); TMA scratch from a CPU allocator; and the interpreter's
missing bf16 scalar constant. On Triton 3.6 (the version torch 2.11 pins) one more: its interpreter turns a loop bound
such as `range(nchunks)` into an int with `int()` of a 1-element array, which numpy refuses; the bound is squeezed
first, as Triton 3.7's interpreter does. The values its kernels compute there are not checked (bf16 dots), only their
traffic.

    python bench/ssd_traffic.py                       # b16 T2048 H32 P64 N128, bf16, shared B/C + biases, sm_90 launches
    python bench/ssd_traffic.py --arch 80 --json /tmp/traffic.json
    python bench/ssd_traffic.py --sites               # and each kernel's bytes per load/store line of ssd_triton.py
    PYTHONPATH=$(python bench/official_source.py /tmp/official) python bench/ssd_traffic.py --official
    python bench/ssd_traffic.py --compare OURS.json OFFICIAL.json --json /tmp/model.json   # the two side by side
"""
import argparse
import ast
import contextlib
import importlib
import importlib.util
import itertools
import json
import os
import re
import sys
import types
from collections import defaultdict

os.environ["TRITON_INTERPRET"] = "1"          # before any kernel module is imported

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
import triton.runtime.interpreter as interp  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import mamba3_lite.ssd_triton as st  # noqa: E402
from gpu_model import GPUS, STEP_S, STEP_WHY, bound, modelled_us  # noqa: E402
from official import official_attr  # noqa: E402

NO_DATA = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "alias", "lift_fresh",
           "_local_scalar_dense", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size"}


class Traffic:
    """Bytes read and written per (name, phase): `launch(name)` attributes the interpreter's global accesses to a
    kernel; outside launches, `torch_ops()` attributes every aten op to "torch:<op>"; `phase` is set by the caller."""

    def __init__(self):
        self.rows = defaultdict(lambda: dict(read=0, write=0, launches=0))   # a kernel's also: programs, steps, FLOPs
        self.steps = None                # loop-body steps of the program running now (None: no program)
        self.loop_lines = {}             # {source file: lines that begin the body of an innermost loop}
        self.addrs = defaultdict(lambda: dict(read=[], write=[]))
        self.current, self.phase = None, "fwd"
        self.sites = defaultdict(lambda: dict(read=0, write=0))     # (name, phase, "kernel:line>helper:line"), with `by_site`
        self.by_site = False

    def _program_done(self):
        "Fold the steps of the program that just ran into its launch's row: the most any program took."
        if self.steps is not None and self.current is not None:
            r = self.rows[(self.current, self.phase)]
            r["serial_steps"] = max(r.get("serial_steps", 0), self.steps, 1)   # a program without loops: one step
        self.steps = None

    def _dot(self, a, b):
        "A tl.dot of (…, M, K) by (…, K, N): 2·M·K·N FLOPs per batch element, on the tensor cores unless fp32 operands."
        if self.current is None: return
        a_shape, n = np.shape(a.data), np.shape(b.data)[-1]
        flops = 2 * int(np.prod(a_shape)) * int(n)
        key = "fp32_flops" if np.dtype(interp._get_np_dtype(a.dtype)) == np.float32 else "flops"
        r = self.rows[(self.current, self.phase)]
        r[key] = r.get(key, 0) + flops

    def _trace(self, frame, event, arg):
        "sys.settrace hook: count the loop-body lines of kernel source files while a program runs."
        spans = self.loop_lines.get(frame.f_code.co_filename)
        if spans is None or self.steps is None: return None
        prev = [None]

        def local(frame, event, arg):                # a body's first statement, entered from outside it
            if event == "line":
                end = spans.get(frame.f_lineno)
                if end is not None and self.steps is not None and not (prev[0] is not None and
                                                                       frame.f_lineno <= prev[0] <= end):
                    self.steps += 1
                prev[0] = frame.f_lineno
            return local
        return local

    def watch_loops(self, *files):
        """Count, per program, the iterations of every innermost loop (a `for`/`while` with no loop inside it) in the
        kernels of these source files: a program's serial steps are the loop trips it runs one after another (one for
        a program without a loop)."""
        for f in files:
            tree = ast.parse(open(f).read())
            loops = [n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.While))]
            inner = [n for n in loops if not any(isinstance(m, (ast.For, ast.While)) for b in n.body for m in ast.walk(b))]
            self.loop_lines[f] = {n.body[0].lineno: n.body[0].end_lineno for n in inner}   # first line: its last
        return self

    def _count(self, kind, ptrs, mask, dtype_tt):
        if self.current is None: return
        size = np.dtype(interp._get_np_dtype(dtype_tt)).itemsize
        on = np.broadcast_to(np.asarray(mask), np.shape(ptrs)).astype(bool)
        self.rows[(self.current, self.phase)][kind] += int(np.count_nonzero(on)) * size
        if self.by_site: self.sites[(self.current, self.phase, _site())][kind] += int(np.count_nonzero(on)) * size
        a = np.asarray(ptrs)[on].astype(np.uint64)
        self.addrs[(self.current, self.phase)][kind].append((a[:, None] + np.arange(size, dtype=np.uint64)).ravel())

    @contextlib.contextmanager
    def installed(self):
        "Wrap the interpreter's global loads, stores and atomics for the duration of the block."
        b = interp.interpreter_builder
        names = ("create_masked_load", "create_masked_store", "create_atomic_rmw", "create_atomic_cas", "create_dot",
                 "set_grid_dim", "set_grid_idx")
        orig = {n: getattr(b, n) for n in names}

        def load(ptrs, mask, *a, **k):
            self._count("read", ptrs.data, mask.data, ptrs.get_element_ty())
            return orig["create_masked_load"](ptrs, mask, *a, **k)

        def store(ptrs, value, mask, *a, **k):
            self._count("write", ptrs.data, mask.data, ptrs.get_element_ty())
            return orig["create_masked_store"](ptrs, value, mask, *a, **k)

        def rmw(op, ptr, val, mask, *a, **k):
            for kind in ("read", "write"): self._count(kind, ptr.data, mask.data, ptr.get_element_ty())
            return orig["create_atomic_rmw"](op, ptr, val, mask, *a, **k)

        def cas(ptr, cmp, val, *a, **k):
            for kind in ("read", "write"): self._count(kind, ptr.data, True, ptr.get_element_ty())
            return orig["create_atomic_cas"](ptr, cmp, val, *a, **k)

        def dot(a, b_, *args, **k):
            self._dot(a, b_)
            return orig["create_dot"](a, b_, *args, **k)

        def grid_dim(nx, ny, nz):                    # a launch starts: its programs
            if self.current is not None:
                r = self.rows[(self.current, self.phase)]
                r.update(programs=r.get("programs", 0) + nx * ny * nz, flops=r.get("flops", 0),
                         fp32_flops=r.get("fp32_flops", 0))
            return orig["set_grid_dim"](nx, ny, nz)

        def grid_idx(x, y, z):                       # a program starts
            self._program_done()
            self.steps = 0 if self.current is not None else None
            return orig["set_grid_idx"](x, y, z)

        for n, f in zip(names, (load, store, rmw, cas, dot, grid_dim, grid_idx)): setattr(b, n, f)
        tracer = sys.gettrace()
        sys.settrace(self._trace)
        try:
            yield self
        finally:
            sys.settrace(tracer)
            self._program_done()
            for n in names: delattr(b, n)            # back to the class's methods

    @contextlib.contextmanager
    def launch(self, name):
        "Attribute the global accesses inside the block to kernel `name` (one launch)."
        prev, self.current = self.current, name
        self.rows[(name, self.phase)]["launches"] += 1
        try:
            yield
        finally:
            self._program_done()
            self.current = prev

    @contextlib.contextmanager
    def by_kernel(self):
        "Count inside the block, each interpreter launch attributed to its kernel's name, torch ops outside any."
        real = interp.GridExecutor.__call__

        def call(executor, *a, **k):
            with self.launch(executor.fn.__name__):
                return real(executor, *a, **k)

        interp.GridExecutor.__call__ = call
        try:
            with self.installed(), self.torch_ops():
                yield self
        finally:
            interp.GridExecutor.__call__ = real

    def torch_ops(self):
        "A dispatch mode that counts every aten op outside a launch as 'torch:<op>': inputs read, outputs written."
        outer = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = func.overloadpacket.__name__
                if func.namespace == "mamba3_lite":          # a triton_op: count what its body runs, inside
                    with outer.torch_ops():
                        return OPS[name]._init_fn(*args, **(kwargs or {}))
                out = func(*args, **(kwargs or {}))
                if outer.current is None and name not in NO_DATA and not func.is_view:
                    ins = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
                    outs = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
                    mut = name.endswith("_") or name in ("copy_", "fill_", "zero_")
                    read = sum(t.numel() * t.element_size() for t in ins[(1 if mut else 0):] if name not in
                               ("zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "fill_", "zero_"))
                    write = sum(t.numel() * t.element_size() for t in (ins[:1] if mut else outs))
                    r = outer.rows[(f"torch:{name}", outer.phase)]
                    r["read"] += read; r["write"] += write; r["launches"] += 1
                return out
        return Mode()

    def unique(self, key, kind):
        "Distinct bytes read or written by `key`'s launches."
        parts = self.addrs[key][kind]
        return int(np.unique(np.concatenate(parts)).size) if parts else 0

    def table(self, unique=False):
        """{(name, phase): dict(read, write[, read_unique, write_unique], launches)}, the distinct bytes for kernels
        with `unique`, then the per-site rows {(name, phase, site): dict(read, write)} where `by_site` collected them."""
        out = {}
        for key, r in self.rows.items():
            out[key] = dict(r)
            if unique and not key[0].startswith("torch:"):
                out[key].update(read_unique=self.unique(key, "read"), write_unique=self.unique(key, "write"))
        out.update({key: dict(r) for key, r in self.sites.items()})
        return out


def _site():
    """The lines of `mamba3_lite.ssd_triton` on the stack, kernel first, as 'function:line>helper:line...': the load or
    store being counted and the calls that reach it."""
    f, chain = sys._getframe(2), []
    while f is not None:
        if f.f_code.co_filename == st.__file__: chain.append(f"{f.f_code.co_name}:{f.f_lineno}")
        if f.f_code.co_name in KERNEL_NAMES: break                  # the launch's host frames are left out
        f = f.f_back
    return ">".join(reversed(chain)) or "?"


OPS = {"ssd_fwd": st._ssd_fwd, "ssd_bwd": st._ssd_bwd}
KERNEL_NAMES = {"_ssd_scalars_kernel": "scalars", "_ssd_carry_kernel": "carry", "_ssd_bwd_scalars_kernel": "bwd_scalars",
                "_ssd_bwd_carry_kernel": "bwd_carry", "_ssd_rotate_kernel": "rotate", "_ssd_fwd_kernel": "fwd",
                "_ssd_fwd_state_kernel": "fwd.state", "_ssd_fwd_chunk_kernel": "fwd.chunk",
                "_ssd_bwd_state_kernel": "bwd_state", "_ssd_bwd_chunk_kernel": "bwd_chunk",
                "_ssd_bwd_angle_kernel": "bwd_angle"}


def layer_inputs(b, T, H, P, N, S, dtype, seed=0):
    """A 434M-style SSD call: x (a strided view, as the block's split of its in-projection hands it over), shared B/C
    (one group) in `dtype`, per-head fp32 biases, shared angles θ (b, T, S)."""
    g = torch.Generator().manual_seed(seed)
    rn = lambda *s: torch.randn(*s, generator=g)
    x = rn(b, T, (H + 1) * P).to(dtype)[..., :H * P].view(b, T, H, P)     # a view of the block's in-projection
    return dict(x=x, dt=torch.rand(b, T, H, generator=g) * 0.1 + 1e-3,
                A=-1 - 15 * torch.rand(b, T, H, generator=g), B=rn(b, T, 1, N).to(dtype), C=rn(b, T, 1, N).to(dtype),
                lam=torch.rand(b, T, H, generator=g), theta=rn(b, T, S), D=rn(H), B_bias=rn(H, N), C_bias=rn(H, N))


def count(b, T, H, P=64, N=128, S=32, L=64, dtype=torch.bfloat16, arch=90, unique=False, sites=False):
    """{(name, phase): dict(read, write[, read_unique, write_unique], launches)} of one forward and one backward of
    `ssd_triton` at this shape, with the launches `arch` makes; `sites`: also {(name, phase, "function:line"):
    dict(read, write)}, the kernels' bytes per load or store in the source (and the calls that reach it)."""
    tr = Traffic().watch_loops(st.__file__)
    tr.by_site = sites
    kw = {k: v.requires_grad_(True) for k, v in layer_inputs(b, T, H, P, N, S, dtype).items()}
    dy = torch.randn(b, T, H, P).to(dtype)
    real_launch, real_cfg, real_dot = st._launch, st._launch_config, st._dot_dtype

    def launch(kernel, kind, *a, **meta):
        with tr.launch(KERNEL_NAMES[kernel.fn.__name__]):
            real_launch(kernel, kind, *a, **meta)

    st._launch = launch
    st._launch_config = lambda kind, N=128, dtype=torch.bfloat16: st.default_config(kind, arch, N, dtype)
    st._dot_dtype = lambda d: st._TL_DTYPES[d]                 # bf16 operands, as on a GPU
    try:
        with tr.installed(), tr.torch_ops():
            y, _ = st.ssd_triton(**kw, chunk_size=L)
            tr.phase = "bwd"
            y.backward(dy)
    finally:
        st._launch, st._launch_config, st._dot_dtype = real_launch, real_cfg, real_dot
    return tr.table(unique)


@triton.jit
def _cos(x):
    return tl.cos(x)


@triton.jit
def _sin(x):
    return tl.sin(x)


@triton.jit
def _tanh(x):
    return 2 * tl.sigmoid(2 * x) - 1


@triton.jit
def _sech2(x):
    t = _tanh(x)
    return 1.0 - t * t


def _bf16_constant(builder, value):
    "A bf16 scalar constant (`tl.full(..., dtype=tl.bfloat16)`), which Triton's interpreter builder lacks."
    data = interp._convert_float(np.array([value], np.float32), tl.float32, tl.bfloat16, None).view(np.uint16)
    return interp.TensorHandle(data, tl.bfloat16)


def _squeezed_index(patch):
    """The interpreter's patch of `tl.tensor` (`patch`), then `__index__` that squeezes a 1-element array before
    `int()`, as Triton 3.7's interpreter does: Triton 3.6's takes `int()` of the array, which numpy refuses."""
    def patched(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))
    patched.squeezes_index = True
    return patched


def official_siso():
    """(`mamba3_siso_combined`, the mamba_ssm version) of the official kernels, made runnable under the interpreter
    (the module docstring lists what is replaced). Raises ModuleNotFoundError when mamba_ssm is not on sys.path.
    Kernel modules that were imported without the stand-ins (their `from .utils import ...` names bound to the PTX
    versions) are imported again, so the result does not depend on what imported them first."""
    base = "ops.triton.mamba3"
    prefix = f"mamba_ssm.{base}"
    name = f"{prefix}.mamba3_siso_bwd"
    if not getattr(sys.modules.get(name), "_interpreter_stand_ins", False):
        for k in [k for k in sys.modules if k.startswith(prefix + ".")]: del sys.modules[k]
        official_attr(base + ".utils", "cos_approx")     # the package entered without its CUDA __init__
        utils = sys.modules[f"{prefix}.utils"]
        utils.cos_approx, utils.sin_approx, utils.tanh_approx, utils.sech2_approx = _cos, _sin, _tanh, _sech2
        spec = importlib.util.find_spec(name)             # its host functions assert CUDA tensors: those lines dropped
        src = re.sub(r"^(\s*)assert .*\.is_cuda\b.*$", r"\1pass", open(spec.origin).read(), flags=re.M)
        mod = types.ModuleType(name)
        mod.__file__, mod.__spec__ = spec.origin, spec
        sys.modules[name] = mod
        exec(compile(src, spec.origin, "exec"), mod.__dict__)
        mod._interpreter_stand_ins = True
    utils = sys.modules[f"{prefix}.utils"]
    combined = official_attr(base + ".mamba3_siso_combined", "mamba3_siso_combined")
    for m in ("mamba3_siso_fwd", "mamba3_siso_bwd", "angle_dt"):
        for k in vars(sys.modules[f"mamba_ssm.{base}.{m}"]).values():
            if isinstance(k, triton.runtime.autotuner.Autotuner): k.configs = k.configs[:1]
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8))
    if not hasattr(interp.InterpreterBuilder, "get_bf16"): interp.InterpreterBuilder.get_bf16 = _bf16_constant
    patch = getattr(interp, "_patch_lang_tensor", None)   # the official chunk loops' `range(nchunks)` on Triton 3.6
    if patch is not None and not getattr(patch, "squeezes_index", False):
        interp._patch_lang_tensor = _squeezed_index(patch)
    init = os.path.join(os.path.dirname(utils.__file__), "..", "..", "..", "__init__.py")
    version = re.search(r'__version__ = "([^"]+)"', open(init).read())
    return combined, version[1] if version else "unknown"


def official_inputs(b, T, H, P, N, S, seed=0):
    """`mamba3_siso_combined`'s arguments as the official Mamba3 module hands them over for the call `layer_inputs`
    describes: V a strided view of the in-projection, Q = C and K = B one group (b, T, 1, N) bf16, ΔA, Δ and the
    trapezoid mix λ as (b, H, T) views of (b, T, H) tensors, the angle rates expanded to the heads and cast to fp32
    (b, T, H, S), per-head biases and D in fp32."""
    g = torch.Generator().manual_seed(seed)
    rn = lambda *s: torch.randn(*s, generator=g)
    heads = lambda t: t.transpose(1, 2)                                  # (b, T, H) -> (b, H, T), a view
    dt = torch.rand(b, T, H, generator=g) * 0.1 + 1e-3
    return dict(V=rn(b, T, (H + 1) * P).bfloat16()[..., :H * P].view(b, T, H, P), Q=rn(b, T, 1, N).bfloat16(),
                K=rn(b, T, 1, N).bfloat16(), ADT=heads(-dt * (1 + 15 * torch.rand(b, T, H, generator=g))),
                DT=heads(dt), Trap=heads(torch.rand(b, T, H, generator=g).bfloat16()),
                Q_bias=rn(H, N), K_bias=rn(H, N), Angles=rn(b, T, S).unsqueeze(-2).expand(b, T, H, S).contiguous(),
                D=rn(H))


def count_official(b, T, H, P=64, N=128, S=32, L=64, seed=0, unique=False):
    "`count` of the official `mamba3_siso_combined`: one forward and one backward, each kernel launch by its name."
    combined, _ = official_siso()
    kernel_files = {sys.modules[f"mamba_ssm.ops.triton.mamba3.{m}"].__file__ for m in ("mamba3_siso_fwd", "mamba3_siso_bwd", "angle_dt")}
    tr = Traffic().watch_loops(*sorted(kernel_files))
    kw = {k: v.requires_grad_(True) for k, v in official_inputs(b, T, H, P, N, S, seed).items()}
    dy = torch.randn(b, T, H, P, generator=torch.Generator().manual_seed(seed + 1)).bfloat16()
    with tr.by_kernel():
        y = combined(**kw, chunk_size=L)
        tr.phase = "bwd"
        y.backward(dy)
    return tr.table(unique)


def multilinear_fit(counts, sizes):
    """Coefficients c_S of Σ_S c_S Π_{d in S} d over the subsets S of (b, T, H), exact from the counts at the 8
    corners `sizes` = ((b0, b1), (T0, T1), (H0, H1)) (a dict keyed by the (b, T, H) tuples)."""
    corners = list(itertools.product(*sizes))
    subsets = list(itertools.product((0, 1), repeat=3))
    A = np.array([[np.prod([c[i] if s[i] else 1 for i in range(3)]) for s in subsets] for c in corners], dtype=np.float64)
    y = np.array([counts[c] for c in corners], dtype=np.float64)
    return subsets, np.linalg.solve(A, y)


def evaluate(fit, shape):
    "The fitted count at (b, T, H)."
    subsets, coef = fit
    return float(sum(c * np.prod([shape[i] if s[i] else 1 for i in range(3)]) for s, c in zip(subsets, coef)))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", type=int, nargs=3, default=[16, 2048, 32], metavar=("B", "T", "H"),
                   help="the shape to extrapolate to (default: the 434M layer)")
    p.add_argument("--P", type=int, default=64)
    p.add_argument("--N", type=int, default=128)
    p.add_argument("--S", type=int, default=32)
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--arch", type=int, default=90, choices=[80, 90], help="whose launch configs (splits) to count")
    p.add_argument("--json", default=None, metavar="PATH", help="write the rows at --shape as JSON")
    p.add_argument("--sites", action="store_true",
                   help="also break each kernel's bytes down by load/store site (function:line of ssd_triton.py)")
    p.add_argument("--official", action="store_true",
                   help="count the official mamba3_siso kernels instead (bf16; needs mamba_ssm and einops importable)")
    p.add_argument("--compare", nargs=2, default=None, metavar=("OURS", "OFFICIAL"),
                   help="count nothing: set two counts' JSON side by side (modelled µs per layer on each GPU, bytes, "
                        "programs and steps) and print their ratios; --json writes them")
    a = p.parse_args(argv)
    if a.compare: return compare(*a.compare, out=a.json)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[a.dtype]
    L = a.chunk
    # the corners of the fit: heads 2 and 4, as a lone head is a case of its own on both sides (the official op copies
    # its (b, H, T) views of ΔA, Δ and λ only where H > 1, at H = 1 they are contiguous; a lone head of ours takes all
    # its pairs in one block of the rotation)
    sizes = ((1, 2), (2 * L, 4 * L), (2, 4))
    check = (3, 3 * L, 3)
    if a.official:
        if a.dtype != "bf16" or a.sites:
            p.error("--official: the official op runs bf16 only and has no --sites breakdown")
        try:
            _, version = official_siso()
        except ModuleNotFoundError as e:
            print(f"ssd_traffic: --official needs {e.name or 'mamba_ssm'} importable ({e}); put the folder "
                  "`python bench/official_source.py DEST` prints on PYTHONPATH (and pip install einops)", file=sys.stderr)
            return 2
        what = f"the official mamba3_siso_combined (mamba_ssm {version})"
        run = lambda c: count_official(*c, P=a.P, N=a.N, S=a.S, L=L, unique=True)
    else:
        what = f"mamba3_lite's ssd_triton, sm_{a.arch} launches"
        run = lambda c: count(*c, P=a.P, N=a.N, S=a.S, L=L, dtype=dtype, arch=a.arch, unique=True, sites=a.sites)
    counted = {c: run(c) for c in itertools.product(*sizes)}
    counted[check] = run(check)
    keys = sorted({k for c in counted.values() for k in c}, key=lambda k: (k[1] != "fwd", k[0].startswith("torch:"), k))
    site_keys = [k for k in keys if len(k) == 3]
    keys = [k for k in keys if len(k) == 2]
    rows, worst, off = [], 0., []
    for key in keys:
        row = dict(kernel=key[0], phase=key[1])
        kernel = not key[0].startswith("torch:")
        fields = ("read", "write") + (("read_unique", "write_unique", "programs", "serial_steps", "flops", "fp32_flops")
                                      if kernel else ())
        for field in fields:
            fit = multilinear_fit({c: v.get(key, {}).get(field, 0) for c, v in counted.items()}, sizes)
            got, want = evaluate(fit, check), counted[check].get(key, {}).get(field, 0)
            if abs(got - want) > 0.5: off.append(f"{key[0]} {key[1]} {field}: fit {got:.1f}, counted {want}")
            worst = max(worst, abs(got - want))
            name = field if field in ("programs", "serial_steps", "flops", "fp32_flops") else f"{field}_bytes"
            row[name] = round(evaluate(fit, a.shape))
        row["launches"] = counted[check].get(key, {}).get("launches", 0)
        row["modelled_us"] = {g: modelled(row, g) for g in GPUS}
        if kernel: row["programs_per_sm"] = {g: round(row["programs"] / max(row["launches"], 1) / GPUS[g]["sms"], 2)
                                             for g in GPUS}
        rows.append(row)
    site_rows = []
    for key in site_keys:
        row = dict(kernel=key[0], phase=key[1], site=key[2])
        for field in ("read", "write"):
            fit = multilinear_fit({c: v.get(key, {}).get(field, 0) for c, v in counted.items()}, sizes)
            worst = max(worst, abs(evaluate(fit, check) - counted[check].get(key, {}).get(field, 0)))
            row[f"{field}_bytes"] = round(evaluate(fit, a.shape))
        site_rows.append(row)
    if worst > 0.5:
        print(f"ssd_traffic: the counts are not multilinear in (b, T, H): off by {worst:.0f} at {check} "
              f"({'; '.join(off[:4]) or 'a site'})", file=sys.stderr)
        return 1
    totals = {ph: [r for r in rows if r["phase"] == ph or ph == "fwd+bwd"] for ph in ("fwd", "fwd+bwd")}
    b, T, H = a.shape
    print(f"counted at {len(counted)} shapes (b, T, H) in {sizes}; the fit reproduces the count at {check} exactly")
    print(f"{what}, per layer at b{b} T{T} H{H} P{a.P} N{a.N} S{a.S}, chunk {L}, {a.dtype}, shared B/C + biases; "
          "GB = 1e9 bytes")
    print(f"modelled time per launch = max(bytes / bandwidth, dot FLOPs / peak, waves x serial steps x {STEP_S * 1e6:g} us); "
          f"{STEP_WHY} (bench/gpu_model.py)")
    gpus = list(GPUS)
    print(f"{'kernel':22} {'phase':5} {'n':>2} {'programs':>9} {'/SM':>6} {'steps':>6} {'read GB':>8} {'write GB':>8} "
          f"{'GFLOP':>7} " + " ".join(f"{g + ' us':>14}" for g in gpus) + "  H100 bound")
    for r in rows:
        tot = r["read_bytes"] + r["write_bytes"]
        if not tot and not r.get("programs"): continue
        work = (f"{r['programs']:9d} {r['programs_per_sm']['H100-SXM']:6.1f} {r['serial_steps']:6d}" if "programs" in r
                else f"{'':9} {'':6} {'':6}")
        flops = (r.get("flops", 0) + r.get("fp32_flops", 0)) / 1e9
        print(f"{r['kernel'][:22]:22} {r['phase']:5} {r['launches']:2d} {work} {r['read_bytes'] / 1e9:8.3f} "
              f"{r['write_bytes'] / 1e9:8.3f} {flops:7.1f} " + " ".join(f"{r['modelled_us'][g]:14.1f}" for g in gpus)
              + f"  {bound_of(r, 'H100-SXM')}")
    out_totals = []
    for ph, rs in totals.items():
        tot = sum(r["read_bytes"] + r["write_bytes"] for r in rs)
        us = {g: round(sum(r["modelled_us"][g] for r in rs), 1) for g in gpus}
        out_totals.append(dict(kernel="total", phase=ph, bytes=tot, modelled_us=us,
                               programs=sum(r.get("programs", 0) for r in rs)))
        print(f"{'total':22} {ph:7} {'':9} {'':6} {'':6} {tot / 1e9:17.3f} {'':7} "
              + " ".join(f"{us[g]:14.1f}" for g in gpus))
    if site_rows:
        print(f"\nby site (function:line in {os.path.basename(st.__file__)}):")
        print(f"{'kernel':12} {'phase':5} {'read GB':>8} {'write GB':>8}  site")
        for r in site_rows:
            print(f"{r['kernel']:12} {r['phase']:5} {r['read_bytes'] / 1e9:8.3f} {r['write_bytes'] / 1e9:8.3f}  {r['site']}")
    rows += out_totals
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(implementation=what, shape=dict(b=b, T=T, H=H, P=a.P, N=a.N, S=a.S, chunk=L), dtype=a.dtype,
                           arch=None if a.official else a.arch, model=dict(step_us=STEP_S * 1e6, step_why=STEP_WHY, gpus=GPUS),
                           rows=rows, **(dict(sites=site_rows) if site_rows else {})), f, indent=1)
    return 0


def compare(ours_path, official_path, out=None):
    """Two counts at the same shape (`--json` of a run and of an `--official` run), side by side: per GPU the modelled
    µs of a layer, forward and forward + backward, and ours over the official's; bytes; the fewest programs and most
    serial steps of a launch. Returns 0, or 2 when the shapes differ."""
    ours, theirs = (json.load(open(p)) for p in (ours_path, official_path))
    if ours["shape"] != theirs["shape"]:
        print(f"ssd_traffic: --compare: the shapes differ: {ours['shape']} and {theirs['shape']}", file=sys.stderr)
        return 2
    total = lambda r, ph: next(x for x in r["rows"] if x["kernel"] == "total" and x["phase"] == ph)
    launches = lambda r: [x for x in r["rows"] if "programs" in x and x["kernel"] != "total"]
    side = {}
    for name, r in (("ours", ours), ("official", theirs)):
        side[name] = dict(file=os.path.basename(ours_path if name == "ours" else official_path),
                          modelled_us={ph: total(r, ph)["modelled_us"] for ph in ("fwd", "fwd+bwd")},
                          bytes={ph: total(r, ph)["bytes"] for ph in ("fwd", "fwd+bwd")},
                          fewest_programs=min(x["programs"] for x in launches(r)),
                          most_serial_steps=max(x["serial_steps"] for x in launches(r)))
    ratio = {ph: {g: round(side["ours"]["modelled_us"][ph][g] / side["official"]["modelled_us"][ph][g], 4) for g in GPUS}
             for ph in ("fwd", "fwd+bwd")}
    print(f"per layer at {ours['shape']}: modelled µs, ours / official")
    for ph in ("fwd", "fwd+bwd"):
        for g in GPUS:
            print(f"  {ph:7} {g:10} {side['ours']['modelled_us'][ph][g]:9.1f} {side['official']['modelled_us'][ph][g]:9.1f}"
                  f"  {ratio[ph][g]:.3f}x")
    for name in side:
        print(f"  {name}: fewest programs {side[name]['fewest_programs']}, most serial steps {side[name]['most_serial_steps']},"
              f" {side[name]['bytes']['fwd+bwd'] / 1e9:.3f} GB forward + backward")
    if out:
        with open(out, "w") as f:
            json.dump(dict(shape=ours["shape"], model=ours.get("model"), ours=side["ours"], official=side["official"],
                           ratio=ratio), f, indent=1)
    return 0


def _per_launch(r):
    "A row's work per launch (its launches are alike): bytes, dot FLOPs, fp32 FLOPs, programs, serial steps."
    n = max(r.get("launches", 1), 1)
    return dict(bytes=(r["read_bytes"] + r["write_bytes"]) / n, dot_flops=r.get("flops", 0) / n,
                flops=r.get("fp32_flops", 0) / n, programs=r.get("programs", 0) / n, serial_steps=r.get("serial_steps", 0))


def modelled(r, gpu):
    "Modelled µs of a row on `gpu`: its launches one after another (bench/gpu_model.py)."
    return round(max(r.get("launches", 1), 1) * modelled_us(gpu, **_per_launch(r)), 2)


def bound_of(r, gpu):
    "The term that bounds a row's modelled time on `gpu`: memory, math or latency."
    return bound(gpu, **_per_launch(r))


if __name__ == "__main__":
    sys.exit(main())
