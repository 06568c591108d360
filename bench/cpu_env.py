"""What CPU a CPU benchmark ran on, for its results JSON: the model name, the vector instruction sets BLAS and
PyTorch's kernels can use (AVX2, AVX-512, AVX-512 BF16, AMX), the ISA PyTorch dispatches to, and the core counts.
CPU ratios move with these (the same 2-core benchmark has given different Mamba-3/GPT ratios on different x86 CPUs),
so every CPU result names its machine."""
import os
import platform
from pathlib import Path

import torch

from mamba3_lite.config import physical_cores

ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile")   # the /proc/cpuinfo flags that change the kernels' speed


def cpu_machine(cpuinfo: str = "/proc/cpuinfo") -> dict:
    "{'cpu_model', 'isa_flags', 'torch_cpu_capability', 'physical_cores', 'logical_cpus', 'torch'} of this machine."
    model, flags = platform.processor() or platform.machine(), set()
    try:
        lines = Path(cpuinfo).read_text().splitlines()
    except OSError:   # not Linux: the model from platform, no flags
        lines = []
    for key, _, value in (line.partition(":") for line in lines):
        if key.strip() == "model name":
            model = value.strip()
        elif key.strip() == "flags":
            flags = set(value.split())
    return {"cpu_model": model, "isa_flags": [f for f in ISA_FLAGS if f in flags],
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "physical_cores": physical_cores(), "logical_cpus": os.cpu_count(), "torch": torch.__version__}


if __name__ == "__main__":
    print(cpu_machine())
