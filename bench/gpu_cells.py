"""Run the notebooks' `#| gpu` test cells on a GPU machine that has no nbdev: what `nbdev_test --flags gpu` does, for
the notebooks that have such cells, with nothing but fastcore (carried in bench/peers/).

Each notebook runs in a subprocess of its own, from nbs/, every code cell in order in one namespace, as nbdev_test
runs it: cells marked with a flag that is not enabled (`#| slow` unless --flags slow) and `#| eval: false` cells are
left out; `#| gpu` cells run. Exit status 1 if any notebook fails; --out DIR writes gpu_cells.json, rewritten after
each notebook (on SIGINT with the notebook it stopped, failed, and `interrupted`).

    python bench/gpu_cells.py                          # every notebook with a `#| gpu` cell
    python bench/gpu_cells.py nbs/01_ssd_triton.ipynb  # just these
    python bench/gpu_cells.py --list                   # which notebooks / cells would run

IPython is not needed: if it does not import, `IPython.display` is replaced by a stand-in whose `display` prints
and whose `Image` only records its file (a notebook that shows a figure still runs; one line says so).
"""
import argparse
import json
import re
import subprocess
import sys
import time
import traceback
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # this checkout's mamba3_lite, installed or not
from mamba3_lite.files import atomic_write  # noqa: E402
TEST_FLAGS = ("slow", "gpu")   # settings.ini tst_flags
DIRECTIVE = re.compile(r"^\s*#\|\s*([\w-]+)\s*:?\s*(.*)$")


def directives(src: str) -> dict:
    "The cell's leading `#| name: value` lines as {name: value} (nbdev's syntax)."
    out = {}
    for line in src.splitlines():
        m = DIRECTIVE.match(line)
        if not m:
            if line.strip():
                break
            continue
        out[m.group(1)] = m.group(2).strip()
    return out


def cells_to_run(nb_path: Path, flags):
    "[(index, source)] of the code cells nbdev_test would run with `flags` enabled."
    cells = json.loads(nb_path.read_text())["cells"]
    run = []
    for i, c in enumerate(cells):
        if c["cell_type"] != "code":
            continue
        src = "".join(c["source"])
        d = directives(src)
        if d.get("eval", "").lower() == "false" or any(f in d and f not in flags for f in TEST_FLAGS):
            continue
        run.append((i, src))
    return run


def has_gpu_cells(nb_path: Path) -> bool:
    return any(c["cell_type"] == "code" and "gpu" in directives("".join(c["source"]))
               for c in json.loads(nb_path.read_text())["cells"])


def ipython_stand_in():
    "sys.modules['IPython.display'] stand-in when IPython is missing (display prints; Image keeps its filename)."
    try:
        import IPython.display  # noqa: F401
        return
    except ImportError:
        pass
    print("gpu_cells.py: IPython not installed; IPython.display replaced by a stand-in (figures are not shown)", flush=True)
    pkg, disp = types.ModuleType("IPython"), types.ModuleType("IPython.display")
    disp.display = lambda *objs, **kw: [print(repr(o)) for o in objs] and None
    disp.Image = type("Image", (), {"__init__": lambda self, filename=None, **kw: setattr(self, "filename", filename),
                                    "__repr__": lambda self: f"<Image {self.filename}>"})
    pkg.display = disp
    pkg.version_info = (8, 24, 0, "stand-in")   # matplotlib leaves an IPython >= 8.24 alone (no backend hooks)
    pkg.get_ipython = lambda: None              # and, finding no shell, installs no display hook
    sys.modules.update({"IPython": pkg, "IPython.display": disp})


def run_one(nb_path: Path, flags) -> int:
    "Execute one notebook's cells in this process; print the failing cell and its traceback."
    ipython_stand_in()
    ns = {"__name__": "__main__"}
    for i, src in cells_to_run(nb_path, flags):
        try:
            exec(compile(src, f"{nb_path.name}[cell {i}]", "exec"), ns)
        except Exception:
            print(f"FAILED {nb_path.name} cell {i}:\n{src[:600]}\n{traceback.format_exc()}", flush=True)
            return 1
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("notebooks", nargs="*", help="notebooks to run (default: every nbs/*.ipynb with a `#| gpu` cell)")
    p.add_argument("--flags", default="gpu", help="comma-separated test flags to enable (default: gpu)")
    p.add_argument("--list", action="store_true", help="print the notebooks and cell numbers that would run")
    p.add_argument("--timeout", type=float, default=300, help="seconds per notebook")
    p.add_argument("--out", default=None, help="directory for gpu_cells.json")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)   # the subprocess: run this notebook here
    a = p.parse_args(argv)
    flags = {f for f in a.flags.split(",") if f}
    if bad := flags - set(TEST_FLAGS):
        p.error(f"--flags: unknown {sorted(bad)}; settings.ini tst_flags are {list(TEST_FLAGS)}")
    if a.one:
        return run_one(Path(a.one).resolve(), flags)
    nbs = [Path(n).resolve() for n in a.notebooks] or [n for n in sorted((ROOT / "nbs").glob("*.ipynb")) if has_gpu_cells(n)]
    if missing := [str(n) for n in nbs if not n.exists()]:
        p.error(f"notebooks not found: {missing}")
    if a.list:
        for nb in nbs:
            print(nb.name, [i for i, _ in cells_to_run(nb, flags)])
        return 0
    results = []
    rec = dict(flags=sorted(flags), notebooks=[nb.name for nb in nbs], results=results, interrupted=None)

    def save():
        "Rewrite gpu_cells.json with the notebooks finished so far (after each one, and on SIGINT)."
        if a.out:
            atomic_write(Path(a.out) / "gpu_cells.json", lambda tmp: tmp.write_text(json.dumps(rec, indent=1)),
                         sync_dir=False)

    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
    save()
    current = None
    try:
        for nb in nbs:
            t0, current = time.perf_counter(), nb.name
            try:
                r = subprocess.run([sys.executable, __file__, "--one", str(nb), "--flags", ",".join(sorted(flags))],
                                   cwd=nb.parent, capture_output=True, text=True, timeout=a.timeout)
                ok, log = r.returncode == 0, r.stdout + r.stderr
            except subprocess.TimeoutExpired as e:
                ok, log = False, f"timed out after {a.timeout:.0f}s\n{e.stdout or ''}"
            results.append(dict(notebook=nb.name, ok=ok, seconds=round(time.perf_counter() - t0, 1), log_tail=log[-3000:]))
            current = None
            save()
            print(f"{'ok    ' if ok else 'FAILED'} {nb.name} ({results[-1]['seconds']}s)", flush=True)
            if not ok:
                print(log[-3000:], flush=True)
    except KeyboardInterrupt:   # SIGINT (the suite's cap): the notebooks done stay; the one it stopped is kept, failed
        rec["interrupted"] = f"interrupted (SIGINT) after {len(results)} of {len(nbs)} notebooks" + \
            (f", during {current}" if current else "")
        if current:
            results.append(dict(notebook=current, ok=False, seconds=round(time.perf_counter() - t0, 1),
                                log_tail=rec["interrupted"]))
        save()
        print(f"gpu_cells.py: {rec['interrupted']}", flush=True)
        return 130
    print(f"{sum(r['ok'] for r in results)}/{len(results)} notebooks passed with flags {sorted(flags)}")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    import sigint_once
    sigint_once.install()
    sys.exit(main())
