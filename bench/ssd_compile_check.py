"""Compile the fused SSD kernels ahead of time for an NVIDIA target — no GPU needed — and report what ptxas says.

The Triton interpreter (CPU CI) runs the kernels' math but never compiles them, so it cannot catch what only the
compiler rejects (layouts, dot shapes, loop-carried types) nor say anything about register pressure. This script
lowers `_ssd_fwd_kernel` / `_ssd_bwd_kernel` through Triton's NVIDIA backend for `--arch` (default 90, H100/H200),
runs the ptxas bundled with Triton with `-v`, and prints registers, spill bytes and shared memory per config.

    python bench/ssd_compile_check.py                         # bf16, L=64, warps 4 and 8
    python bench/ssd_compile_check.py --chunk 32 64 128 --warps 4 8 16 --dtype bf16 fp32
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)   # we want the real compiler, not the interpreter

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from mamba3_lite import ssd_triton as kern  # noqa: E402

HALF_PTRS = ("x_ptr", "b_ptr", "c_ptr", "y_ptr", "dy_ptr", "dx_ptr", "db_ptr", "dc_ptr")
INTS = ("T", "H", "S", "NC", "OM_H", "om_hs", "G", "HG")


def signature(fn, dtype, constexprs):
    "Triton signature: x/B/C/y (and their gradients) in `dtype`, the rest fp32 pointers, int32 sizes."
    return {name: "constexpr" if name in constexprs else "i32" if name in INTS
            else f"*{dtype}" if name in HALF_PTRS else "*fp32" for name in fn.arg_names}


def ptxas_report(ptx, arch):
    "Registers, spill bytes and stack of the PTX, from the ptxas that ships with Triton."
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    out = subprocess.run([str(ptxas), "-v", f"--gpu-name=sm_{arch}a", f.name, "-o", os.devnull],
                         capture_output=True, text=True)
    os.unlink(f.name)
    text = out.stderr
    num = lambda pat: int(m.group(1)) if (m := re.search(pat, text)) else None
    return dict(registers=num(r"Used (\d+) registers"), spill_store_bytes=num(r"(\d+) bytes spill stores"),
                spill_load_bytes=num(r"(\d+) bytes spill loads"), stack_bytes=num(r"(\d+) bytes stack frame"))


def compile_kernel(kind, dtype, L, P, N, warps, stages, arch, bias=True):
    dot = {"bf16": tl.bfloat16, "fp16": tl.float16, "fp32": tl.float32}[dtype]
    common = dict(L=L, P=P, N=N, NH=max(N // 2, 16), HAS_THETA=True, HAS_D=True, HAS_BIAS=bias, DOT_DTYPE=dot,
                  PREC="ieee")
    fn, consts = ((kern._ssd_fwd_kernel, dict(common, HAS_H0=True, STORE=True)) if kind == "fwd"
                  else (kern._ssd_bwd_kernel, common))
    t0 = time.perf_counter()
    ck = triton.compile(ASTSource(fn=fn, signature=signature(fn, dtype, consts), constexprs=consts),
                        target=GPUTarget("cuda", arch, 32), options=dict(num_warps=warps, num_stages=stages))
    return dict(kernel=kind, dtype=dtype, L=L, P=P, N=N, num_warps=warps, num_stages=stages, arch=arch, bias=bias,
                shared_bytes=ck.metadata.shared, compile_s=round(time.perf_counter() - t0, 1),
                **ptxas_report(ck.asm["ptx"], arch))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", type=int, default=90, help="CUDA compute capability (90: H100/H200)")
    p.add_argument("--chunk", type=int, nargs="+", default=[64])
    p.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    p.add_argument("--stages", type=int, default=1)
    p.add_argument("--dtype", nargs="+", default=["bf16"], choices=["bf16", "fp16", "fp32"])
    p.add_argument("--P", type=int, default=64)
    p.add_argument("--N", type=int, default=128)
    p.add_argument("--bias", default="both", choices=["on", "off", "both"],
                   help="compile the shared-B/C + bias variant (HAS_BIAS), the per-head one, or both")
    p.add_argument("--out", default=None, help="directory for ssd_compile_check.json (default: $OUT if set)")
    a = p.parse_args(argv)
    rows, failed = [], False
    print(f"triton {triton.__version__}, sm_{a.arch}a, P={a.P} N={a.N}, num_stages={a.stages}")
    print(f"{'kernel':6} {'dtype':5} {'bias':4} {'L':>4} {'warps':>5} {'regs':>5} {'spill st/ld B':>14} {'smem KiB':>8} "
          f"{'compile s':>9}")
    biases = {"on": (True,), "off": (False,), "both": (False, True)}[a.bias]
    for dtype in a.dtype:
        for bias in biases:
            for L in a.chunk:
                for warps in a.warps:
                    for kind in ("fwd", "bwd"):
                        head = f"{kind:6} {dtype:5} {'yes' if bias else 'no':4} {L:4} {warps:5}"
                        try:
                            r = compile_kernel(kind, dtype, L, a.P, a.N, warps, a.stages, a.arch, bias)
                        except Exception as e:  # a compile error is the finding: report it and fail at the end
                            failed = True
                            r = dict(kernel=kind, dtype=dtype, L=L, num_warps=warps, bias=bias,
                                     error=f"{type(e).__name__}: {e}"[:2000])
                            print(f"{head} COMPILE ERROR {r['error'][:300]}")
                            rows.append(r)
                            continue
                        rows.append(r)
                        print(f"{head} {r['registers']:5} {r['spill_store_bytes']:>6}/{r['spill_load_bytes']:<7} "
                              f"{r['shared_bytes'] / 1024:8.0f} {r['compile_s']:9.1f}")
    out = a.out or os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "ssd_compile_check.json").write_text(json.dumps(dict(triton=triton.__version__, rows=rows), indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
