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


def render_known(name, results):
    "A few lines for the sections whose scripts write JSON only."
    lines = []
    for fname, r in results.items():
        if isinstance(r, str):
            lines.append(f"- {fname}: {r}")
        elif fname == "env.json":
            lines.append(f"- {r.get('device')} | python {r.get('python')} | torch {r.get('torch')} | triton {r.get('triton')}"
                         f" | numpy {r.get('numpy')} | CUDA {r.get('cuda')}")
            if "copy_tbps" in r:
                lines.append(f"- measured ceilings: copy {r['copy_tbps']:.2f} TB/s (read + write), bf16 matmul "
                             f"{r['bf16_matmul_tflops']:.0f} TFLOP/s ({r['matmul_n']}³, random data)")
            lines.append("- peers: " + "; ".join(f"{k} {v}" for k, v in r.get("peers", {}).items()))
        elif fname.endswith(".jsonl"):
            lines += ["| preset | batch x seq | ckpt | ssd | ms/step | tokens/s | MFU | peak GiB | note |",
                      "|---|---|---|---|---|---|---|---|---|"]
            for x in r:
                lines.append(f"| {x.get('preset')} | {x.get('batch')}x{x.get('seq_len')} | {x.get('grad_checkpoint')} | "
                             f"{x.get('ssd_dispatch')} | {fmt(x.get('ms_per_step'), '.1f')} | "
                             f"{fmt(x.get('tokens_per_s'), ',.0f')} | {fmt(x.get('mfu'), '.1%')} | "
                             f"{fmt(x.get('peak_mem_gib'), '.1f')} | {x.get('error', '')} |")
        elif fname == "train_gpu.json":
            lines.append(f"- {r.get('preset')} ({r.get('params', 0) / 1e6:.0f}M) micro-batch {r.get('batch')} x "
                         f"{r.get('seq_len')}, compile={r.get('compile')}, grad_checkpoint={r.get('grad_checkpoint')}, "
                         f"ssd={r.get('ssd_dispatch')}: {fmt(r.get('tokens_per_s'), ',.0f')} tokens/s, "
                         f"{fmt(r.get('ms_per_step'), '.1f')} ms/step, MFU {fmt(r.get('mfu'), '.1%')}, peak "
                         f"{fmt(r.get('peak_mem_gib'), '.1f')} GiB, warm-up (compile) {fmt(r.get('warmup_s'), '.0f')} s")
        elif fname.startswith("e2e"):
            lines.append(f"- {'PASS' if r.get('ok') else 'FAIL'} ({r.get('meta', {}).get('wall_s')} s)")
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
