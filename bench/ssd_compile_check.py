"""Compile the SSD kernels ahead of time for NVIDIA targets — no GPU needed — and report what ptxas says.

The Triton interpreter (CPU CI) runs the kernels' math but never compiles them, so it cannot catch what only the
compiler rejects (layouts, dot shapes, loop-carried types) nor say anything about register pressure. This script
lowers each kernel of `mamba3_lite.ssd_triton` (`KERNELS`: scalars, rotate, fwd, bwd_state, bwd_chunk, bwd_angle, bwd_scalars; a row per
launch where one runs as two, as fwd and bwd_chunk do on sm_80) through Triton's NVIDIA backend for each `--arch`
(80: A100, 90: H100/H200), specialised as a launch at T=2048, H=32, S=32 would be (ints equal to 1 as constants,
16-divisible ints and pointers with divisibility hints), runs the ptxas that ships with Triton with Triton's own
flags, and prints registers, spill bytes, shared memory, the `cp.async` and TMA (`cp.async.bulk.tensor`)
instructions in the PTX and the CTAs per SM that registers, shared memory and warps allow, per config; `--out` (or $OUT) also gets the table as
ssd_compile_check.json.

    python bench/ssd_compile_check.py --arch 80 90 --autotune --resets both --fail-on-spill   # what CI checks
    python bench/ssd_compile_check.py --arch 90 --chunk 32 64 --warps 4 8 16 --stages 1 2 --P 64 --N 64
    python bench/ssd_compile_check.py --groups groups.json --workers 2   # several argument lists, each kernel once
    python bench/ssd_compile_check.py --arch 90 --kernels bwd_chunk --default-config --bias on --maxnreg 240 224   # registers a launch needs
"""
import argparse
import contextlib
import io
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)   # we want the real compiler, not the interpreter
os.environ["TRITON_DUMP_PTXAS_LOG"] = "1"   # Triton's compile prints its ptxas report (see `ptxas_report`)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from mamba3_lite import ssd_triton as kern  # noqa: E402

HALVES = {"fwd": ("state", "chunk"), "bwd_chunk": ("x", "bc")}   # the launches of a kernel split in two
HALF_PTRS = ("x_ptr", "b_ptr", "c_ptr", "y_ptr", "dy_ptr", "dx_ptr", "bt_ptr", "ct_ptr", "dhs_ptr", "hs_ptr", "gb_ptr",
             "gc_ptr", "db_ptr", "dc_ptr")   # the tensors in the input / dot dtype: the rest are fp32
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
INTS = ("T", "H", "S", "NC", "OM_H", "om_hs", "G", "HG", "NJ", "NJA", "sxb", "sxt")
PTR_TYPES = {"rst_ptr": "*i32", "starts_ptr": "*i32", "turn_ptr": "*fp64"}   # the pointers neither fp32 nor the input dtype


