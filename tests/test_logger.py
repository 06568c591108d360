"""TrainingLogger: window arithmetic under NaN skips and gradient accumulation, the console line, metrics.jsonl,
eval records, progress bar, WandB (missing / failing / offline), plot_metrics."""
import importlib.util
import json
import math
import re
import sys
import types
import warnings

import pytest

from mamba3_lite.logger import (LoggerWarning, TrainingLogger, format_line, peak_flops_for, peak_memory,
                                plot_metrics, read_metrics, run_directory)

LINE = re.compile(r"step=\s*(\d+)(/\d+)? \| loss=(\d+\.\d{4}|nan) \| ppl=(\d+\.\d{2}|nan|inf) \| lr=(\d\.\d{2}e[+-]\d\d) \| "
                  r"tps=([\d,]+|nan)( \| gnorm=\d+\.\d{3})?( \| mfu=\d+\.\d%)? \| mem=\d+\.\d{2}GiB\((cuda|rss)\) \| "
                  r"skipped=\d+( \| eta=(\d+s|\d+m\d\ds|\d+h\d\dm))?")


class Clock:
    def __init__(self, t=0.0):
        self.t = t

    def __call__(self):
        return self.t


@pytest.fixture
def no_wandb(monkeypatch):
    monkeypatch.delenv("WANDB_PROJECT", raising=False)


def run(logger, clock, calls):
    "calls: (dt, step, loss, tokens, skipped, grad_norm) tuples; returns the flushed records."
    out = []
    for dt, step, loss, tokens, skipped, gn in calls:
        clock.t += dt
        r = logger.log(step, loss, 1e-3, tokens=tokens, skipped=skipped, grad_norm=gn)
        if r:
            out.append(r)
    return out


@pytest.mark.parametrize("accum", [1, 4])
@pytest.mark.parametrize("n_skip", [0, 3])
def test_window_arithmetic(tmp_path, capsys, no_wandb, accum, n_skip):
    b, T, le = 2, 16, 4
    tok = accum * b * T
    clk = Clock()
    lg = TrainingLogger(tmp_path, log_every=le, flops_per_token=100.0, peak_flops=1e6, progress=False, clock=clk)
    calls = [(1.0, 0, 5.0, tok, False, 1.0)]  # step 0: starts the clock, flushes a window without a tps
    losses = [3.0, 3.5, 2.5, 3.2]
    for s, l in zip(range(1, le + 1), losses):
        if s == 2:
            calls += [(0.25, 2, float("nan"), b * T, True, None)] * n_skip  # forward-only, loss NaN, step not advanced
        calls.append((1.0 * accum, s, l, tok, False, float(s)))
    r0, r1 = run(lg, clk, calls)
    lg.close()
    assert r0["step"] == 0 and math.isnan(r0["tps"]) and r0["loss"] == 5.0
    mean = sum(losses) / len(losses)
    wall = le * accum + 0.25 * n_skip
    assert r1["loss"] == pytest.approx(mean) and r1["ppl"] == pytest.approx(math.exp(mean))
    assert r1["tokens"] == le * tok + n_skip * b * T and r1["skipped"] == n_skip
    assert r1["tps"] == pytest.approx((le * tok + n_skip * b * T) / wall)
    assert r1["mfu"] == pytest.approx(le * tok * 100.0 / (wall * 1e6))
    assert r1["grad_norm"] == pytest.approx(2.5) and r1["grad_norm_max"] == 4.0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(LINE.fullmatch(x) for x in lines), lines
    assert "tps=nan" in lines[0]
    rows = read_metrics(tmp_path)
    assert rows[0]["tps"] is None and rows[1]["tps"] == pytest.approx(r1["tps"])


def test_skipped_call_on_a_multiple_does_not_flush(no_wandb, capsys):
    clk = Clock()
    lg = TrainingLogger(None, log_every=2, progress=False, clock=clk)
    recs = run(lg, clk, [(1, 1, 2.0, 10, False, None), (1, 2, float("nan"), 10, True, None),
                         (1, 2, 3.0, 10, False, None)])
    assert [r["step"] for r in recs] == [2] and recs[0]["skipped"] == 1 and recs[0]["loss"] == 2.5
    assert recs[0]["tps"] == pytest.approx(20 / 2)


def test_flush_deferred_when_the_multiple_was_skipped(no_wandb, capsys):
    "A caller that advances the step on skips: the flush due at step 4 happens at the next trained step, 5."
    clk = Clock()
    lg = TrainingLogger(None, log_every=4, progress=False, clock=clk)
    recs = run(lg, clk, [(1, s, 2.0, 10, s == 4, None) for s in range(1, 9)])
    assert [r["step"] for r in recs] == [5, 8] and recs[0]["skipped"] == 1 and recs[1]["skipped"] == 0


