"""Gather bench/gpu_suite.sh's finished sections into $OUT/results.json and $OUT/summary.md (called after each one).

    python bench/suite_report.py WORK OUT "TITLE"

WORK holds status.tsv (one line per section: name, status, rc, seconds, cap, note, tab-separated), one folder per
section with the JSON / JSONL / markdown its script wrote, and <name>.log. Plain Python (no torch), so that it runs
in well under a second and still runs when a section broke the GPU.
"""
import json
import sys
from pathlib import Path

STATUS_COLUMNS = ("name", "status", "rc", "seconds", "cap", "note")


def read_status(work: Path):
    "status.tsv as a list of dicts (a malformed line is kept as a note, not dropped)."
    rows = []
    path = work / "status.tsv"
    for line in path.read_text().splitlines() if path.exists() else []:
        parts = line.split("\t")
        rows.append(dict(zip(STATUS_COLUMNS, parts + [""] * (len(STATUS_COLUMNS) - len(parts)))))
    return rows


def read_results(folder: Path):
    "Every JSON / JSONL file a section wrote: {file name: parsed value} (unreadable files as an error string)."
    out = {}
    for f in sorted(folder.glob("*.json*")) if folder.is_dir() else []:
        try:
            text = f.read_text()
            out[f.name] = [json.loads(l) for l in text.splitlines() if l.strip()] if f.suffix == ".jsonl" else json.loads(text)
        except (OSError, ValueError) as e:
            out[f.name] = f"unreadable: {type(e).__name__}: {e}"
    return out


def fmt(v, spec):
    return "—" if v is None else format(v, spec)


def note(x):
    "A model_gpu.jsonl line's note: its error, or the phase it was cut in and the timed steps its numbers cover."
    if x.get("error") or x.get("status") in (None, "ok"):
        return x.get("error", "")
    if x.get("note"):
        return f"{x['status']}: {x['note']}"
    return f"{x['status']} ({x.get('steps_done', 0)} of {x.get('steps')} timed steps)"


