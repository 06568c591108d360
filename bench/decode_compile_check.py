"""Compile the fused decode step (`mamba3_lite.decode`) ahead of time for NVIDIA targets — no GPU needed — and report
what ptxas says: registers, spill bytes, shared memory and CTAs per SM, per variant.

Each variant is lowered through Triton's NVIDIA backend for sm_80 (A100) and sm_90 (H100/H200) exactly as a launch at
the Mamba-3 paper's decode shape (Table 6: batch 128, 64 heads of P = 64) would specialise it: its constexprs from
the block, `decode_config`'s rows a program and warps, ints divisible by 16 and pointers with divisibility hints.
ptxas is the one that ships with Triton, run with Triton's own flags (`ptxas_report` and `occupancy` of
bench/ssd_compile_check.py).

    python bench/decode_compile_check.py --fail-on-spill          # every variant, both arches (what the README quotes)
    python bench/decode_compile_check.py --quick --fail-on-spill  # the subset tests/test_decode.py compiles
    python bench/decode_compile_check.py --arch 90 --N 128 --markdown --out /tmp/cc
"""
import argparse
import contextlib
import io
import itertools
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

from ssd_compile_check import occupancy, ptxas_report   # (imports with TRITON_INTERPRET unset: the real compiler)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from mamba3_lite.block import Mamba3Block  # noqa: E402
from mamba3_lite.decode import ROTATION_CODES, _decode_kernel, decode_config  # noqa: E402

TL = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}
B, H, P = 128, 64, 64                                          # Table 6's batch and heads; the launch specialises on them


def variant(N, R=1, proj="bf16", state="fp32", resets=True, rotation="data", discretization="trapezoid",
            bc_bias=True, bc_norm=True, outproj_norm=False):
    "One kernel variant as a dict of its labels (the block's fields and the tensors' dtypes)."
    return dict(N=N, R=R, proj=proj, state=state, resets=resets, rotation=rotation, discretization=discretization,
                bc_bias=bc_bias, bc_norm=bc_norm, outproj_norm=outproj_norm)


def lowering(v, arch):
    "(signature, constexprs, attributes, options) of `_decode_kernel` for variant v, as its launch at (B, H, P) builds them."
    with torch.device("meta"):
        blk = Mamba3Block(H * P // 2, d_state=v["N"], headdim=P, is_mimo=v["R"] > 1, mimo_rank=v["R"],
                          rotation=v["rotation"], discretization=v["discretization"], bc_bias=v["bc_bias"],
                          bc_norm=v["bc_norm"], outproj_norm=v["outproj_norm"])
    cfg = decode_config(B, H, P, v["N"])
    S = blk.n_angles
    consts = dict(H=H, G=blk.ngroups, R=blk.rank, RP=triton.next_power_of_2(blk.rank), P=P, N=v["N"], S=S, BB=cfg["BB"],
                  ROTATION=ROTATION_CODES[blk.rotation] if S else 0, HAS_LAM=v["discretization"] == "trapezoid",
                  BC_NORM=v["bc_norm"], HAS_BIAS=v["bc_bias"], OUT_NORM=v["outproj_norm"], HAS_RST=v["resets"])
    ints = dict(b=B, s_proj=blk.d_in_proj)
    ptrs = dict(proj_ptr=TL[v["proj"]], y_ptr=TL[v["proj"]], h_ptr=TL[v["state"]], k_ptr=TL[v["state"]],
                v_ptr=TL[v["state"]], om_ptr="fp64", rst_ptr="u8")
    sig, attrs = {}, {}
    for i, name in enumerate(_decode_kernel.arg_names):
        if name in consts: sig[name] = "constexpr"
        elif name in ints:
            sig[name] = "i32"
            if ints[name] % 16 == 0: attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in ("lam_fixed", "a_floor", "eps"): sig[name] = "fp32"
        else:
            sig[name] = "*" + ptrs.get(name, "fp32")
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, consts, attrs, dict(num_warps=cfg["num_warps"], num_stages=1)


def compile_row(job):
    "The ptxas report of one (variant, arch) as a table row; a compile error is the row's finding."
    v, arch = job
    t0 = time.perf_counter()
    try:
        sig, consts, attrs, options = lowering(v, arch)
        log = io.StringIO()
        with contextlib.redirect_stdout(log):
            ck = triton.compile(ASTSource(fn=_decode_kernel, signature=sig, constexprs=consts, attrs=attrs),
                                target=GPUTarget("cuda", arch, 32), options=options)
        rep = ptxas_report(ck.asm["ptx"], arch, log.getvalue())
        return dict(v, arch=arch, num_warps=options["num_warps"], BB=consts["BB"], shared_bytes=ck.metadata.shared,
                    ctas_per_sm=occupancy(arch, rep["registers"], ck.metadata.shared, options["num_warps"]),
                    compile_s=round(time.perf_counter() - t0, 1), **rep)
    except Exception as e:
        return dict(v, arch=arch, error=f"{type(e).__name__}: {e}"[:2000])


