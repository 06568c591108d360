"""The package as it was at an earlier git revision, importable beside this tree's, so that a benchmark can time a
change before and after in one run: `mamba3_lite/` at REV is `git archive`d into a directory and imported as the
package `mamba3_lite_base` (its modules import each other relatively, so the two copies do not mix)."""
import importlib
import io
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def extract(rev: str, into) -> Path:
    "Write mamba3_lite/ at git revision `rev` to `into`/mamba3_lite_base; return `into`."
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "mamba3_lite"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(into, filter="data")
    (Path(into) / "mamba3_lite").rename(Path(into) / "mamba3_lite_base")
    return Path(into)


def module(into, name: str):
    "Import `mamba3_lite_base.<name>` from a directory `extract` wrote."
    if str(into) not in sys.path: sys.path.insert(0, str(into))
    return importlib.import_module(f"mamba3_lite_base.{name}")
