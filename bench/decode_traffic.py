"""Count the fused decode step's global-memory bytes at the Mamba-3 paper's decode shape, set them against the bytes a
step cannot avoid, and model its time on A100, H100 and H200.

The shape is the paper's decode benchmark (Table 6: one H100, batch 128, d_model 2048, so 64 heads of P = 64, bf16,
d_state 128 and 64; measured there: Mamba-3 SISO 0.156 ms a layer step at N = 128, 0.110 ms at N = 64). One launch
of `decode_step` runs under the Triton interpreter with every global load and store counted (`Traffic` of
bench/ssd_traffic.py: active lanes x element size, re-reads counted each time). in_proj's output rows are bf16; the
cache's h, k, v are fp32 or bf16 (`state_dtype`), its angle fp32. The count is bilinear in (b, H) when b is a multiple
of the rows a program walks, so it is counted at the corners of a small box with the launch's rows a program fixed to
those of the full shape, checked exactly at a third point, and read off at b = 128, H = 64. The floor is
`floor_bytes`: the state read and written once, in_proj's rows and the parameters read once, the output written
once. The modelled time is bench/gpu_model.py's: counted bytes, the launch's programs, the rows a program walks one
after another as its serial steps, and (1 + 6R)·N·P FLOPs per row and head (the state's update and read-out).

`--official` also counts the official `mamba3_siso_step` (https://github.com/state-spaces/mamba,
`mamba_ssm/ops/triton/mamba3/mamba3_siso_step.py`, from the mamba-ssm 2.3.2.post1 source: `PYTHONPATH=$(python
bench/official_source.py DEST)`) at the same shape, with bench/ssd_traffic.py's interpreter stand-ins, on bench/decode_gpu.py's `official_step_inputs`
(its state fp32 in and fp32 out: it writes the state to new tensors).

    python bench/decode_traffic.py                     # N 128 and 64, fp32 and bf16 caches
    PYTHONPATH=$(python bench/official_source.py /tmp/official) python bench/decode_traffic.py --official --json PATH
"""
import argparse
import itertools
import json
import math
import sys

import ssd_traffic   # noqa: F401  (sets TRITON_INTERPRET=1 before any kernel module is imported)
from ssd_traffic import Traffic, evaluate, multilinear_fit, official_siso
from gpu_model import GPUS, bound, modelled_us
from official import official_attr
from decode_gpu import official_step_inputs

import torch  # noqa: E402
import triton  # noqa: E402

from mamba3_lite.block import Mamba3Block, step_constants  # noqa: E402
from mamba3_lite.decode import decode_config, decode_step, floor_bytes  # noqa: E402

P, SHAPE = 64, (128, 64)                 # Table 6: 64 heads of 64, batch 128
TABLE6_MS = {128: 0.156, 64: 0.110}      # the paper's measured Mamba-3 SISO decode, ms a layer step on one H100


def counted(tr, run):
    "{kernel name: dict(read, write)} of `run()`, each interpreter launch attributed to its kernel, torch ops outside."
    with tr.by_kernel():
        run()
    return {name: dict(read=r["read"], write=r["write"]) for (name, _), r in tr.table().items()}


def block(H, N, state_dtype):
    "A bf16 block of H heads of P = 64 (d_model = 32 H), d_state N, S = N/4 angles, one group: Table 6's layer."
    torch.manual_seed(0)
    return Mamba3Block(H * P // 2, d_state=N, headdim=P, state_dtype=state_dtype).to(torch.bfloat16).eval()


def count_ours(b, H, N, state_dtype, config):
    "Bytes {kernel: dict(read, write)} of one `decode_step` of b rows, bf16 in_proj rows, launched with `config`."
    blk = block(H, N, state_dtype)
    with torch.no_grad():
        c = step_constants(blk, list(blk.parameters()), blk._make_step_constants)
        proj, state = torch.randn(b, blk.d_in_proj).bfloat16(), blk.allocate_state(b)
        return counted(Traffic(), lambda: decode_step(blk, proj, c, state, config=config))


def count_official(b, H, N):
    "Bytes {kernel: dict(read, write)} of one official `mamba3_siso_step` of b rows (module docstring)."
    official_siso()                                            # the interpreter stand-ins of the official utils
    step = official_attr("ops.triton.mamba3.mamba3_siso_step", "mamba3_siso_step")
    kernel = sys.modules["mamba_ssm.ops.triton.mamba3.mamba3_siso_step"].mamba3_siso_step_kernel
    kernel.configs = kernel.configs[:1]                        # the interpreter cannot benchmark
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8))
    kw = official_step_inputs(b, H, N)
    return counted(Traffic(), lambda: step(**kw))