def launch_ints(T, H, S, L, P, N, bias):
    """The integer arguments of a launch at this shape: shared B/C (one group, shared angles) with bias, else per head;
    x a view of the block's in-projection (z, x, B, C, Δ, A, λ, θ per token)."""
    G = 1 if bias else H
    sxt = 2 * H * P + 2 * G * N + 3 * H + S
    return dict(T=T, H=H, S=S, NC=-(-T // L), OM_H=1, om_hs=0, G=G, HG=H // G, NJ=max(N // 2, 16) // kern._angle_pairs(N),
                NJA=-(-S // kern._angle_pairs(N)), sxb=T * sxt, sxt=sxt)


def specialise(fn, dtype, consts, ints):
    """Signature, constexprs and attributes as Triton builds them at launch: ints equal to 1 become constexprs, ints
    divisible by 16 and (16-byte aligned) pointers carry a divisibility hint, which lets loads and stores vectorise."""
    half = HALF_PTRS
    consts = dict(consts, **{k: 1 for k in fn.arg_names if ints.get(k) == 1})
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            sig[name] = "constexpr"
            continue
        sig[name] = ("i32" if name in INTS else PTR_TYPES.get(name) or (f"*{dtype}" if name in half else "*fp32"))
        if name not in INTS or ints[name] % 16 == 0:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, consts, attrs


def ptxas_report(ptx, arch, log=""):
    """Registers, spill bytes and stack of the PTX from the ptxas that ships with Triton, with Triton's own flags:
    `log`, what Triton's compile printed when it ran that ptxas (TRITON_DUMP_PTXAS_LOG), else a run of it here (a
    compile Triton's cache served runs no ptxas)."""
    if "Used" not in log:
        ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
        with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
            f.write(ptx)
        log = subprocess.run([str(ptxas), "-lineinfo", "-v", "--regAllocOptLevel=2",
                              f"--gpu-name=sm_{arch}{'a' if arch >= 90 else ''}", f.name, "-o", os.devnull],
                             capture_output=True, text=True).stderr
        os.unlink(f.name)
    text = log
    num = lambda pat: int(m.group(1)) if (m := re.search(pat, text)) else None
    return dict(registers=num(r"Used (\d+) registers"), spill_store_bytes=num(r"(\d+) bytes spill stores"),
                spill_load_bytes=num(r"(\d+) bytes spill loads"), stack_bytes=num(r"(\d+) bytes stack frame"))


# shared memory a SM holds: A100 164 KiB, H100/H200 228 KiB; consumer Ampere (sm_86) and Ada (sm_89) 100 KiB, of which
# a CTA may use 99 KiB (SMEM_PER_CTA): a launch needing more cannot start there
SMEM_PER_SM = {80: 167936, 86: 102400, 89: 102400, 90: 233472}
SMEM_PER_CTA = {80: 166912, 86: 101376, 89: 101376, 90: 232448}


def occupancy(arch, registers, shared, warps):
    """CTAs per SM the launch allows: registers (a warp's allocated in units of 256, 64K a SM), shared memory (1 KiB
    reserved per CTA), warps (64 a SM) and the 32-CTA cap."""
    regs_per_warp = -(-registers * 32 // 256) * 256
    by_smem = SMEM_PER_SM[arch] // (shared + 1024)
    return min(32, 64 // warps, 65536 // (regs_per_warp * warps), by_smem)


def lowering(kind, dtype, L, P, N, warps, stages, arch, bias=True, maxnreg=None, T=2048, H=32, S=32,
             resets=False, BN=None, half="all"):
    """What `triton.compile` gets for one kernel on sm_`arch` — its function, signature, constexprs, attributes and
    options, which alone decide the compiled code — and the row's labels. `half`: "all", or for a kernel split in
    two launches (`HALVES`) which one; `BN`: the state tile of the kernels that tile the state (default: the arch's)."""
    BN = min(BN or kern.default_config(kind, arch, N, TORCH_DTYPES[dtype]).get("BN", N), N)
    dot = {"bf16": tl.bfloat16, "fp16": tl.float16, "fp32": tl.float32}[dtype]
    fn = getattr(kern, f"_ssd_fwd_{half}_kernel" if kind == "fwd" and half != "all" else f"_ssd_{kind}_kernel")
    BN = BN if "BN" in fn.arg_names else None
    NH = max(N // 2, 16)
    every = dict(L=L, P=P, N=N, BN=BN, DO_X=half != "bc", DO_BC=half != "x",
                 NH=kern._angle_pairs(N) if kind == "bwd_angle" else NH,   # the angle backward: a block of pairs
                 HAS_THETA=True, HAS_D=True, HAS_BIAS=bias, HAS_H0=True, HAS_DHT=True, HAS_RST=resets,
                 STORE=True, DOT_DTYPE=dot, PREC="ieee", HG=H if bias else 1, HGP=H if bias else 1, OM_SHARED=True,
                 HP=kern._scalar_tiles(H, S)[0], SP=kern._scalar_tiles(H, S)[1], NJAP=triton.next_power_of_2(-(-S // kern._angle_pairs(N))))
    if kind in ("carry", "bwd_carry"):        # a block of chunks (and the final angle) at a time
        every["CB"] = kern._carry_block(-(-T // L))
    if kind == "rotate":                      # its heads a program and pairs a block, as `_ssd_fwd` launches it
        every["HB"], every["JB"] = kern._rotate_tiles(N, every["HG"], TORCH_DTYPES[dtype])
        every["HGP"] = every["HB"]
    consts = {k: v for k, v in every.items() if k in fn.arg_names}
    options = dict(num_warps=warps, num_stages=stages, **({} if maxnreg is None else dict(maxnreg=maxnreg)))
    sig, consts, attrs = specialise(fn, dtype, consts, launch_ints(T, H, S, L, P, N, bias))
    labels = dict(kernel=kind, half=half if kind in HALVES else None, BN=BN, arch=arch, dtype=dtype, L=L, P=P, N=N,
                  bias=bias, resets=resets, num_warps=warps, num_stages=stages, stages=stages, maxnreg=maxnreg)
    return fn, sig, consts, attrs, options, labels


def lowering_key(fn, sig, consts, attrs, options, arch):
    "Equal for two lowerings exactly when `triton.compile` builds the same kernel from them."
    return (fn.__name__, repr(sorted(sig.items())), repr(sorted(consts.items())), repr(sorted(attrs.items())),
            repr(sorted(options.items())), arch)


def compile_kernel(kind, dtype, L, P, N, warps, stages, arch, **kw):
    """Lower one kernel through Triton's NVIDIA backend for sm_`arch` and return its ptxas report as a table row
    (the arguments: `lowering`'s)."""
    t0 = time.perf_counter()
    fn, sig, consts, attrs, options, labels = lowering(kind, dtype, L, P, N, warps, stages, arch, **kw)
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        ck = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                            target=GPUTarget("cuda", arch, 32), options=options)
    ptx = ck.asm["ptx"]
    rep = ptxas_report(ptx, arch, log.getvalue())
    return dict(labels, shared_bytes=ck.metadata.shared, compile_s=round(time.perf_counter() - t0, 1), **rep,
                cp_async=len(re.findall(r"cp\.async\.c[ag]", ptx)), tma=len(re.findall(r"cp\.async\.bulk\.tensor", ptx)),
                fits=ck.metadata.shared <= SMEM_PER_CTA[arch],
                ctas_per_sm=occupancy(arch, rep["registers"], ck.metadata.shared, warps))


def compile_row(job):
    "`compile_kernel(**job)`, or on a compile error (the finding) a row with the job's labels and the error."
    try:
        return compile_kernel(**job)
    except Exception as e:
        return dict(kernel=job["kind"], half=job["half"], arch=job["arch"], dtype=job["dtype"], L=job["L"],
                    num_warps=job["warps"], num_stages=job["stages"], bias=job["bias"], resets=job["resets"],
                    maxnreg=job.get("maxnreg"),
                    error=f"{type(e).__name__}: {e}"[:2000])


def compile_rows(jobs, workers=1):
    """A row per job (`compile_kernel`'s keyword arguments), in order, compiled in `workers` processes. Jobs that
    lower to the same kernel (`lowering_key`: e.g. a kernel whose code does not depend on the flag two jobs differ
    in) compile once and share the row, relabelled as each job asks."""
    keys, labels, firsts = [], [], {}
    for job in jobs:
        fn, sig, consts, attrs, options, lab = lowering(**job)
        keys.append(lowering_key(fn, sig, consts, attrs, options, job["arch"]))
        labels.append(lab)
        firsts.setdefault(keys[-1], job)
    todo = list(firsts.values())
    print(f"{len(jobs)} launches lower to {len(todo)} kernels, compiled on {workers} process(es)", flush=True)
    if workers > 1 and len(todo) > 1:
        with multiprocessing.get_context("fork").Pool(workers) as pool:   # forked: torch and triton already imported
            done = pool.map(compile_row, todo, chunksize=1)
    else:
        done = [compile_row(j) for j in todo]
    by_key = dict(zip(firsts, done))
    return [{f: lab.get(f, v) for f, v in by_key[k].items()} for k, lab in zip(keys, labels)]


def launches(kind, arch, dtype, a):
    """(num_warps, num_stages, BN, half) of each launch of `kind` to compile: its default config on `arch` for `dtype`
    inputs, or the sweep the arguments ask for. A kernel split in two launches gives a row per launch (`HALVES`)."""
    d = kern.default_config(kind, arch, a.N, TORCH_DTYPES[dtype])
    if a.autotune:
        grid = [(c["num_warps"], c["num_stages"], c.get("BN"))
                for c in kern.autotune_configs(kind, arch, a.N, TORCH_DTYPES[dtype])]
        split = d.get("split", False)
    elif a.default_config:
        grid, split = [(d["num_warps"], d["num_stages"], d.get("BN"))], d.get("split", False)
    else:
        split = d.get("split", False) if a.split is None else a.split == "on"
        tiled = kind == "bwd_chunk" or kind == "fwd" and split                # the kernels that take BN
        grid = [(w, s, bn) for w in a.warps for s in a.stages for bn in (a.bn if tiled else [None])]
    halves = HALVES[kind] if kind in HALVES and split else ("all",)
    return [(w, s, bn, h) for w, s, bn in grid for h in halves]


def launch_name(r):
    "A row's launch: the kernel, `.half` for a kernel split in two launches, `@cap` for a ptxas register cap."
    name = r["kernel"] if r.get("half") in (None, "all") else f"{r['kernel']}.{r['half']}"
    return name if r.get("maxnreg") is None else f"{name}@{r['maxnreg']}"


def markdown(rows, N):
    """The rows as a markdown table: a row per launch, a column per (arch, dtype, chunk, bias, resets); a cell is the
    spill store/load bytes, then registers, warps and stages."""
    cols = list(dict.fromkeys((r["arch"], r["dtype"], r["L"], r["bias"], r["resets"]) for r in rows))
    names = list(dict.fromkeys(launch_name(r) for r in rows))
    cell = {}
    for r in rows:
        name = launch_name(r)
        cell[(name, (r["arch"], r["dtype"], r["L"], r["bias"], r["resets"]))] = (
            r["error"][:40] if "error" in r else
            f"{r['spill_store_bytes']}/{r['spill_load_bytes']} ({r['registers']}, {r['num_warps']} w, {r['num_stages']} st)")
    head = [f"sm_{ar}, {dt}, $L = {L}$, $N = {N}$" + ("" if bias else ", no bias") + (", restarts" if rst else "")
            for ar, dt, L, bias, rst in cols]
    lines = ["| launch | " + " | ".join(head) + " |", "|---" * (len(cols) + 1) + "|"]
    lines += [f"| {n} | " + " | ".join(cell.get((n, c), "") for c in cols) + " |" for n in names]
    return "\n".join(lines)


def parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", type=int, nargs="+", default=[90], help="CUDA compute capabilities (80: A100, 86/89: consumer Ampere/Ada, 90: H100/H200)")
    p.add_argument("--kernels", nargs="+", default=list(kern.KERNELS), choices=list(kern.KERNELS))
    p.add_argument("--chunk", type=int, nargs="+", default=[64],
                   help="chunk sizes; fp32 compiles at the chunk ssd_triton runs it at (`kernel_chunk`: at most 16)")
    p.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    p.add_argument("--stages", type=int, nargs="+", default=[1])
    p.add_argument("--dtype", nargs="+", default=["bf16"], choices=["bf16", "fp16", "fp32"])
    p.add_argument("--P", type=int, default=64)
    p.add_argument("--N", type=int, default=128)
    p.add_argument("--bias", default="both", choices=["on", "off", "both"],
                   help="compile the shared-B/C + bias variant (HAS_BIAS), the per-head one, or both")
    p.add_argument("--resets", default="off", choices=["on", "off", "both"],
                   help="compile the variant with document restarts (seq_idx, HAS_RST), the one without, or both")
    p.add_argument("--bn", type=int, nargs="+", default=[None],
                   help="fwd, bwd_chunk: state tiles to try (default: the arch's default)")
    p.add_argument("--split", default=None, choices=["on", "off"],
                   help="fwd, bwd_chunk: two launches (on) or one (off); default: the arch's default")
    p.add_argument("--default-config", action="store_true",
                   help="compile each kernel at its default launch config for the arch (ignores --warps/--stages)")
    p.add_argument("--autotune", action="store_true",
                   help="compile every config `triton.autotune` may pick for the arch (`autotune_configs`; the default "
                        "first; ignores --warps/--stages/--bn)")
    p.add_argument("--maxnreg", type=int, nargs="+", default=[None],
                   help="hold ptxas to these registers per thread (Triton's maxnreg), one compile each; default: no "
                        "cap. The fewest that still compile without spills are what a launch needs")
    p.add_argument("--markdown", action="store_true",
                   help="also print the table as markdown: a row per launch, a column per arch/dtype/bias/resets")
    p.add_argument("--fail-on-spill", action="store_true", help="exit 1 if any compiled kernel spills registers")
    p.add_argument("--groups", default=None,
                   help="JSON file holding a list of argument lists (the options above that choose what to compile): "
                        "compile them all in one run, each kernel once; the json gives each group's rows")
    p.add_argument("--workers", type=int, default=1, help="processes that compile in parallel")
    p.add_argument("--out", default=None, help="directory for ssd_compile_check.json (default: $OUT if set)")
    return p


def jobs(a):
    "`compile_kernel`'s keyword arguments for each launch the parsed arguments `a` ask for, in table order."
    biases = {"on": (True,), "off": (False,), "both": (False, True)}[a.bias]
    resets_ = {"on": (True,), "off": (False,), "both": (False, True)}[a.resets]
    return [dict(kind=kind, dtype=dtype, L=L, P=a.P, N=a.N, warps=warps, stages=stages, arch=arch, bias=bias,
                 resets=resets, BN=BN, half=half, maxnreg=maxnreg)
            for arch in a.arch for dtype in a.dtype for bias in biases for resets in resets_
            for L in dict.fromkeys(kern.kernel_chunk(c, TORCH_DTYPES[dtype]) for c in a.chunk)   # as ssd_triton runs it
            for kind in a.kernels for warps, stages, BN, half in launches(kind, arch, dtype, a)
            for maxnreg in a.maxnreg]


def main(argv=None):
    p = parser()
    a = p.parse_args(argv)
    groups = [p.parse_args(g) for g in json.loads(Path(a.groups).read_text())] if a.groups else [a]
    group_jobs = [jobs(g) for g in groups]
    rows = compile_rows([j for js in group_jobs for j in js], a.workers)
    failed = False
    print(f"triton {triton.__version__}, P={a.P} N={a.N}" if not a.groups else f"triton {triton.__version__}")
    print(f"{'kernel':12} {'arch':>4} {'dtype':5} {'bias':4} {'rst':3} {'L':>4} {'warps':>5} {'stages':>6} {'cap':>4} {'regs':>5} "
          f"{'spill st/ld B':>14} {'smem KiB':>8} {'cp.async':>8} {'tma':>4} {'CTA/SM':>6} {'compile s':>9}")
    for r in rows:
        name = launch_name(r)
        head = (f"{name:12} {r['arch']:4} {r['dtype']:5} {'yes' if r['bias'] else 'no':4} "
                f"{'yes' if r['resets'] else 'no':3} {r['L']:4} {r['num_warps']:5} {r['num_stages']:6} "
                f"{r.get('maxnreg') or '-':>4}")
        if "error" in r:   # a compile error is the finding: report it and fail at the end
            failed = True
            print(f"{head} COMPILE ERROR {r['error'][:300]}")
            continue
        spills = r["spill_store_bytes"] + r["spill_load_bytes"]
        failed |= a.fail_on_spill and spills > 0 or not r["fits"]     # a launch that cannot start: a finding
        print(f"{head} {r['registers']:5} {r['spill_store_bytes']:>6}/{r['spill_load_bytes']:<7} "
              f"{r['shared_bytes'] / 1024:8.0f} {r['cp_async']:8} {r['tma']:4} {r['ctas_per_sm']:6} "
              f"{r['compile_s']:9.1f}" + ("" if r["fits"] else
                                          f"  DOES NOT FIT: {SMEM_PER_CTA[r['arch']] // 1024} KiB a CTA on sm_{r['arch']}"),
              flush=True)
    if a.markdown:
        print(markdown(rows, a.N))
    out = a.out or os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        ends = [sum(map(len, group_jobs[:i + 1])) for i in range(len(group_jobs))]
        (Path(out) / "ssd_compile_check.json").write_text(json.dumps(dict(
            triton=triton.__version__, rows=rows, groups=[rows[e - len(js):e] for e, js in zip(ends, group_jobs)]),
            indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
