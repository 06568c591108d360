"""The GPU suite's first section: every module the suite needs imports, what ran where, and the two ceilings every
later number is read against.

1. Imports, before anything else: every module that the scripts of bench/gpu_suite.sh's sections import (read from
   their source, at any depth, and from the bench/ modules they import; for `gpu_cells.py`, the cells it runs), the
   `mamba3_lite` modules with their own imports, third-party packages by name. Imports under `try:` that catch
   ImportError are optional and left out, as are the timing peers (fla, mamba_ssm) and IPython (gpu_cells.py stands
   in for it). The first one missing ends the run in seconds with exit status 4 and one line naming it and who needs
   it; bench/gpu_suite.sh then skips every later section.
2. python / torch / triton / numpy versions, the device, and the GPU's datasheet row in bench/gpu_model.py's `GPUS`
   (by device name, `gpu_from_name`; a card the table does not hold gets no MFU or roofline in any section, one line
   says so).
3. Whether each peer imports (fla, the official mamba_ssm Triton kernels).
4. On a GPU the measured ceilings: device-to-device copy bandwidth (bytes read + written) and a bf16 matrix product's
   rate on random data, medians of CUDA-event timings after warm-up, beside the datasheet's.

env.json is rewritten after each step, and on SIGINT says which step was cut (`interrupted`).

    python bench/gpu_env.py --out DIR          # on the GPU machine
    python bench/gpu_env.py --cpu --out DIR    # imports, versions and peers only
    python bench/gpu_env.py --list-imports     # the modules step 1 imports, and who needs each
"""
import argparse
import ast
import importlib
import importlib.util
import json
import platform
import re
import statistics
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))   # this checkout's mamba3_lite, installed or not
from gpu_model import GPUS, gpu_from_name  # noqa: E402
from mamba3_lite.files import atomic_write  # noqa: E402  (the standard library only)

MISSING = 4            # exit status: a module the suite needs does not import
PEERS = ("fla", "mamba_ssm")
STAND_INS = ("IPython",)   # bench/gpu_cells.py replaces IPython.display when it is missing
PACKAGE = "mamba3_lite"
UNUSED = {"pyarrow": "mamba3_lite.prepare reads parquet input with it; the suite prepares text"}   # imported, never run


# ---------------------------------------------------------------- 1. what the suite imports
def suite_scripts(suite=BENCH / "gpu_suite.sh"):
    "The bench/ scripts bench/gpu_suite.sh's sections run, in the order they appear."
    text = suite.read_text()
    sections = text[text.index("# ---------------------------------------------------------------- sections"):]
    return list(dict.fromkeys(re.findall(r'"\$PYTHON" bench/(\w+)\.py', sections)))


def _catches_import_errors(handler):
    names = [handler.type] if not isinstance(handler.type, ast.Tuple) else handler.type.elts
    return handler.type is None or any(isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError", "Exception")
                                       for n in names)