def test_all_skipped_window_is_reported_at_next_trained_step(no_wandb, capsys):
    clk = Clock()
    lg = TrainingLogger(None, log_every=1, progress=False, clock=clk)
    run(lg, clk, [(1, 1, 2.0, 10, False, None)])
    recs = run(lg, clk, [(1, 2, float("nan"), 10, True, None)] * 3 + [(1, 2, 2.2, 10, False, None)])
    assert recs[0]["skipped"] == 3 and recs[0]["loss"] == pytest.approx(2.2) and recs[0]["tps"] == pytest.approx(10)


def test_line_format_exact():
    rec = {"step": 7, "loss": 10.123456, "ppl": 24959.2, "lr": 0.000123, "tps": 987.6, "grad_norm": None, "mfu": 0.0,
           "peak_mem_gib": 0.5, "mem_kind": "rss", "skipped": 2}
    assert format_line(rec) == ("step=      7 | loss=10.1235 | ppl=24959.20 | lr=1.23e-04 | tps=988 | mfu=0.0% | "
                                "mem=0.50GiB(rss) | skipped=2")


def test_bad_inputs(no_wandb):
    lg = TrainingLogger(None, progress=False)
    with pytest.raises(ValueError, match="tokens"):
        lg.log(1, 2.0, 1e-3, tokens=1.5)
    with pytest.raises(ValueError, match="skipped=True"):
        lg.log(1, float("inf"), 1e-3, tokens=1)
    with pytest.raises(ValueError, match="flops_per_token"):
        TrainingLogger(None, flops_per_token=-1)


def test_peak_table_and_memory():
    assert peak_flops_for("NVIDIA H200") == 989e12 and peak_flops_for("NVIDIA A100 80GB PCIe") == 312e12
    assert peak_flops_for("NVIDIA H100 NVL") == 835e12 and peak_flops_for("NVIDIA GeForce RTX 3090") == 0.0
    gib, kind = peak_memory("cpu")
    assert kind == "rss" and gib > 0


def test_mfu_left_out_without_a_known_peak(tmp_path, no_wandb, capsys):
    "On the CPU (no peak FLOP/s) the line has no mfu field and the record's mfu is null, not a 0.0% measurement."
    clk = Clock()
    lg = TrainingLogger(tmp_path, log_every=2, flops_per_token=1e9, device="cpu", progress=False, clock=clk)
    (r,) = run(lg, clk, [(1, 1, 2.0, 10, False, None), (1, 2, 2.0, 10, False, None)])
    lg.close()
    (line,) = capsys.readouterr().out.splitlines()
    assert lg.peak_flops == 0.0 and r["mfu"] is None and "mfu" not in line and LINE.fullmatch(line), line
    assert read_metrics(tmp_path)[0]["mfu"] is None


def test_step_of_total_and_eta_exclude_the_first_step(no_wandb, capsys):
    "`step N/total` and an ETA from the mean step time after the first call (a 100 s compile step must not count)."
    clk = Clock()
    lg = TrainingLogger(None, log_every=2, total_steps=10, progress=False, clock=clk)
    recs = run(lg, clk, [(100.0, 1, 2.0, 10, False, None)] + [(3.0, s, 2.0, 10, False, None) for s in range(2, 11)])
    lines = capsys.readouterr().out.splitlines()
    assert [r["eta_s"] for r in recs] == pytest.approx([8 * 3.0, 6 * 3.0, 4 * 3.0, 2 * 3.0, 0.0])
    assert lines[0].startswith("step=      2/10 | ") and lines[0].endswith(" | eta=24s"), lines[0]
    assert all(LINE.fullmatch(x) for x in lines), lines
    lg2 = TrainingLogger(None, log_every=1, progress=False, clock=clk)    # no total_steps: neither N/total nor eta
    (r,) = run(lg2, clk, [(1.0, 1, 2.0, 10, False, None)])
    assert r["eta_s"] is None and "/" not in capsys.readouterr().out.split("|")[0]


def test_eval_line_names_the_tokens_it_covers(tmp_path, no_wandb, capsys):
    with TrainingLogger(tmp_path, progress=False) as lg:
        lg.log_eval(300, 3.9031, split="val", tokens=8192, split_tokens=65536)
        lg.log_eval(301, 3.5, split="val", tokens=65536, split_tokens=65536)
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["eval step=    300 | loss=3.9031 | ppl=49.56 | first 8,192 of 65,536 val tokens",
                     "eval step=    301 | loss=3.5000 | ppl=33.12 | all 65,536 val tokens"], lines
    r = read_metrics(tmp_path)[0]
    assert (r["tokens"], r["split_tokens"]) == (8192, 65536)


