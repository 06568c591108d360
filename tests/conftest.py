"""Shared pytest setup. TRITON_INTERPRET must be set before any Triton kernel module is imported,
so it is set here, at collection time, before the tests import mamba3_lite."""
import os

try:
    import torch

    _has_cuda = torch.cuda.is_available()
except Exception:  # torch missing: the import errors will say so
    _has_cuda = False
if not _has_cuda:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_flush_denormal(True)


@pytest.fixture(autouse=True)
def _seed_everything():
    """Every test starts from the same RNG state."""
    import random

    import numpy as np

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield
