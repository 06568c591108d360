"""The GPU suite's first section: what ran where, and the two ceilings every later number is read against.

Prints and writes (--out DIR/env.json) python / torch / triton / numpy versions, the device, whether each peer
imports (fla, the official mamba_ssm Triton kernels, fastcore), and on a GPU the measured ceilings: device-to-device
copy bandwidth (bytes read + written) and a bf16 matrix product's rate on random data, medians of CUDA-event
timings after warm-up. Datasheet peaks are leads; these are what the card gave in this run. env.json is rewritten
after the versions, the peers and the ceilings, and on SIGINT says which step was cut (`interrupted`).

    python bench/gpu_env.py --out DIR          # on the GPU machine
    python bench/gpu_env.py --cpu --out DIR    # versions and imports only
"""
import argparse
import importlib.util
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # this checkout's mamba3_lite, installed or not
from mamba3_lite.files import atomic_write  # noqa: E402


def median_ms(fn, reps=10, warmup=3):
    "Median of `reps` CUDA-event timings of fn() in ms, after `warmup` calls."
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
    for name, mod in (("fla", "fla.ops.simple_gla"), ("fastcore", "fastcore.test")):
        try:
            __import__(mod)
            status[name] = "ok"
        except Exception as e:
            status[name] = f"unavailable: {type(e).__name__}: {e}"[:160]
    spec = importlib.util.find_spec("mamba_ssm")
    status["mamba_ssm"] = f"found at {list(spec.submodule_search_locations)[0]}" if spec else "unavailable: not installed"
    return status


def show(rec, *keys):
    "Print `keys` of rec (all of them when none are given)."
    for k in keys or rec:
        print(f"{k:>20}: {rec[k]}", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true", help="no GPU: versions and imports only")
    p.add_argument("--smoke", action="store_true", help="accepted for bench/gpu_suite.sh (same work)")
    p.add_argument("--out", default="bench/results", help="directory for env.json")
    a = p.parse_args(argv)
    if not a.cpu and not torch.cuda.is_available():
        p.error("no CUDA device visible (use --cpu)")
    import triton
    rec = dict(python=sys.version.split()[0], platform=platform.platform(), torch=torch.__version__,
               triton=triton.__version__, numpy=np.__version__, cuda=torch.version.cuda)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    save = lambda: atomic_write(out / "env.json", lambda tmp: tmp.write_text(json.dumps(rec, indent=1)), sync_dir=False)
    step = "the device query"
    try:   # env.json after each step, so a step that hangs (a peer's import, the first CUDA call) keeps the earlier ones
        if a.cpu:
            rec["device"] = "CPU"
        else:
            props = torch.cuda.get_device_properties(0)
            rec.update(device=props.name, sms=props.multi_processor_count, memory_gib=props.total_memory / 2**30,
                       capability=f"{props.major}.{props.minor}")
        save()
        step = "the peers' imports"
        show(rec)
        rec["peers"] = peer_status()
        save()
        show(rec, "peers")
        if not a.cpu:
            step = "the ceilings"
            t0 = time.perf_counter()
            rec.update(ceilings())
            rec["ceilings_s"] = time.perf_counter() - t0
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
