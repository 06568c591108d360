"""The official Mamba-3 SISO Triton kernels as source files, from the mamba-ssm source archive on PyPI, without running
any of its code: the archive is found through the index's JSON listing, checked against a pinned sha256, and only the
regular files of `mamba_ssm/__init__.py` and `mamba_ssm/ops/**.py` are read out of it with `tarfile` (no member path
can escape the destination). `bench/ssd_traffic.py --official` runs the kernels from there (the printed folder on
PYTHONPATH); CI fetches them so that the count the README quotes is checked.

    python bench/official_source.py DEST     # prints DEST/mamba_ssm-2.3.2.post1, the folder to put on PYTHONPATH
"""
import hashlib
import io
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

from mamba3_lite.tokenizer import PYPI_SIMPLE, _index_listing

PROJECT, VERSION = "mamba-ssm", "2.3.2.post1"
ARCHIVE = f"mamba_ssm-{VERSION}.tar.gz"
ARCHIVE_SHA256 = "104cc47e9101e5401a675fa2b784f2952b9b037f3b1dd83b5ac544394e95d028"
SENTINEL = "mamba_ssm/ops/triton/mamba3/mamba3_siso_combined.py"   # the entry point bench/ssd_traffic.py imports


def wanted(name: str) -> bool:
    "Whether an archive member is one of the files the kernels need: the package's __init__.py and ops/**.py."
    parts = name.split("/")
    return (len(parts) >= 3 and parts[0] == f"mamba_ssm-{VERSION}" and parts[1] == "mamba_ssm" and ".." not in parts
            and name.endswith(".py") and (parts[2:] == ["__init__.py"] or parts[2] == "ops"))


def extract(data: bytes, dest: Path) -> Path:
    """The wanted members of the archive bytes `data` written under `dest`, all at once (into a temporary folder
    renamed into place, so an interrupted run leaves no partial tree); returns the folder holding `mamba_ssm/`."""
    if hashlib.sha256(data).hexdigest() != ARCHIVE_SHA256:
        raise ValueError(f"{ARCHIVE}: sha256 {hashlib.sha256(data).hexdigest()}, expected {ARCHIVE_SHA256}; nothing extracted")
    dest.mkdir(parents=True, exist_ok=True)
    root = dest / f"mamba_ssm-{VERSION}"
    with tempfile.TemporaryDirectory(dir=dest) as tmp, tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for m in (m for m in tar.getmembers() if m.isfile() and wanted(m.name)):
            out = Path(tmp) / m.name
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(tar.extractfile(m).read())
        if not (Path(tmp) / root.name / SENTINEL).is_file():
            raise ValueError(f"{ARCHIVE}: has no {SENTINEL}")
        if root.exists(): shutil.rmtree(root)          # a tree without the entry point (an older partial one)
        os.replace(Path(tmp) / root.name, root)
    return root


def fetch(dest, index_url: str = PYPI_SIMPLE, timeout: float = 60) -> Path:
    "Download the pinned archive from `index_url` and `extract` it under `dest` (kept if already there)."
    dest = Path(dest)
    root = dest / f"mamba_ssm-{VERSION}"
    if (root / SENTINEL).is_file():
        return root
    page = urllib.parse.urljoin(index_url.rstrip("/") + "/", f"{PROJECT}/")
    listing = _index_listing(page, timeout)             # the index's PEP 691 JSON, as the GPT-2 ranks are found
    entry = next((f for f in listing.get("files", []) if isinstance(f, dict) and f.get("filename") == ARCHIVE), None)
    if entry is None:
        raise ValueError(f"{page} does not list {ARCHIVE}")
    with urllib.request.urlopen(urllib.parse.urljoin(page, entry["url"]), timeout=timeout) as r:
        data = r.read()
    return extract(data, dest)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    try:
        print(fetch(sys.argv[1]))
    except (OSError, ValueError) as e:
        sys.exit(f"official_source: {type(e).__name__}: {e}")
