"""bench/gpu_suite.sh and its helpers without a GPU: usage errors, the budget (a section that does not fit is skipped,
one that overruns its cap is stopped with SIGINT and keeps what it wrote), at most three result files, the report,
the peers' autotune limit, the official kernel's import without mamba_ssm's __init__, and the `#| gpu` cell runner."""
import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "bench" / "gpu_suite.sh"


def load_bench(name):
    "A bench/ script as a module (bench/ is not a package)."
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def suite(tmp_path, *args, **env):
    "Run the suite with OUT in tmp_path, no peers; returns (CompletedProcess, OUT)."
    out = tmp_path / "out"
    e = dict(os.environ, OUT=str(out), PEERS_DIR=str(tmp_path / "no_peers"), PYTHON=sys.executable,
             OMP_NUM_THREADS="1", **env)
    r = subprocess.run(["bash", str(SUITE), *args], cwd=ROOT, env=e, capture_output=True, text=True, timeout=600)
    return r, out


@pytest.mark.parametrize("args, env, says", [
    (["--bogus"], {}, "unknown argument '--bogus'"),
    (["--cpu"], {}, "--cpu is a harness check and needs --smoke"),
    (["--smoke", "--cpu", "--budget", "10"], {}, "--budget: expected whole seconds >= 60"),
    (["--smoke", "--cpu", "--section", "env,nope"], {}, "--section: unknown section 'nope'"),
    (["--smoke", "--cpu"], {"SUITE_CAP_model": "1.5"}, "SUITE_CAP_model: expected whole seconds"),
])
def test_usage_errors(tmp_path, args, env, says):
    r, out = suite(tmp_path, *args, **env)
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not out.exists()


def test_budget_skips_what_does_not_fit(tmp_path):
    "60 s budget: env runs, e2e_smoke (needs >= 60 s) is skipped for the budget; three files, exit 0."
    r, out = suite(tmp_path, "--smoke", "--cpu", "--budget", "60", "--section", "e2e_smoke")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["logs.tgz", "results.json", "summary.md"]
    sections = json.loads((out / "results.json").read_text())["sections"]
    assert list(sections) == ["env", "e2e_smoke"]
    assert sections["env"]["status"] == "ok" and sections["env"]["results"]["env.json"]["device"] == "CPU"
    assert sections["e2e_smoke"]["status"] == "skipped" and sections["e2e_smoke"]["note"].startswith("budget:")
    assert "| e2e_smoke | skipped |" in (out / "summary.md").read_text()


HOLD_AT_CHECK_3 = """
import builtins, time
_print = builtins.print
def _held_print(*args, **kw):
    _print(*args, **kw)
    if args and str(args[0]).startswith("--- [3]"):
        time.sleep(600)          # the section's cap interrupts this: a check that outlives its cap, every time
builtins.print = _held_print
"""