def imports_in(source: str, package: str = None):
    """[(module, optional)] of the imports in `source` at any depth, in order; optional: inside a `try` that catches
    ImportError. Relative imports are resolved against `package`."""
    tree = ast.parse(source)
    optional = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(_catches_import_errors(h) for h in node.handlers):
            optional.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    out = []
    for node in sorted((n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))),
                       key=lambda n: (n.lineno, n.col_offset)):
        if isinstance(node, ast.Import):
            out += [(a.name, id(node) in optional) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                out.append((node.module, id(node) in optional))
            elif node.level == 1 and package:
                names = [node.module] if node.module else [a.name for a in node.names]
                out += [(f"{package}.{n}", id(node) in optional) for n in names]
    return out


def notebook_cells_source(scripts):
    "{label: source} of the cells bench/gpu_cells.py runs (flag gpu), when the suite runs it."
    if "gpu_cells" not in scripts:
        return {}
    import gpu_cells
    out = {}
    for nb in sorted((ROOT / "nbs").glob("*.ipynb")):
        if gpu_cells.has_gpu_cells(nb):
            for i, src in gpu_cells.cells_to_run(nb, {"gpu"}):
                out[f"nbs/{nb.name} cell {i}"] = "\n".join(l for l in src.splitlines() if not l.lstrip().startswith(("%", "!")))
    return out


def needed_modules(scripts=None):
    """{module: who needs it} for what the suite's scripts import, at any depth: third-party modules first, then this
    package's modules, each once, in the order first met; bench/ modules and package modules are followed into their
    own imports (inside functions too: the suite calls them). The standard library, the peers, stand-ins, optional
    imports and `UNUSED` are left out."""
    scripts = suite_scripts() if scripts is None else scripts
    third, ours, followed = {}, {}, {f"bench/{s}.py" for s in scripts}

    def walk(queue):
        while queue:
            who, src, package = queue.pop(0)
            try:
                found = imports_in(src, package)
            except SyntaxError:   # a notebook cell that is not plain Python
                continue
            for module, optional in found:
                top = module.split(".")[0]
                if optional or top in sys.stdlib_module_names or top in PEERS or top in STAND_INS or top in UNUSED:
                    continue
                if top != PACKAGE and not (BENCH / f"{top}.py").is_file():
                    third.setdefault(module, who)
                    continue
                if top == PACKAGE:
                    ours.setdefault(module, who)
                path = ROOT / (module.replace(".", "/") + ".py") if top == PACKAGE else BENCH / f"{top}.py"
                if not path.is_file():
                    path = path.with_suffix("") / "__init__.py"
                name = str(path.relative_to(ROOT))
                if path.is_file() and name not in followed:
                    followed.add(name)
                    queue.append((name, path.read_text(), PACKAGE if top == PACKAGE else None))

    walk([(f"bench/{s}.py", (BENCH / f"{s}.py").read_text(), None) for s in scripts])
    walk([(who, src, None) for who, src in notebook_cells_source(scripts).items()])   # what the scripts miss
    return {**third, **ours}


def lacking(image_has, peers_dir):
    """The top-level third-party modules the suite needs that are neither in `image_has` (import names) nor in a wheel
    in `peers_dir`: what a device image with `image_has` would miss."""
    import zipfile
    brought = set()
    for whl in Path(peers_dir).glob("*.whl"):
        with zipfile.ZipFile(whl) as z:
            brought.update(n.split("/")[0].split(".")[0] for n in z.namelist() if not n.split("/")[0].endswith((".dist-info", ".data")))
    tops = dict.fromkeys(m.split(".")[0] for m in needed_modules() if m.split(".")[0] != PACKAGE)
    return [t for t in tops if t not in set(image_has) | brought]


def missing_module(needed):
    """None when every module in `needed` ({module: who}) imports, else (module, who, the missing name, the error).
    Stops at the first failure."""
    for module, who in needed.items():
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            return module, who, e.name or module, f"{type(e).__name__}: {e}"
        except Exception as e:   # a module that is there but does not load (a broken wheel, an API it lacks)
            return module, who, module, f"{type(e).__name__}: {e}"[:300]
    return None


def missing_line(module, who, name, error):
    "The one line that names a missing module and who needs it."
    own = name == module or module.startswith(name + ".")          # the module itself, or the package it is in
    via = f"imported by {who}" if own else f"which {module} imports, imported by {who}"
    return (f"gpu_env.py: missing module '{name}' ({via}): {error}; carry it as a wheel in bench/peers/ "
            f"(bench/fetch_peers.sh) or install it")


# ---------------------------------------------------------------- 2. the GPU's datasheet row
def datasheet(device_name, say=print):
    """(GPUS key, its row) for the GPU called `device_name`, or (None, None) after one line saying that no MFU or
    roofline is reported for it (no peak is assumed)."""
    key = gpu_from_name(device_name)
    if key is None:
        say(f"{device_name!r} is not in bench/gpu_model.py's GPUS ({', '.join(GPUS)}): no MFU or roofline reported")
        return None, None
    return key, GPUS[key]


# ---------------------------------------------------------------- 4. measured ceilings
def median_ms(fn, reps=10, warmup=3):
    "Median of `reps` CUDA-event timings of fn() in ms, after `warmup` calls."
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(); fn(); end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def ceilings():
    "Measured copy bandwidth (TB/s, read + write) and bf16 matmul rate (TFLOP/s) on this GPU."
    import torch
    src = torch.randn(2**30 // 4, device="cuda")            # 1 GiB fp32
    dst = torch.empty_like(src)
    copy_ms = median_ms(lambda: dst.copy_(src))
    n = 8192
    a, b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16), torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    mm_ms = median_ms(lambda: a @ b)
    return dict(copy_tbps=2 * src.numel() * 4 / (copy_ms * 1e9), bf16_matmul_tflops=2 * n**3 / (mm_ms * 1e9),
                copy_bytes=2 * src.numel() * 4, matmul_n=n)


def peer_status():
    "One line per peer: importable or why not (mamba_ssm is only located: bench/ssd_kernel.py imports its kernels)."
    status = {}
    try:
        __import__("fla.ops.simple_gla")
        status["fla"] = "ok"
    except Exception as e:
        status["fla"] = f"unavailable: {type(e).__name__}: {e}"[:160]
    spec = importlib.util.find_spec("mamba_ssm")
    status["mamba_ssm"] = f"found at {list(spec.submodule_search_locations)[0]}" if spec else "unavailable: not installed"
    return status


def show(rec, *keys):
    "Print `keys` of rec (all of them when none are given)."
    for k in keys or rec:
        print(f"{k:>20}: {rec[k]}", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true", help="no GPU: imports, versions and peers only")
    p.add_argument("--smoke", action="store_true", help="accepted for bench/gpu_suite.sh (same work)")
    p.add_argument("--out", default="bench/results", help="directory for env.json")
    p.add_argument("--list-imports", action="store_true", help="print the modules the suite needs and who needs each")
    p.add_argument("--lacking", nargs=2, metavar=("IMAGE_HAS", "PEERS_DIR"),
                   help="print the modules the suite needs that neither IMAGE_HAS (space-separated import names) nor a "
                        "wheel in PEERS_DIR provides; exit 1 if any (bench/fetch_peers.sh's check)")
    a = p.parse_args(argv)
    if a.lacking:
        miss = lacking(a.lacking[0].split(), a.lacking[1])
        print("the device image and bench/peers provide every module the suite needs" if not miss else
              f"gpu_env.py: the device image lacks {', '.join(miss)} and no wheel in {a.lacking[1]} provides it")
        return int(bool(miss))
    needed = needed_modules()
    if a.list_imports:
        for module, who in needed.items():
            print(f"{module:36s} {who}")
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rec = dict(python=sys.version.split()[0], platform=platform.platform())
    save = lambda: atomic_write(out / "env.json", lambda tmp: tmp.write_text(json.dumps(rec, indent=1)), sync_dir=False)
    step = "the imports"
    try:   # env.json after each step, so a step that hangs (a peer's import, the first CUDA call) keeps the earlier ones
        t0 = time.perf_counter()
        miss = missing_module(needed)
        rec["imports"] = dict(modules=len(needed), seconds=round(time.perf_counter() - t0, 2))
        if miss:
            rec["missing"] = dict(zip(("module", "needed_by", "name", "error"), miss))
            save()
            print(missing_line(*miss), flush=True)
            return MISSING
        print(f"imports: all {len(needed)} modules the suite needs import ({rec['imports']['seconds']} s)", flush=True)
        import numpy as np
        import torch
        import triton
        rec.update(torch=torch.__version__, triton=triton.__version__, numpy=np.__version__, cuda=torch.version.cuda)
        step = "the device query"
        if a.cpu:
            rec["device"] = "CPU"
        else:
            if not torch.cuda.is_available():
                p.error("no CUDA device visible (use --cpu)")
            props = torch.cuda.get_device_properties(0)
            rec.update(device=props.name, sms=props.multi_processor_count, memory_gib=props.total_memory / 2**30,
                       capability=f"{props.major}.{props.minor}")
            key, row = datasheet(props.name)
            rec.update(gpu=key, datasheet=row)
        save()
        step = "the peers' imports"
        show(rec, *[k for k in rec if k != "imports"])
        rec["peers"] = peer_status()
        save()
        show(rec, "peers")
        if not a.cpu:
            step = "the ceilings"
            t0 = time.perf_counter()
            rec.update(ceilings())
            rec["ceilings_s"] = time.perf_counter() - t0
            if rec.get("datasheet"):
                rec.update(copy_of_datasheet=rec["copy_tbps"] * 1e12 / rec["datasheet"]["bandwidth"],
                           matmul_of_datasheet=rec["bf16_matmul_tflops"] * 1e12 / rec["datasheet"]["tensor"])
            save()
            show(rec, "copy_tbps", "bf16_matmul_tflops", "copy_bytes", "matmul_n", "ceilings_s")
    except KeyboardInterrupt:   # SIGINT (the suite's cap): what was measured stays, with where it stopped
        rec["interrupted"] = f"interrupted (SIGINT) during {step}"
        save()
        print(f"gpu_env.py: {rec['interrupted']}; kept what was reached in {out / 'env.json'}", flush=True)
        return 130
    return 0


if __name__ == "__main__":
    import sigint_once
    sigint_once.install()
    sys.exit(main())