def variants(a):
    "The variants the arguments ask for: every combination of the main axes, then the ablation and dtype variants."
    out = [variant(N, R, state=s, resets=r) for N in a.N for R in (1, 4) for s in ("fp32", "bf16") for r in (True, False)]
    for N in a.N:
        out += [variant(N, proj="fp32"), variant(N, proj="fp16", state="bf16"), variant(N, rotation="fixed"),
                variant(N, rotation="fixed", R=4, proj="fp32", outproj_norm=True),
                variant(N, outproj_norm=True, discretization="half"),
                variant(N, rotation="none", discretization="euler", bc_bias=False, bc_norm=False)]
    if a.quick:
        out = [x for x in out if x["N"] == a.N[0] and (x["resets"] and x["rotation"] == "data" and x["proj"] == "bf16"
                                                       or x["outproj_norm"] and x["R"] == 4)]
    return out


def label(r):
    extra = [k for k in ("outproj_norm",) if r[k]] + [f"{k}={r[k]}" for k, d in (("rotation", "data"),
             ("discretization", "trapezoid")) if r[k] != d] + [k + "=False" for k in ("bc_bias", "bc_norm") if not r[k]]
    return (f"N {r['N']}, {'SISO' if r['R'] == 1 else 'MIMO R=' + str(r['R'])}, {r['proj']} in, {r['state']} state"
            + (", resets" if r["resets"] else "") + ("; " + ", ".join(extra) if extra else ""))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", type=int, nargs="+", default=[80, 90], help="compute capabilities (80: A100, 90: H100/H200)")
    p.add_argument("--N", type=int, nargs="+", default=[128, 64], help="d_state values (P = 64)")
    p.add_argument("--quick", action="store_true", help="the first N only: the main variants with resets, and one with every option")
    p.add_argument("--workers", type=int, default=1, help="processes that compile in parallel")
    p.add_argument("--markdown", action="store_true", help="also print a markdown table: a row per variant, a column per arch")
    p.add_argument("--fail-on-spill", action="store_true", help="exit 1 if any variant spills (or fails to compile)")
    p.add_argument("--out", default=None, help="directory for decode_compile_check.json (default: $OUT if set)")
    a = p.parse_args(argv)
    os.environ["TRITON_DUMP_PTXAS_LOG"] = "1"
    jobs = [(v, arch) for v in variants(a) for arch in a.arch]
    if a.workers > 1:
        with multiprocessing.get_context("fork").Pool(a.workers) as pool:
            rows = pool.map(compile_row, jobs, chunksize=1)
    else:
        rows = [compile_row(j) for j in jobs]
    print(f"triton {triton.__version__}; the launch at batch {B}, {H} heads of P = {P}")
    print(f"{'variant':78} {'arch':>4} {'warps':>5} {'BB':>3} {'regs':>5} {'spill st/ld B':>14} {'CTA/SM':>6} {'s':>5}")
    failed = False
    for r in rows:
        if "error" in r:
            failed = True
            print(f"{label(r):78} {r['arch']:4} COMPILE ERROR {r['error'][:300]}")
            continue
        failed |= a.fail_on_spill and r["spill_store_bytes"] + r["spill_load_bytes"] > 0
        print(f"{label(r):78} {r['arch']:4} {r['num_warps']:5} {r['BB']:3} {r['registers']:5} "
              f"{r['spill_store_bytes']:>6}/{r['spill_load_bytes']:<7} {r['ctas_per_sm']:6} {r['compile_s']:5.1f}", flush=True)
    if a.markdown:
        cell = {(label(r), r["arch"]): (r["error"][:40] if "error" in r else
                f"{r['spill_store_bytes']}/{r['spill_load_bytes']} ({r['registers']} regs, {r['num_warps']} w)") for r in rows}
        names = list(dict.fromkeys(label(r) for r in rows))
        print("| variant | " + " | ".join(f"sm_{x}" for x in a.arch) + " |\n|---" * 1 + "|---" * len(a.arch) + "|")
        for n in names: print(f"| {n} | " + " | ".join(cell.get((n, x), "") for x in a.arch) + " |")
    out = a.out or os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "decode_compile_check.json").write_text(json.dumps(dict(triton=triton.__version__, rows=rows), indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