def render_known(name, results):
    "A few lines for the sections whose scripts write JSON only."
    lines = []
    for fname, r in results.items():
        if isinstance(r, str):
            lines.append(f"- {fname}: {r}")
        elif fname == "env.json":
            if r.get("missing"):
                m = r["missing"]
                lines.append(f"- **missing module `{m.get('name')}`** (needed by {m.get('needed_by')}): {m.get('error')}")
            elif r.get("imports"):
                lines.append(f"- imports: all {r['imports'].get('modules')} modules the suite needs "
                             f"({r['imports'].get('seconds')} s)")
            lines.append(f"- {r.get('device')} | python {r.get('python')} | torch {r.get('torch')} | triton {r.get('triton')}"
                         f" | numpy {r.get('numpy')} | CUDA {r.get('cuda')}")
            if "gpu" in r:
                ds = r.get("datasheet")
                lines.append(f"- datasheet (bench/gpu_model.py GPUS): {r['gpu']}: {ds['bandwidth'] / 1e12:.2f} TB/s, "
                             f"{ds['tensor'] / 1e12:.0f} TFLOP/s bf16 dense, {ds['sms']} SMs" if ds else
                             "- datasheet: this GPU is not in bench/gpu_model.py's GPUS: no MFU or roofline reported")
            if "copy_tbps" in r:
                of = (f" ({r['copy_of_datasheet']:.0%} and {r['matmul_of_datasheet']:.0%} of the datasheet)"
                      if "copy_of_datasheet" in r else "")
                lines.append(f"- measured ceilings: copy {r['copy_tbps']:.2f} TB/s (read + write), bf16 matmul "
                             f"{r['bf16_matmul_tflops']:.0f} TFLOP/s ({r['matmul_n']}³, random data){of}")
            if "peers" in r:
                lines.append("- peers: " + "; ".join(f"{k} {v}" for k, v in r["peers"].items()))
        elif fname.endswith(".jsonl"):
            lines += ["| preset | batch x seq | ckpt | ssd | ms/step | tokens/s | MFU | peak GiB | floor GiB | note |",
                      "|---|---|---|---|---|---|---|---|---|---|"]
            for x in r:
                lines.append(f"| {x.get('preset')} | {x.get('batch')}x{x.get('seq_len')} | {x.get('grad_checkpoint')} | "
                             f"{x.get('ssd_dispatch')} | {fmt(x.get('ms_per_step'), '.1f')} | "
                             f"{fmt(x.get('tokens_per_s'), ',.0f')} | {fmt(x.get('mfu'), '.1%')} | "
                             f"{fmt(x.get('peak_mem_gib'), '.1f')} | {fmt(x.get('memory_floor_gib'), '.1f')} | {note(x)} |")
            fpt = next((x for x in r if x.get("flops_per_token")), None)
            if fpt:
                lines += ["", f"MFU = tokens/s x {fpt['flops_per_token'] / 1e9:.3f} GFLOP/token (6 x params + the SSD "
                          f"core; the recompute not counted) / {fmt(fpt.get('peak_tflops'), 'g')} TFLOP/s; floor: "
                          "bench/model_memory.py's count (weights, gradients, saved tensors)"]
        elif fname == "train_gpu.json":
            m = r.get("meta", {})
            peak = m.get("peak_flops")
            lines += [f"- {m.get('config')}: {m.get('preset')} ({(m.get('params') or 0) / 1e6:.0f}M) micro-batch "
                      f"{m.get('batch')} x {m.get('seq_len')} x accum {m.get('accum')}, {m.get('dtype')}, "
                      f"grad_checkpoint={m.get('grad_checkpoint')}, ssd={m.get('ssd_dispatch')}, compile mode "
                      f"{m.get('compile_mode')}, {m.get('warmup')} warm-up + {m.get('steps')} timed steps per mode",
                      f"- MFU = tokens/s x {fmt((m.get('flops_per_token') or 0) / 1e9, '.3f')} GFLOP/token (6 x params + "
                      f"the SSD core; the recompute not counted) / "
                      + (f"{peak / 1e12:g} TFLOP/s ({m.get('gpu')} datasheet)" if peak else "no peak: no MFU")
                      + f"; memory floor {fmt(m.get('memory_floor_gib'), '.1f')} GiB (bench/model_memory.py)"]
            if m.get("skipped"):
                lines.append(f"- not run: {m['skipped']}")
            if r.get("compiled_over_eager"):
                lines.append(f"- compiled / eager tokens/s: {r['compiled_over_eager']:.2f}")
            lines += ["",
                      "| mode | status | warm-up steps | warm-up s | timed steps | tokens/s | ms/step | MFU | peak GiB |",
                      "|---|---|---|---|---|---|---|---|---|"]
            for x in r.get("rows", []):
                lines.append(f"| {x.get('mode')}{'' if x.get('compile') is None else ' (' + x['compile'] + ')'} | "
                             f"{x.get('status')} | {x.get('warmup_steps_done')} | {fmt(x.get('warmup_s'), '.1f')} | "
                             f"{x.get('steps_done')} | {fmt(x.get('tokens_per_s'), ',.0f')} | "
                             f"{fmt(x.get('ms_per_step'), '.1f')} | {fmt(x.get('mfu'), '.1%')} | "
                             f"{fmt(x.get('peak_mem_gib'), '.1f')} |")
        elif fname == "doc_reset.json":
            lines.append(f"- tiny model, batch {r.get('batch')} x {r.get('seq_len')}, {r.get('doc_pieces')} document "
                         f"pieces, {r.get('device')}: {r.get('status')}; fwd+bwd tokens/s "
                         f"{fmt(r.get('tokens_per_s_without_seq_idx'), ',.0f')} without seq_idx, "
                         f"{fmt(r.get('tokens_per_s_with_seq_idx'), ',.0f')} with; time x"
                         f"{fmt(r.get('time_ratio_with'), '.3f')} with seq_idx (interleaved, same batch)")
        elif fname == "gpu_cells.json":
            lines += [f"- {x.get('notebook')}: {'ok' if x.get('ok') else 'FAILED'} ({x.get('seconds')} s)"
                      for x in r.get("results", [])]
            if r.get("interrupted"):
                lines.append(f"- {r['interrupted']}")
        elif fname.startswith("e2e"):
            cut = r.get("meta", {}).get("interrupted")
            lines.append(f"- {'PASS' if r.get('ok') else 'FAIL'} ({r.get('meta', {}).get('wall_s')} s){'; ' + cut if cut else ''}")
            for c in r.get("checks", []):
                bad = [row["name"] for row in c.get("rows", []) if not row.get("ok")]
                lines.append(f"  - [{c.get('num')}] {c.get('name')}: {'ok' if c.get('ok') else 'FAILED'} "
                             f"({c.get('seconds', 0):.1f} s){' — ' + ', '.join(bad) if bad else ''}"
                             f"{' — error' if c.get('error') else ''}")
    return lines


def summary(title, status, work: Path):
    out = [f"# {title}", "", "| section | status | rc | seconds | cap s | note |", "|---|---|---|---|---|---|"]
    out += [f"| {s['name']} | {s['status']} | {s['rc']} | {s['seconds']} | {s['cap']} | {s['note']} |" for s in status]
    for s in status:
        folder = work / s["name"]
        mds = sorted(folder.glob("*.md")) if folder.is_dir() else []
        known = render_known(s["name"], read_results(folder))
        if not (mds or known or s["status"] not in ("ok", "skipped")):
            continue
        out += ["", f"## {s['name']} ({s['status']})", ""]
        for md in mds:
            out += [line.replace("# ", "### ", 1) if line.startswith("# ") else
                    line.replace("## ", "#### ", 1) if line.startswith("## ") else line
                    for line in md.read_text().splitlines()]
        out += known
        log = work / f"{s['name']}.log"
        if s["status"] not in ("ok", "skipped") and log.exists():
            tail = log.read_text(errors="replace").splitlines()[-15:]
            out += ["", f"last lines of {s['name']}.log:", "```", *tail, "```"]
    return "\n".join(out) + "\n"


def main(argv):
    if len(argv) != 3:
        print("usage: suite_report.py WORK OUT TITLE", file=sys.stderr)
        return 2
    work, out, title = Path(argv[0]), Path(argv[1]), argv[2]
    status = read_status(work)
    results = {s["name"]: dict(s, results=read_results(work / s["name"])) for s in status}
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(dict(title=title, sections=results), indent=1, default=str))
    (out / "summary.md").write_text(summary(title, status, work))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
