"""bench/gpu_suite.sh and its helpers without a GPU: usage errors, the budget (a section that does not fit is skipped,
one that overruns its cap is stopped with SIGINT and keeps what it wrote), at most three result files, the report,
the peers' autotune limit, the official kernel's import without mamba_ssm's __init__, and the `#| gpu` cell runner."""
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "bench" / "gpu_suite.sh"


def load_bench(name):
    "A bench/ script as a module (bench/ is not a package; on sys.path, as for `python bench/X.py`, for its helpers)."
    if str(ROOT / "bench") not in sys.path: sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def suite(tmp_path, *args, **env):
    "Run the suite with OUT in tmp_path, no peers; returns (CompletedProcess, OUT)."
    out = tmp_path / "out"
    e = dict(os.environ, OUT=str(out), PEERS_DIR=str(tmp_path / "no_peers"), PYTHON=sys.executable, OMP_NUM_THREADS="1")
    e.update(env)
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
    "75 s budget: env runs (its cap: 75 - 15 s), e2e_smoke (needs >= 60 s) is skipped for the budget; three files, exit 0."
    r, out = suite(tmp_path, "--smoke", "--cpu", "--budget", "75", "--section", "e2e_smoke")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["logs.tgz", "results.json", "summary.md"]
    sections = json.loads((out / "results.json").read_text())["sections"]
    assert list(sections) == ["env", "e2e_smoke"]
    assert sections["env"]["status"] == "ok" and sections["env"]["results"]["env.json"]["device"] == "CPU"
    assert sections["e2e_smoke"]["status"] == "skipped" and sections["e2e_smoke"]["note"].startswith("budget:")
    summary = (out / "summary.md").read_text()
    assert "| e2e_smoke | skipped |" in summary
    rerun = "rerun what did not pass: bash bench/gpu_suite.sh --budget 915 --section e2e_smoke --smoke --cpu"   # 900 + 15
    assert rerun in r.stdout and rerun in summary


STALL_HOOK = """
import builtins, os, time
_print, _after = builtins.print, os.environ.get("STALL_AFTER")
def _stalling_print(*args, **kw):
    _print(*args, **kw)
    if _after and args and str(args[0]).strip().startswith(_after):
        _print("STALLED", flush=True)
        time.sleep(600)          # the cap interrupts this: a step that outlives its cap, however fast the machine
builtins.print = _stalling_print
"""


def stall_env(tmp_path, marker, **env):
    "Environment whose Python processes stall after printing a line that starts with `marker` (a sitecustomize)."
    hook = tmp_path / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(STALL_HOOK)
    return dict(os.environ, PYTHONPATH=str(hook) + os.pathsep + os.environ.get("PYTHONPATH", ""), STALL_AFTER=marker,
                PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **env)


def test_cut_section_keeps_its_partial_result(tmp_path):
    "A section past its cap gets SIGINT: status 'cut', the JSON its script wrote on the way out is in results.json."
    r, out = suite(tmp_path, "--smoke", "--cpu", "--section", "e2e_smoke", SUITE_CAP_e2e_smoke="12",
                   **{k: v for k, v in stall_env(tmp_path, "--- [3]").items() if k in ("PYTHONPATH", "STALL_AFTER")})
    assert r.returncode == 1, r.stdout[-2000:]
    sections = json.loads((out / "results.json").read_text())["sections"]
    e2e = sections["e2e_smoke"]
    assert e2e["status"] == "cut" and e2e["rc"] == "124" and int(e2e["seconds"]) <= 12 + 10 + 2, e2e
    smoke = e2e["results"]["e2e_gpu_smoke.json"]
    assert smoke["ok"] is False and len(smoke["checks"]) < 6, smoke
    assert len(list(out.iterdir())) == 3