def test_cut_section_keeps_its_partial_result(tmp_path):
    "A section past its cap gets SIGINT: status 'cut', the JSON its script wrote on the way out is in results.json."
    hold = tmp_path / "hold"; hold.mkdir()
    (hold / "sitecustomize.py").write_text(HOLD_AT_CHECK_3)    # the smoke stalls at check 3, however fast the machine
    r, out = suite(tmp_path, "--smoke", "--cpu", "--section", "e2e_smoke", SUITE_CAP_e2e_smoke="12",
                   PYTHONPATH=str(hold) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    assert r.returncode == 1, r.stdout[-2000:]
    sections = json.loads((out / "results.json").read_text())["sections"]
    e2e = sections["e2e_smoke"]
    assert e2e["status"] == "cut" and e2e["rc"] == "124" and int(e2e["seconds"]) <= 12 + 10 + 2, e2e
    smoke = e2e["results"]["e2e_gpu_smoke.json"]
    assert smoke["ok"] is False and len(smoke["checks"]) < 6, smoke
    assert len(list(out.iterdir())) == 3


def test_report_renders_status_and_unreadable_json(tmp_path):
    rep = load_bench("suite_report")
    work = tmp_path / "work"
    (work / "model").mkdir(parents=True)
    (work / "status.tsv").write_text("model\tFAILED\t1\t12\t60\tsee model.log\nenv\tskipped\t\t0\t0\tGPU only\n")
    (work / "model" / "model_gpu.jsonl").write_text(json.dumps(dict(preset="a100-400m", batch=16, seq_len=2048,
                                                                    grad_checkpoint=False, error="out of memory: x")) + "\n")
    (work / "model" / "broken.json").write_text("{not json")
    (work / "model.log").write_text("line\n" * 30 + "Traceback: boom\n")
    assert rep.main([str(work), str(tmp_path / "out"), "title"]) == 0
    res = json.loads((tmp_path / "out" / "results.json").read_text())["sections"]
    assert res["model"]["results"]["broken.json"].startswith("unreadable: JSONDecodeError")
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "| model | FAILED | 1 | 12 | 60 | see model.log |" in md
    assert "| a100-400m | 16x2048 | False |" in md and "out of memory: x" in md
    assert "Traceback: boom" in md                       # a failed section's log tail is shown
    assert "## env" not in md                            # a skipped section with nothing written gets no block


def test_limit_autotune_keeps_the_preferred_configs():
    import triton
    sk = load_bench("ssd_kernel")
    cfgs = [triton.Config({"B": b}, num_warps=w, num_stages=s) for b in (32, 64) for w in (2, 4, 8) for s in (1, 2, 3)]

    @triton.autotune(configs=cfgs, key=["n"])
    @triton.jit
    def k(x_ptr, n):
        pass

    mod = types.ModuleType("fake_peer")
    mod.k = k
    assert sk.limit_autotune([mod], 2) == (18, 2)
    assert [(c.kwargs["B"], c.num_warps, c.num_stages) for c in k.configs] == [(32, 4, 2), (64, 4, 2)]
    assert sk.limit_autotune([mod], 0) == (2, 2)          # 0 keeps what is there


def test_official_loader_bypasses_the_package_init(tmp_path, monkeypatch):
    "mamba_ssm/__init__.py fails like the CUDA-less wheel's; the loader still reaches ops/triton/mamba3."
    sk = load_bench("ssd_kernel")
    pkg = tmp_path / "mamba_ssm"
    kernel_dir = pkg / "ops" / "triton" / "mamba3"
    kernel_dir.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('selective_scan_cuda is missing')\n")
    for d in (pkg / "ops", pkg / "ops" / "triton", kernel_dir):
        (d / "__init__.py").write_text("")
    (kernel_dir / "mamba3_siso_combined.py").write_text("def mamba3_siso_combined(*a, **k):\n    return 'official'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "mamba_ssm" or m.startswith("mamba_ssm.")]:
        monkeypatch.delitem(sys.modules, name)
    fn, note = sk.load_official(2)
    assert fn() == "official" and note == "official: ok, autotune configs 0 of 0"
    for name in [m for m in sys.modules if m == "mamba_ssm" or m.startswith("mamba_ssm.")]:
        monkeypatch.delitem(sys.modules, name)


def test_official_loader_says_why_when_missing(monkeypatch):
    sk = load_bench("ssd_kernel")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert sk.load_official(2).startswith("mamba_ssm unavailable: not installed")


def notebook(path, cells):
    path.write_text(json.dumps(dict(cells=[dict(cell_type="code", source=s, metadata={}, outputs=[]) for s in cells],
                                    metadata={}, nbformat=4, nbformat_minor=5)))
    return path


def test_gpu_cells_selects_like_nbdev_test(tmp_path):
    gc = load_bench("gpu_cells")
    nb = notebook(tmp_path / "a.ipynb", ["x = 1", "#| gpu\nx += 10", "#| slow\nx += 100", "#| eval: false\nx = None",
                                          "#|hide\nassert x in (1, 11)"])
    assert [i for i, _ in gc.cells_to_run(nb, {"gpu"})] == [0, 1, 4]
    assert [i for i, _ in gc.cells_to_run(nb, set())] == [0, 4]
    assert [i for i, _ in gc.cells_to_run(nb, {"gpu", "slow"})] == [0, 1, 2, 4]
    assert gc.has_gpu_cells(nb)


def test_gpu_cells_runs_and_names_the_failing_cell(tmp_path):
    ok = notebook(tmp_path / "ok.ipynb", ["from IPython.display import display\nx = 2", "#| gpu\nassert x == 2\ndisplay(x)"])
    bad = notebook(tmp_path / "bad.ipynb", ["x = 2", "#| gpu\nassert x == 3, 'x is not 3'"])
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_cells.py"), str(ok), str(bad), "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "ok     ok.ipynb" in r.stdout and "FAILED bad.ipynb" in r.stdout and "bad.ipynb cell 1" in r.stdout
    assert "x is not 3" in r.stdout and "1/2 notebooks passed" in r.stdout
    res = json.loads((tmp_path / "gpu_cells.json").read_text())["results"]
    assert [x["ok"] for x in res] == [True, False]


def test_gpu_cells_without_ipython(tmp_path):
    "IPython missing (an `IPython` that fails to import): the stand-in display runs, and matplotlib still makes figures."
    (tmp_path / "block").mkdir()
    (tmp_path / "block" / "IPython.py").write_text("raise ImportError('no IPython here')\n")
    nb = notebook(tmp_path / "fig.ipynb", ["import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt",
                                           "from IPython.display import Image, display\nfig = plt.figure()\n"
                                           "display(Image(filename='x.png'))\nassert fig is not None"])
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "block"))
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_cells.py"), str(nb), "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    log = json.loads((tmp_path / "gpu_cells.json").read_text())["results"][0]["log_tail"]
    assert "IPython not installed; IPython.display replaced by a stand-in" in log and "<Image x.png>" in log, log


def test_e2e_data_check_on_synthetic_shards(tmp_path):
    "Without GPT-2 ranks the e2e smoke's data check writes synthetic shards with a manifest, and they load."
    env = {k: v for k, v in os.environ.items() if k != "MAMBA3_LITE_GPT2_RANKS"}
    env.update(TIKTOKEN_CACHE_DIR=str(tmp_path / "empty_cache"), OMP_NUM_THREADS="1")
    out = tmp_path / "e2e.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "e2e_gpu_smoke.py"), "--cpu", "--threads", "1", "--checks", "2",
                        "--out", str(out)], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["ok"] and res["meta"]["corpus"]["kind"].startswith("synthetic"), res["meta"]["corpus"]