def test_metrics_jsonl_appends_across_resume(tmp_path, no_wandb, capsys):
    for start in (0, 4):
        clk = Clock()
        with TrainingLogger(tmp_path, log_every=2, start_step=start, progress=False, clock=clk) as lg:
            run(lg, clk, [(1, s, 2.0, 10, False, 0.5) for s in range(start + 1, start + 5)])
            lg.log_eval(start + 4, 2.5, tokens=1234)
    rows = read_metrics(tmp_path)
    assert [(r["kind"], r["step"]) for r in rows] == [("train", 2), ("train", 4), ("eval", 4),
                                                      ("train", 6), ("train", 8), ("eval", 8)]
    for line in (tmp_path / "metrics.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert rows[2]["ppl"] == pytest.approx(math.exp(2.5)) and rows[2]["tokens"] == 1234
    need = {"step", "loss", "ppl", "lr", "tps", "grad_norm", "mfu", "peak_mem_gib", "mem_kind", "skipped", "tokens",
            "tokens_trained", "tokens_total", "window_s"}
    assert need <= set(rows[0])


def test_progress_bar(tmp_path, no_wandb, capsys):
    clk = Clock()
    lg = TrainingLogger(None, log_every=5, total_steps=10, progress=True, clock=clk)
    run(lg, clk, [(1, s, 2.0, 10, False, None) for s in range(1, 11)])
    lg.close()
    cap = capsys.readouterr()
    assert len([x for x in cap.out.splitlines() if LINE.fullmatch(x)]) == 2  # lines go to stdout
    assert "10/10" in cap.err  # the bar (with its ETA field) goes to stderr
    lg2 = TrainingLogger(None, progress=False)
    assert lg2._bar is None


def test_plot_metrics(tmp_path, no_wandb, capsys):
    clk = Clock()
    with TrainingLogger(tmp_path, log_every=2, progress=False, clock=clk) as lg:
        run(lg, clk, [(1, s, 3.0 / s, 10, False, None) for s in range(1, 11)])
        lg.log_eval(10, 1.0)
    out = plot_metrics(tmp_path, tmp_path / "sub.png")
    assert out == tmp_path / "sub.png" and out.read_bytes()[:4] == b"\x89PNG"
    assert plot_metrics(tmp_path) == tmp_path / "loss.png"           # default: loss.png in the run directory
    assert run_directory(tmp_path / "checkpoints") == tmp_path and run_directory(tmp_path) == tmp_path
    with pytest.raises(FileNotFoundError):
        plot_metrics(tmp_path / "missing")


# ---------------------------------------------------------------- WandB
def test_wandb_missing_warns_and_continues(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_PROJECT", "p")
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    clk = Clock()
    lg = TrainingLogger(tmp_path, log_every=1, progress=False, clock=clk)
    with pytest.warns(LoggerWarning, match="not installed"):
        run(lg, clk, [(1, 1, 2.0, 10, False, None)])
    run(lg, clk, [(1, 2, 2.0, 10, False, None)])
    lg.close()
    assert len(read_metrics(tmp_path)) == 2


def test_wandb_failing_init_and_log_warn(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_PROJECT", "p")
    bad = types.ModuleType("wandb")

    def init(**kw):
        raise RuntimeError("no API key")

    bad.init = init
    monkeypatch.setitem(sys.modules, "wandb", bad)
    clk = Clock()
    lg = TrainingLogger(tmp_path, log_every=1, progress=False, clock=clk)
    with pytest.warns(LoggerWarning, match="no API key"):
        run(lg, clk, [(1, 1, 2.0, 10, False, None)])

    logged = []

    class Run:
        name = "r"

        def log(self, d, step):
            logged.append(step)
            if step == 2:
                raise OSError("network down")

        def finish(self):
            pass

    bad.init = lambda **kw: Run()
    lg2 = TrainingLogger(tmp_path, log_every=1, progress=False, clock=clk)
    with pytest.warns(LoggerWarning, match="network down"):
        run(lg2, clk, [(1, s, 2.0, 10, False, None) for s in (1, 2, 3)])
    assert logged == [1, 2]  # switched off after the failure, training went on
    lg.close()
    lg2.close()


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="optional wandb package not installed")
def test_wandb_offline_writes_files(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_PROJECT", "mamba3-lite-test")
    monkeypatch.setenv("WANDB_RUN_NAME", "offline-check")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    clk = Clock()
    with warnings.catch_warnings():
        warnings.simplefilter("error", LoggerWarning)
        lg = TrainingLogger(tmp_path, log_every=2, progress=False, clock=clk, config={"lr": 1e-3})
        run(lg, clk, [(1, s, 3.0 - 0.1 * s, 100, False, 1.0) for s in range(1, 7)])
        lg.log_eval(6, 2.4)
        assert lg._wandb is not None and lg._wandb.name == "offline-check"
        lg.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    (data,) = runs[0].glob("*.wandb")
    assert data.stat().st_size > 0