def cut_at(tmp_path, marker, args, result, drop=()):
    """Run bench/ARGS under `timeout -s INT -k 10 300` (as the suite does) until it prints a line starting with
    `marker`, read `result` (its JSON as it stands then), then send `timeout` SIGALRM, which it takes as its cap
    arriving now: it sends the script SIGINT. Returns (rc, output, `result`'s text at the stall and after the cut)."""
    env = {k: v for k, v in stall_env(tmp_path, marker, TIKTOKEN_CACHE_DIR=str(tmp_path / "empty_cache")).items()
           if k not in drop}
    p = subprocess.Popen(["timeout", "-s", "INT", "-k", "10", "300", sys.executable, *args], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen, at_stall = [], None
    for line in p.stdout:
        seen.append(line)
        if line.startswith("STALLED"):
            at_stall = result.read_text() if result.exists() else None
            p.send_signal(signal.SIGALRM)
            break
    seen.append(p.communicate(timeout=120)[0])
    out = "".join(seen)[-3000:]
    assert at_stall is not None, f"{result.name} not written when the script reached {marker!r}:\n{out}"
    return p.returncode, out, at_stall, result.read_text()


def test_train_step_cut_in_compile_keeps_the_eager_row(tmp_path):
    "train_gpu.py measures eager first; SIGINT in the compiled warm-up (its compile) leaves the eager row whole."
    f = tmp_path / "train_gpu.json"
    rc, out, before, after = cut_at(tmp_path, "compiled: warm-up", [
        "bench/train_gpu.py", "--cpu", "--steps", "1", "--warmup", "1", "--modes", "eager,compiled", "--out", str(tmp_path)], f)
    assert rc == 124, out
    before, after = json.loads(before), json.loads(after)
    assert [r["mode"] for r in before["rows"]] == ["eager", "compiled"] and before["rows"][0]["status"] == "ok"
    eager, compiled = after["rows"]
    assert eager["status"] == "ok" and eager["steps_done"] == 1 and eager["tokens_per_s"] > 0, eager
    assert compiled["status"] == "interrupted (SIGINT) during compiled warm-up" == after["interrupted"], compiled
    assert compiled["steps_done"] == 0 and "tokens_per_s" not in compiled


def test_model_bench_cut_keeps_its_steps(tmp_path):
    "model_gpu.py's JSONL line is rewritten after each step; SIGINT leaves it with the steps reached (earlier lines kept)."
    f = tmp_path / "model_gpu.jsonl"
    f.write_text('{"bench": "model_gpu", "status": "ok", "earlier": true}\n')
    rc, out, before, after = cut_at(tmp_path, "step 1/2", [
        "bench/model_gpu.py", "--device", "cpu", "--preset", "tiny", "--batch", "2", "--seq-len", "32", "--steps", "2",
        "--warmup", "0", "--peak-tflops", "1", "--dtype", "fp32", "--json", str(f)], f)
    assert rc == 124, out
    (_, before), (first, line) = [[json.loads(x) for x in t.splitlines()] for t in (before, after)]
    assert before["status"] == "timed steps" and before["steps_done"] == 1, before
    assert first["earlier"] and line["status"] == "interrupted (SIGINT) during timed steps", line
    assert line["steps_done"] == 1 and line["ms_per_step"] > 0, line


def test_env_cut_keeps_the_versions(tmp_path):
    "gpu_env.py writes env.json before the peers' imports; SIGINT there keeps the versions and says where it stopped."
    f = tmp_path / "env.json"
    rc, out, before, after = cut_at(tmp_path, "device:", ["bench/gpu_env.py", "--cpu", "--out", str(tmp_path)], f)
    assert rc == 124, out
    before, after = json.loads(before), json.loads(after)
    assert before["device"] == "CPU" and before["torch"] and "peers" not in before, before
    assert after["interrupted"] == "interrupted (SIGINT) during the peers' imports" and after["numpy"], after


def test_doc_reset_cut_leaves_its_json(tmp_path):
    "doc_reset_cpu.py --json: the row (configuration, status) exists before the timing; SIGINT marks it interrupted."
    f = tmp_path / "doc_reset.json"
    rc, out, before, after = cut_at(tmp_path, "timing fwd+bwd", [
        "bench/doc_reset_cpu.py", "--throughput-only", "--cpu", "--smoke", "--json", str(f)], f)
    assert rc == 124, out
    before, after = json.loads(before), json.loads(after)
    assert before["status"] == "timing" and before["batch"] > 0 and before["reps"] == 2, before
    assert after["status"] == "interrupted (SIGINT) during timing", after


def test_gpu_cells_cut_keeps_the_notebooks_done(tmp_path):
    "gpu_cells.json is rewritten after each notebook; SIGINT after the first keeps it and says how far it got."
    a = notebook(tmp_path / "a.ipynb", ["x = 1", "#| gpu\nassert x == 1"])
    b = notebook(tmp_path / "b.ipynb", ["y = 2"])
    f = tmp_path / "gpu_cells.json"
    rc, out, before, after = cut_at(tmp_path, "ok     a.ipynb", ["bench/gpu_cells.py", str(a), str(b), "--out", str(tmp_path)], f)
    assert rc == 124, out
    before, after = json.loads(before), json.loads(after)
    assert [(r["notebook"], r["ok"]) for r in before["results"]] == [("a.ipynb", True)], before
    assert [r["notebook"] for r in after["results"]] == ["a.ipynb"], after
    assert after["interrupted"] == "interrupted (SIGINT) after 1 of 2 notebooks", after
FAKE_SSD_KERNEL = """#!/usr/bin/env bash
# bench/ssd_kernel.py stands in for itself: --part gate exits $GATE_RC, --part time exits 0, each writes a JSON naming
# its part; bench/gpu_env.py exits 0 at once; anything else (the report) runs in the real python.
[[ "$1" == bench/gpu_env.py ]] && exit 0
if [[ "$1" == bench/ssd_kernel.py ]]; then
  while (( $# )); do case "$1" in --part) part=$2; shift ;; --out) out=$2; shift ;; esac; shift; done
  echo "{\\"part\\": \\"$part\\"}" > "$out/ssd_kernel_$part.json"
  [[ $part == gate ]] && exit "$GATE_RC"
  exit 0
fi
exec PYTHON "$@"
"""


def test_bf16_miss_does_not_skip_kernel_bench(tmp_path):
    "kernel_check exit 3 (bf16 checks missed, fp32 within): its status says so, kernel_bench runs, the suite exits 1."
    py = tmp_path / "python"
    py.write_text(FAKE_SSD_KERNEL.replace("exec PYTHON", f"exec {sys.executable}"))
    py.chmod(0o755)
    r, out = suite(tmp_path, "--smoke", "--cpu", "--section", "kernel_check,kernel_bench", PYTHON=str(py), GATE_RC="3")
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    sections = json.loads((out / "results.json").read_text())["sections"]
    assert sections["kernel_check"]["status"] == "bf16 miss", sections["kernel_check"]
    assert sections["kernel_bench"]["status"] == "ok", sections["kernel_bench"]
    assert sections["kernel_bench"]["results"] == {"ssd_kernel_time.json": {"part": "time"}}


def fake_ssd(events, tag):
    "A stand-in SSD (y = x * dt, differentiable in both) that logs `tag` to `events` at every call."
    def fn(x, dt, **kw):
        events.append(tag)
        return x * dt[..., None].to(x.dtype), None
    return fn


def test_kernel_bench_times_ours_before_any_peer(monkeypatch):
    "time_all: our rows (and eager ssd_chunked) at every shape are written before a peer's check or timing starts."
    sk = load_bench("ssd_kernel")
    events, results, gate_rows = [], [], []
    monkeypatch.setattr(sk, "ssd_triton", fake_ssd(events, "ours"))
    monkeypatch.setattr(sk, "FLA", lambda q, k, v, g, scale: (events.append("peer") or v * 1.0, None))
    monkeypatch.setattr(sk, "OFFICIAL", lambda V, chunk_size, **kw: events.append("peer") or V * 1.0)
    shapes = [dict(name=f"tiny L{L}", b=1, T=32, H=2, P=4, N=8, S=2, L=L) for L in (8, 16)]
    a = types.SimpleNamespace(reps=2, warmup=0, budget_s=5.0, deadline_s=600.0, peak_tflops=1.0, peak_tbps=1.0, cpu=True)
    write = lambda: events.append([r["candidate"] for res in results for r in res["rows"]])
    sk.time_all(sk.Timer(torch.device("cpu")), shapes, a, torch.device("cpu"), torch.float32, results, gate_rows, write)
    ours = ["ours", "ours (shared B/C + bias)", "ours (default configs, not autotuned)", "ours (Mamba-2 case)",
            "ssd_chunked eager"]
    peers = ["official mamba3_siso_combined", "fla chunk_simple_gla (Mamba-2 case)"]
    assert [[r["candidate"] for r in res["rows"]] for res in results] == [ours + peers] * 2
    assert all("error" not in r for res in results for r in res["rows"]), results
    assert [g[0].split()[0] for g in gate_rows] == ["official", "fla"]
    written = [e for e in events[:events.index("peer")] if isinstance(e, list)]
    assert written[-1] == ours * 2, written[-1]          # every row of ours kept before the first peer call


@pytest.mark.parametrize("rows, rc, timed", [
    ([("bf16 y", 0.5, 2e-2, False), ("fp32 y", 1e-6, 1e-4, True)], 3, True),
    ([("bf16 y", 1e-3, 2e-2, True), ("fp32 y", 1e-2, 1e-4, False)], 1, False),
    ([("bf16 y", 1e-3, 2e-2, True), ("fp32 y", 1e-6, 1e-4, True)], 0, True),
])
def test_gate_bf16_miss_still_times(tmp_path, monkeypatch, rows, rc, timed):
    "ssd_kernel.py --part all: a bf16 miss is reported (exit 3) and the timings run; an fp32 miss stops them (exit 1)."
    sk = load_bench("ssd_kernel")
    monkeypatch.setattr(sk, "ssd_triton", fake_ssd([], "ours"))
    monkeypatch.setattr(sk, "gate", lambda device, interp, gate_rows, on_rows: (gate_rows.extend(rows), on_rows()))
    monkeypatch.setattr(sk.torch, "set_num_threads", lambda n: None)
    assert sk.main(["--part", "all", "--cpu", "--reps", "1", "--warmup", "0", "--sweep-warps", "", "--out", str(tmp_path)]) == rc
    res = json.loads((tmp_path / "ssd_kernel_cpu_all.json").read_text())
    assert res["verdict"] == sk.VERDICTS[rc] and res["ok"] is (rc == 0)
    assert bool(res["results"]) is timed and [g["check"] for g in res["gate"]] == ["bf16 y", "fp32 y"], res


def test_readme_section_table_lists_every_section():
    "bench/README.md's section table and --section list: exactly gpu_suite.sh's sections, in its order, with its caps."
    sh = SUITE.read_text()
    order = re.search(r"^ORDER=\(([^)]*)\)", sh, re.M).group(1).split()
    caps = {k: dict(re.findall(r"\[(\w+)\]=(\d+)", re.search(rf"^declare -A {k}=\((.*?)\)\n", sh, re.M | re.S).group(1)))
            for k in ("CAP_GPU", "CAP_CPU")}
    readme = (ROOT / "bench" / "README.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| (\d+) / (\d+|–) \|", readme, re.M)
    assert [name for name, *_ in rows] == order
    assert {name: (gpu, cpu) for name, gpu, cpu in rows} == {
        s: (caps["CAP_GPU"][s], "–" if caps["CAP_CPU"][s] == "0" else caps["CAP_CPU"][s]) for s in order}
    listed = re.search(r"`--section` takes any of `([^`]*)`", readme).group(1).split()
    assert listed == order


SECOND_SIGINT = """
import os, signal, sys, time
sys.path.insert(0, sys.argv[1])
if sys.argv[2] == "install":
    import sigint_once
    sigint_once.install()
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)
except KeyboardInterrupt:
    os.kill(os.getpid(), signal.SIGINT)      # the second one, as `timeout` sends to the process group
    time.sleep(0.2)
    print("wrote the JSON")
"""


@pytest.mark.parametrize("mode, survives", [("install", True), ("default", False)])
def test_sigint_once_survives_the_second_signal(mode, survives):
    "With sigint_once.install() the handler that writes the JSON outlives a second SIGINT; without it, it does not."
    r = subprocess.run([sys.executable, "-c", SECOND_SIGINT, str(ROOT / "bench"), mode], capture_output=True, text=True,
                       timeout=60)
    assert ("wrote the JSON" in r.stdout) is survives, r.stdout + r.stderr


def test_every_section_script_takes_sigint_once():
    "Every bench/ script a suite section runs installs sigint_once when run as a program."
    sh = SUITE.read_text()
    scripts = sorted(set(re.findall(r'"\$PYTHON" (bench/\w+\.py)', sh[sh.index("# ---------------------------------------------------------------- sections"):])))
    assert len(scripts) == 7, scripts
    for script in scripts:
        main_block = (ROOT / script).read_text().split('if __name__ == "__main__":')[-1]
        assert "sigint_once.install()" in main_block, script


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


def test_e2e_data_check_on_synthetic_shards_and_cut(tmp_path):
    """Without GPT-2 ranks the e2e smoke's data check writes synthetic shards with a manifest, and they load; the JSON
    holds that check as soon as it ends, and SIGINT in the next check adds that one, failed, marked interrupted."""
    f = tmp_path / "e2e.json"
    rc, out, before, after = cut_at(tmp_path, "--- [4]", [
        "bench/e2e_gpu_smoke.py", "--cpu", "--threads", "1", "--checks", "2,4", "--out", str(f)], f,
        drop=("MAMBA3_LITE_GPT2_RANKS",))
    assert rc == 124, out
    before, after = json.loads(before), json.loads(after)
    assert [(c["num"], c["ok"]) for c in before["checks"]] == [(2, True)], before
    assert before["meta"]["corpus"]["kind"].startswith("synthetic"), before["meta"]["corpus"]
    assert [(c["num"], c["ok"]) for c in after["checks"]] == [(2, True), (4, False)] and after["ok"] is False, after
    assert after["checks"][1]["error"] == after["meta"]["interrupted"] == "interrupted (SIGINT) during check [4] checkpoint round trip"


# ---------------------------------------------------------------- the suite on the machine it gets
BLOCK_HOOK = """
import sys
class _Missing:
    "Makes `import {name}` fail as on a machine without it."
    def find_spec(self, fullname, path=None, target=None):
        if fullname == {name!r} or fullname.startswith({name!r} + "."):
            raise ModuleNotFoundError(f"No module named {{fullname!r}}", name=fullname)
sys.meta_path.insert(0, _Missing())
"""


def without_module(tmp_path, name):
    "PYTHONPATH whose sitecustomize makes `name` unimportable."
    hook = tmp_path / f"without_{name}"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(BLOCK_HOOK.format(name=name))
    return str(hook) + os.pathsep + os.environ.get("PYTHONPATH", "")


def test_env_imports_what_the_suite_needs():
    "The env section's list: the package requirements the GPU image may lack among them; peers, stand-ins, parquet not."
    ge = load_bench("gpu_env")
    needed = ge.needed_modules()
    tops = {m.split(".")[0] for m in needed}
    assert {"torch", "triton", "numpy", "fastcore", "blake3", "tqdm", "yaml", "tiktoken", "safetensors", "matplotlib"} <= tops
    assert not tops & {"fla", "mamba_ssm", "IPython", "pyarrow", "wandb", "lm_eval"}, tops
    assert needed["blake3"] == "mamba3_lite/checkpoint.py" and "mamba3_lite.ssd_triton" in needed
    assert sorted(ge.suite_scripts()) == ["doc_reset_cpu", "e2e_gpu_smoke", "gpu_cells", "gpu_env", "model_gpu",
                                          "ssd_kernel", "train_gpu"]


@pytest.mark.parametrize("name, who", [("blake3", "(imported by mamba3_lite/checkpoint.py)"),
                                       ("fastcore", "(imported by mamba3_lite/data.py)"),
                                       ("tqdm", "which torch._dynamo.utils imports")])   # torch.compile needs it too
def test_env_names_a_missing_module(tmp_path, name, who):
    "A package requirement missing: gpu_env.py exits 4 before anything else, one line naming it and who needs it."
    env = dict(os.environ, PYTHONPATH=without_module(tmp_path, name), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "bench/gpu_env.py", "--cpu", "--out", str(tmp_path)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 4, r.stdout + r.stderr
    line = [l for l in r.stdout.splitlines() if l.startswith("gpu_env.py: missing module")]
    assert len(line) == 1 and f"missing module '{name}" in line[0] and who in line[0], r.stdout
    rec = json.loads((tmp_path / "env.json").read_text())
    assert rec["missing"]["name"].split(".")[0] == name and "torch" not in rec, rec   # stopped before the versions


def test_suite_stops_after_a_missing_module(tmp_path):
    "env exit 4: the suite skips every later section (no time spent), says why, and prints the rerun line."
    r, out = suite(tmp_path, "--smoke", "--cpu", "--section", "kernel_check,model",
                   PYTHONPATH=without_module(tmp_path, "blake3"))
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    sections = json.loads((out / "results.json").read_text())["sections"]
    assert sections["env"]["status"] == "FAILED" and "missing module 'blake3'" in sections["env"]["note"], sections["env"]
    for name in ("kernel_check", "model"):
        assert sections[name]["status"] == "skipped" and sections[name]["note"].startswith("env:"), sections[name]
        assert sections[name]["seconds"] == "0"
    summary = (out / "summary.md").read_text()
    assert "**missing module `blake3`**" in summary and "--section kernel_check,model --smoke --cpu" in summary


def test_fetch_peers_brings_what_the_image_lacks(tmp_path):
    """fetch_peers.sh's check: every module the suite imports is in the device image (IMAGE_HAS) or in a wheel it
    fetches; without the blake3 wheel, blake3 is named."""
    import zipfile
    ge = load_bench("gpu_env")
    sh = (ROOT / "bench" / "fetch_peers.sh").read_text()
    image = re.search(r'^IMAGE_HAS="([^"]*)"', sh, re.M).group(1).split()
    fetched = set(re.findall(r'"([\w.-]+)==\$\w+"', sh))
    assert {"fastcore", "blake3", "fla-core", "einops", "mamba-ssm"} <= fetched, fetched
    assert "tqdm" in image and "fastcore" not in image and "blake3" not in image
    for name in ("fastcore", "blake3"):
        with zipfile.ZipFile(tmp_path / f"{name}-1.0-py3-none-any.whl", "w") as z:
            z.writestr(f"{name}/__init__.py", "")
            z.writestr(f"{name}-1.0.dist-info/METADATA", "")
    assert ge.lacking(image, tmp_path) == []
    (tmp_path / "blake3-1.0-py3-none-any.whl").unlink()
    assert ge.lacking(image, tmp_path) == ["blake3"]
    assert ge.main(["--lacking", " ".join(image), str(tmp_path)]) == 1


@pytest.mark.parametrize("name, key", [
    ("NVIDIA H100 80GB HBM3", "H100-SXM"), ("NVIDIA H200", "H200"), ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
    ("NVIDIA H100 PCIe", None), ("NVIDIA H100 NVL", None), ("NVIDIA H200 NVL", None), ("NVIDIA A100-SXM4-40GB", None),
    ("NVIDIA A100 80GB PCIe", None), ("NVIDIA L4", None), ("", None)])
def test_gpu_from_name(name, key):
    "The datasheet row by device name: only the cards whose numbers the table holds; the others get none."
    assert load_bench("gpu_model").gpu_from_name(name) == key


def test_roofline_and_mfu_use_the_detected_gpu(capsys):
    "ssd_kernel.py's roofline and model_gpu.py's MFU peak follow the device; an unknown one gets none and one line."
    sk, mg = load_bench("ssd_kernel"), load_bench("model_gpu")
    assert sk.roofline_peaks("NVIDIA H100 80GB HBM3") == ("H100-SXM", 989.0, 3.35, "datasheet")
    assert sk.roofline_peaks("NVIDIA H200") == ("H200", 989.0, 4.8, "datasheet")
    assert sk.roofline_peaks("NVIDIA H100 80GB HBM3", 500.0, 2.0) == (None, 500.0, 2.0, "given")
    assert sk.roofline_peaks(None)[1:3] == (None, None)
    capsys.readouterr()
    assert sk.roofline_peaks("NVIDIA H100 PCIe")[:3] == (None, None, None)
    assert capsys.readouterr().out.count("not in bench/gpu_model.py's GPUS") == 1
    assert sk.roofline_us(16, 2048, 32, 64, 128, 32, None, None) == (None, None)
    assert mg.peak_tflops("NVIDIA A100-SXM4-80GB", None) == 312.0 and mg.peak_tflops("NVIDIA H200", 100.0) == 100.0
    assert mg.peak_tflops("Tesla T4", None) is None and "no MFU" in capsys.readouterr().out


def test_memory_count_decides_the_h100_runs():
    """bench/model_memory.py on the 434M preset at 16 x 2048 (fake tensors): without checkpointing the step does not
    fit an H100's 80 GB (81,559 MiB) but fits an H200's (143,771 MiB); with it, it fits either."""
    mm = load_bench("model_memory")
    from mamba3_lite.model import ModelConfig
    h100, h200 = 81559 * 2**20, 143771 * 2**20
    full = mm.training_memory(ModelConfig.from_preset("a100-400m", ssd_dispatch="triton"), 16, 2048)
    ckpt = mm.training_memory(ModelConfig.from_preset("a100-400m", ssd_dispatch="triton", grad_checkpoint=True), 16, 2048)
    assert full["states"] == 16 * 434_359_040
    assert not mm.fits(full, h100)[0] and mm.fits(full, h200)[0] and mm.fits(ckpt, h100)[0]
    assert full["saved"] > 10 * ckpt["saved"], (full, ckpt)
    assert "more than 90% of 79.6 GiB" in mm.fits(full, h100)[1]


def test_model_bench_skips_what_does_not_fit(tmp_path):
    "model_gpu.py: a configuration over the memory it may use is not run; one line, its JSON line says so."
    f = tmp_path / "model_gpu.jsonl"
    args = [sys.executable, "bench/model_gpu.py", "--device", "cpu", "--preset", "tiny", "--batch", "2", "--seq-len", "32",
            "--steps", "1", "--warmup", "0", "--peak-tflops", "1", "--dtype", "fp32", "--no-grad-checkpoint",
            "--json", str(f)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(args + ["--memory-gib", "0.001"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "more than 90% of 0.0 GiB: not run" in r.stdout and "step 1/1" not in r.stdout, r.stdout
    r = subprocess.run(args + ["--memory-gib", "8"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    skipped, ran = [json.loads(l) for l in f.read_text().splitlines()]
    assert skipped["status"] == "skipped: does not fit" and skipped["memory_floor_gib"] > 0 and "mfu" not in skipped
    assert ran["status"] == "ok" and ran["memory_floor_gib"] == skipped["memory_floor_gib"] and ran["mfu"] > 0, ran
    md = load_bench("suite_report").render_known("model", {"model_gpu.jsonl": [skipped, ran]})
    assert any("skipped: does not fit: needs at least" in l for l in md), md


def test_train_step_runs_the_production_config(monkeypatch):
    """train_gpu.py's defaults are configs/pretrain_a100_400m.yaml's (checkpointing, 16 x 2048 x 2, Triton SSD) and its
    compile mode, which is `default`; the suite's train_step section overrides none of them."""
    tg = load_bench("train_gpu")
    monkeypatch.delenv("TORCH_COMPILE_MODE", raising=False)
    from mamba3_lite.config import load_config
    shipped = load_config(ROOT / "configs" / "pretrain_a100_400m.yaml")
    cfg, mode = tg.run_config(tg.parse_args(["--smoke"]))
    assert cfg == shipped and mode == shipped.training.compile_mode == "default"
    assert (cfg.model["grad_checkpoint"], cfg.training.micro_batch_size, cfg.data.max_seq_len,
            cfg.training.gradient_accumulation_steps, cfg.model["ssd_dispatch"]) == (True, 16, 2048, 2, "triton")
    monkeypatch.setenv("TORCH_COMPILE_MODE", "max-autotune")                      # as training reads it
    assert tg.run_config(tg.parse_args([]))[1] == "max-autotune"
    assert tg.run_config(tg.parse_args(["--compile-mode", "reduce-overhead"]))[1] == "reduce-overhead"
    sh = SUITE.read_text()
    call = re.search(r"^section_train_step\(\) \{\n(.*?)\n\}", sh, re.M | re.S).group(1)
    assert "bench/train_gpu.py --smoke" in call
    assert not re.search(r"--(batch|seq-len|accum|preset|grad-checkpoint|no-grad-checkpoint|compile-mode|config)\b", call)


def fake_kernel(broken=None):
    "ssd_triton stand-in: `per_head_reference`, or with its biases (broken='bias') or restarts (broken='resets') dropped."
    sk = load_bench("ssd_kernel")

    def fn(**kw):
        if broken == "bias" and kw.get("B_bias") is not None:
            kw = dict(kw, B_bias=torch.zeros_like(kw["B_bias"]), C_bias=torch.zeros_like(kw["C_bias"]))
        if broken == "resets":
            kw.pop("seq_idx", None)
        return sk.per_head_reference(**kw)
    return fn


@pytest.mark.parametrize("broken, failing", [
    (None, set()),
    ("bias", {"shared B/C + bias", "shared B/C + bias, resets"}),
    ("resets", {"shared B/C + bias, resets"})])
def test_gate_checks_the_training_path(monkeypatch, broken, failing):
    """The kernel gate runs the shared-B/C + per-head bias path with and without document restarts, besides per-head
    B/C: a kernel that drops the biases, or the restarts, fails exactly the rows of those paths."""
    sk = load_bench("ssd_kernel")
    monkeypatch.setattr(sk, "ssd_triton", fake_kernel(broken))
    rows = []
    sk.gate(torch.device("cpu"), True, rows, lambda: None)
    paths = {name.split(": ")[0].removeprefix("fp32 ") for name, *_ in rows}
    assert paths == set(sk.GATE_PATHS) == {"shared B/C + bias", "shared B/C + bias, resets", "per-head B/C"}
    assert {name.split(": ")[0].removeprefix("fp32 ") for name, _, _, ok in rows if not ok} == failing, rows


def test_gate_document_ids_restart_inside_and_at_chunks():
    sk = load_bench("ssd_kernel")
    ids = sk.document_ids(2, 2048, 64, seed=4)
    starts = ids[:, 1:] != ids[:, :-1]
    assert (ids[:, 0] == 0).all() and (ids[:, 1:] >= ids[:, :-1]).all()
    assert starts[:, 63].all() and starts[:, 64].all()                         # at t = 64 (a chunk start) and t = 65
    assert (starts[:, 64:].nonzero()[:, 1] % 64 != 63).any()                    # and inside chunks
    assert not torch.equal(ids[0], ids[1])


def test_gate_passes_on_the_kernel_under_the_interpreter(tmp_path):
    "The real kernel (Triton interpreter, tiny shape) passes every path of the gate, fp32 vs ssd_chunked."
    r = subprocess.run([sys.executable, "bench/ssd_kernel.py", "--part", "gate", "--cpu", "--out", str(tmp_path)], cwd=ROOT,
                       env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    gate = json.loads((tmp_path / "ssd_kernel_cpu_gate.json").read_text())["gate"]
    assert len(gate) == 9 and all(g["ok"] for g in gate), gate
    assert {g["check"].split(": ")[0] for g in gate} == {f"fp32 {p}" for p in load_bench("ssd_kernel").GATE_PATHS}


def test_readme_device_plan_fits_the_device_time():
    """bench/README.md's plan: the first command's budget leaves its timeout room and runs at most 7 minutes; the rerun
    is sized from the device time left."""
    readme = (ROOT / "bench" / "README.md").read_text()
    first = re.search(r"command:\s+bash bench/gpu_suite.sh --budget (\d+)\ncarry:\s+\[\"bench/peers\"\]\ntimeout_s: (\d+)",
                      readme)
    budget, timeout = int(first.group(1)), int(first.group(2))
    assert timeout <= 420 and budget + 20 <= timeout, (budget, timeout)
    default = re.search(r"BUDGET=\$\{BUDGET:-\$\(\[\[ \$CPU == 1 \]\] && echo \d+ \|\| echo (\d+)\)\}", SUITE.read_text())
    assert budget == int(default.group(1))                                       # the suite's own GPU default
