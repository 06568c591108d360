"""The GPU model behind every *modelled* time in bench/: a launch takes the longest of its memory time, its math time
and its latency chain,

    t = max(bytes / bandwidth, dot FLOPs / tensor peak + other FLOPs / fp32 peak, waves x serial steps x STEP_S),
    waves = ceil(programs / SMs),

with the bytes, FLOPs, programs and serial steps (loop trips a program runs one after another) counted under the
Triton interpreter (`bench/ssd_traffic.py`), never assumed. A launch runs one program per SM at a time in this model:
the heavy SSD kernels on both sides hold about 200 or more registers a thread at 8 warps, which leaves room for one
CTA per SM; for light kernels it overstates the latency term. Kernel launch overheads are left out (CUDA graphs and
back-to-back launches hide most of them). The numbers are the vendors' dense peaks, which real kernels do not reach:
a modelled time is a floor to compare designs by, not a prediction of a measured one.
"""
import math

STEP_S = 0.5e-6
STEP_WHY = ("a serial step waits on at least one dependent global-memory round trip, about 0.5 us on A100 and H100 "
            "(pointer-chasing measurements, e.g. chipsandcheese.com/2023/07/02/nvidias-h100-funny-l2-and-tons-of-bandwidth)")

# HBM bandwidth B/s, dense bf16 tensor-core FLOP/s, fp32 (non-tensor) FLOP/s, SMs: the vendors' datasheets
GPUS = {
    "A100-80GB": dict(bandwidth=2.039e12, tensor=312e12, fp32=19.5e12, sms=108, arch=80),
    "H100-SXM": dict(bandwidth=3.35e12, tensor=989e12, fp32=67e12, sms=132, arch=90),
    "H200": dict(bandwidth=4.8e12, tensor=989e12, fp32=67e12, sms=132, arch=90),
}


def waves(programs, gpu):
    "Rounds of one program per SM that `programs` programs take on `gpu` (a GPUS key)."
    return math.ceil(programs / GPUS[gpu]["sms"]) if programs else 0


def modelled_us(gpu, bytes=0, dot_flops=0, flops=0, programs=0, serial_steps=0):
    """Modelled µs of one launch on `gpu`: max of the memory, math and latency terms (module docstring); `serial_steps`
    the loop trips of one program (the largest where they differ)."""
    g = GPUS[gpu]
    terms = (bytes / g["bandwidth"], dot_flops / g["tensor"] + flops / g["fp32"],
             waves(programs, gpu) * serial_steps * STEP_S)
    return 1e6 * max(terms)


def bound(gpu, bytes=0, dot_flops=0, flops=0, programs=0, serial_steps=0):
    "Which term of `modelled_us` is the largest: 'memory', 'math' or 'latency'."
    g = GPUS[gpu]
    terms = dict(memory=bytes / g["bandwidth"], math=dot_flops / g["tensor"] + flops / g["fp32"],
                 latency=waves(programs, gpu) * serial_steps * STEP_S)
    return max(terms, key=terms.get)


def gpu_from_name(device_name):
    """The `GPUS` key of the GPU that `torch.cuda.get_device_name()` calls `device_name`, or None when the table does not
    hold that card: the PCIe and NVL boards, the 40 GB A100 and the H100 PCIe differ in bandwidth or peak from the SXM
    parts listed. 'NVIDIA A100-SXM4-80GB' -> 'A100-80GB', 'NVIDIA H100 80GB HBM3' -> 'H100-SXM', 'NVIDIA H200' -> 'H200'."""
    name = (device_name or "").upper()
    if "PCIE" in name or "NVL" in name:
        return None
    if "A100" in name and "SXM" in name and "80GB" in name:
        return "A100-80GB"
    if "H100" in name and ("HBM3" in name or "SXM" in name):
        return "H100-SXM"
    if "H200" in name:
        return "H200"
    return None