def fit_total(count, corners_b, corners_H, check):
    """Total bytes (read + write, every launch and op) at SHAPE from `count(b, H)` at the corners, bilinear in (b, H)
    (ssd_traffic's multilinear fit, with its T axis held at 1), and the largest miss at `check` (must be 0)."""
    total = lambda c: sum(r["read"] + r["write"] for r in c.values())
    at = {(b, H): total(count(b, H)) for b in corners_b for H in corners_H}
    sizes = (corners_b, (1, 2), corners_H)
    fit = multilinear_fit({(b, T, H): at[(b, H)] for b, T, H in itertools.product(*sizes)}, sizes)
    miss = abs(evaluate(fit, (check[0], 1, check[1])) - total(count(*check)))
    return round(evaluate(fit, (SHAPE[0], 1, SHAPE[1]))), miss


def model(nbytes, R, N, programs, serial_steps):
    "{gpu: modelled µs} and the H100's bound of a launch moving nbytes with the step's FLOPs at SHAPE."
    b, H = SHAPE
    kw = dict(bytes=nbytes, flops=b * H * (1 + 6 * R) * N * P, programs=programs, serial_steps=serial_steps)
    return {g: modelled_us(g, **kw) for g in GPUS}, bound("H100-SXM", **kw)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--N", type=int, nargs="+", default=[128, 64], help="d_state values")
    p.add_argument("--state", nargs="+", default=["bf16", "fp32"], choices=["bf16", "fp32"], help="cache dtypes")
    p.add_argument("--official", action="store_true", help="also count the official mamba3_siso_step (needs mamba_ssm)")
    p.add_argument("--json", default=None, metavar="PATH", help="write the rows as JSON")
    a = p.parse_args(argv)
    b, H = SHAPE
    rows = []
    print(f"decode step at batch {b}, {H} heads of P = {P}, bf16 in_proj rows; MB = 1e6 bytes; modelled µs: bench/gpu_model.py")
    print(f"{'implementation':34} {'N':>4} {'cache':>5} {'counted MB':>10} {'floor MB':>9} {'ratio':>6} "
          f"{'A100 µs':>8} {'H100 µs':>8} {'H200 µs':>8} {'bound':>7} {'Table 6 µs':>10}")
    for N, state in itertools.product(a.N, a.state):
        cfg = decode_config(b, H, P, N)
        BB = cfg["BB"]
        nbytes, miss = fit_total(lambda b_, H_: count_ours(b_, H_, N, state, cfg), (BB, 2 * BB), (1, 2), (3 * BB, 3))
        with torch.device("meta"):
            floor = sum(floor_bytes(block(H, N, state), b).values())
        us, bnd = model(nbytes, 1, N, H * math.ceil(b / BB), BB)
        rows.append(dict(implementation="decode_step", N=N, cache=state, counted_bytes=nbytes, floor_bytes=floor,
                         ratio=nbytes / floor, fit_miss_bytes=miss, modelled_us=us, bound=bnd, rows_a_program=BB,
                         programs=H * math.ceil(b / BB), table6_us=1e3 * TABLE6_MS[N]))
    if a.official:
        try:
            official_siso()
        except ModuleNotFoundError as e:
            print(f"decode_traffic: --official needs mamba_ssm importable ({e}); put the folder "
                  "`python bench/official_source.py DEST` prints on PYTHONPATH", file=sys.stderr)
            return 2
        for N in a.N:
            nbytes, miss = fit_total(lambda b_, H_: count_official(b_, H_, N), (1, 2), (1, 2), (3, 3))
            us, bnd = model(nbytes, 1, N, b * H, 1)
            rows.append(dict(implementation="official mamba3_siso_step", N=N, cache="fp32", counted_bytes=nbytes,
                             floor_bytes=None, ratio=None, fit_miss_bytes=miss, modelled_us=us, bound=bnd,
                             rows_a_program=1, programs=b * H, table6_us=1e3 * TABLE6_MS[N]))
    worst = max(r["fit_miss_bytes"] for r in rows)
    for r in rows:
        floor = f"{r['floor_bytes'] / 1e6:9.1f} {r['ratio']:6.3f}" if r["floor_bytes"] else f"{'':9} {'':6}"
        print(f"{r['implementation']:34} {r['N']:4} {r['cache']:>5} {r['counted_bytes'] / 1e6:10.1f} {floor} "
              f"{r['modelled_us']['A100-80GB']:8.1f} {r['modelled_us']['H100-SXM']:8.1f} {r['modelled_us']['H200']:8.1f} "
              f"{r['bound']:>7} {r['table6_us']:10.0f}")
    print(f"fit: exact at the check point (largest miss {worst:.0f} B)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(shape=dict(b=b, H=H, P=P), rows=rows), f, indent=1)
    return 0 if worst < 0.5 else 1


if __name__ == "__main__":
    sys.exit(main())
