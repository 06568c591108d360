"""A non-editable install works outside a clone: build the wheel, install it into a fresh venv, run the
console script from an empty directory (the packaged configs are found through importlib.resources). An editable
install finds them too, whatever build tools the environment holds."""
import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from test_cli import _python_corpus, needs_ranks

REPO = Path(__file__).resolve().parent.parent


def build_wheel(dest: Path) -> Path:
    "The project's wheel, built from this tree without build isolation (setuptools and wheel come from this venv)."
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dest), str(REPO)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = dest.glob("mamba3_lite-*.whl")
    return wheel


def fresh_venv(root: Path) -> Path:
    """A new venv whose own site-packages comes first and that sees this venv's site-packages after it (one .pth
    line), so torch & co. need no second download; `.pth` files in that second directory (this checkout's editable
    finder) are not processed, so `mamba3_lite` can only come from the wheel. Returns its python."""
    venv.create(root, with_pip=False)
    py = root / "bin" / "python"
    site = Path(subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip())
    (site / "deps_from_dev_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return py


def test_wheel_ships_the_configs(tmp_path):
    names = zipfile.ZipFile(build_wheel(tmp_path)).namelist()
    assert {"mamba3_lite/configs/tiny_cpu.yaml", "mamba3_lite/configs/pretrain_a100_400m.yaml"} <= set(names), names


@needs_ranks
def test_quickstart_from_a_wheel_in_an_empty_directory(tmp_path):
    wheel = build_wheel(tmp_path / "dist")
    py = fresh_venv(tmp_path / "venv")
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index", str(wheel)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    empty = tmp_path / "empty"; empty.mkdir()
    where = subprocess.check_output([str(py), "-c", "import mamba3_lite; print(mamba3_lite.__file__)"], cwd=empty, text=True)
    assert str(tmp_path / "venv") in where, where                       # the installed copy, not this checkout
    data = _python_corpus(tmp_path / "texts")                           # a small corpus keeps the run to seconds
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([str(py.parent / "mamba3-lite"), "quickstart", "--max-steps", "2", "--data-path", str(data), "--include", "*.py",
                        "--val-tokens", "4096", "--max-new-tokens", "4"], cwd=empty, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert "[quickstart] validation loss" in r.stdout
    assert list(empty.rglob("meta_step_2.json"))                         # the run landed in the empty directory


def test_an_editable_install_finds_the_configs_where_wheel_is_installed(tmp_path):
    """Without a pyproject.toml, pip installs a project editable with the legacy `setup.py develop` wherever
    setuptools and wheel are both importable, and an older setuptools (65.5) then puts the checkout on sys.path, where
    `mamba3_lite/configs` does not exist (the configs live at the top-level configs/). pyproject.toml's build system
    keeps pip on the standard editable install (PEP 660), which maps `mamba3_lite.configs` to configs/. Here: a venv
    seeded by ensurepip (Python 3.11: pip 23.2, setuptools 65.5) plus wheel from the package index; skipped where
    ensurepip seeds no setuptools (Python >= 3.12), as that venv cannot take the legacy path."""
    root = tmp_path / "venv"
    venv.create(root, with_pip=True)
    py = root / "bin" / "python"
    if subprocess.run([str(py), "-c", "import setuptools"], capture_output=True).returncode != 0:
        pytest.skip("ensurepip seeds no setuptools from Python 3.12 on: pip then always builds through PEP 517")
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "wheel"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"pip install wheel (from the package index): {r.stderr[-2000:]}"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-build-isolation", "-e", str(REPO)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    tools = subprocess.check_output([str(py), "-c", "from importlib.metadata import version as v; print('pip', v('pip'), 'setuptools', v('setuptools'))"], text=True)
    empty = tmp_path / "empty"; empty.mkdir()
    r = subprocess.run([str(py), "-c", "import importlib.resources as res; "
                        "print(sorted(p.name for p in res.files('mamba3_lite.configs').iterdir() if p.name.endswith('.yaml')))"],
                       cwd=empty, capture_output=True, text=True, timeout=120)
    print(tools.strip(), "->", r.stdout.strip() or r.stderr.strip().splitlines()[-1])
    assert r.returncode == 0 and "tiny_cpu.yaml" in r.stdout, r.stderr[-2000:]


def test_a_checkout_imported_without_installing_finds_the_configs(tmp_path):
    """The GPU benchmark suite runs from a copy of the tree with its root on sys.path and nothing installed: there is
    no `mamba3_lite.configs` package, so the packaged configs are read from the checkout's configs/. A venv that sees
    this venv's packages but not its editable install of the checkout, the checkout's root on PYTHONPATH."""
    py = fresh_venv(tmp_path / "venv")
    empty = tmp_path / "empty"; empty.mkdir()
    r = subprocess.run([str(py), "-c", "import importlib.util, mamba3_lite.config as c; "
                        "print(importlib.util.find_spec('mamba3_lite.configs'), c.packaged_configs(), c.load_config('tiny_cpu').model['preset'])"],
                       cwd=empty, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300)
    print(r.stdout.strip() or r.stderr.strip().splitlines()[-1])
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[0] == "None" and "['pretrain_a100_400m', 'tiny_cpu'] tiny" in r.stdout, r.stdout
