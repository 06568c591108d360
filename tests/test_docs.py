"""The notebooks, the README and bench/ speak for themselves: no citation of a document the repository does not hold
(a design spec, numbered pitfalls, issue or pull-request numbers, "the reference", "the issue", a tuning guide, files
outside the repository), no target quoted from such a document, and no development history (which machine ran what,
"before this change", a "(current)" version). Sources are cited by URL instead: the Mamba-3 paper
(https://arxiv.org/abs/2603.15569) and the official code (https://github.com/state-spaces/mamba).

Each text is matched with its whitespace runs (and a `#` that continues a comment on the next line) read as one
space, so a phrase broken across lines is still found; a hit is reported at the line where it starts.

Notebooks also show what they check: an agreement check prints its measured error beside its bound. Numbers quoted
from committed benchmark results (bench/results/*.json) are rebuilt from those files, and a result quoted in more
than one place is quoted the same everywhere."""
import bisect
import io
import json
import math
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# (pattern, what is wrong with it); matched case-insensitively against every cell's source and text outputs, the README,
# bench/README.md and the comments and strings of bench/*.py, each with its whitespace joined (see `joined`)
FORBIDDEN = [
    (r"\bspec\s*§|\bspec\s+T\d|\bthe spec\b|MAMBA3_SPEC", "cites a design spec the repository does not hold"),
    (r"(?<![\w.])shared/", "cites a file outside the repository"),
    (r"\bpitfalls?\s*#?\d", "names a pitfall by number instead of saying what it is"),
    (r"\bPR\s*#\s*\d*|\bpull request\s*#?\d", "cites a pull request"),
    (r"\bissues?\s*#?\d", "cites an issue number"),
    (r"\bthe reference('s)?\b(?! (implementation|oracle))", 'leans on "the reference", which a reader never sees'),
    (r"\bthe issue('s)?\b", 'leans on "the issue", which a reader never sees'),
    (r"\bthe targets? (is|are|of)\b", "quotes a target from a document the repository does not hold: state what is measured"),
    (r"\btuning guide\b", "cites a tuning guide the repository does not hold"),
    (r"\b(before|after|until) this (change|commit|PR|issue)\b", "development history: belongs in git log"),
    (r"\b(was|were|been) lent\b|\bno GPU was\b|\bthis session\b|\bno GPU (is|was) available to\b|\bdevelopment (box|machine)\b"
     r"|\bis developed (and tested )?on\b", "development history: which machine ran what"),
    (r"\((current|release)\)", "development history: say which version (a release, a commit) instead of (current)/(release)"),
]


def documents():
    for nb in sorted((REPO / "nbs").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
            yield f"{nb.relative_to(REPO)} cell {i}", "".join(cell["source"])
            for out in cell.get("outputs", []):
                text = out.get("text") or out.get("data", {}).get("text/plain") or out.get("data", {}).get("text/markdown") or ""
                yield f"{nb.relative_to(REPO)} cell {i} output", "".join(text)
    yield "README.md", (REPO / "README.md").read_text()
    yield "bench/README.md", (REPO / "bench" / "README.md").read_text()
    for script in sorted((REPO / "bench").glob("*.py")):
        yield str(script.relative_to(REPO)), python_prose(script.read_text())


def python_prose(source):
    "The comments and string literals of a Python source, in place (same lines and columns), the code blanked: a variable called `reference` is code, not prose."
    lines = source.splitlines(keepends=True)
    out = [re.sub(r"[^\n]", " ", line) for line in lines]
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.STRING): continue
        r0, c0 = tok.start
        text = tok.string.lstrip("#") if tok.type == tokenize.COMMENT else tok.string
        c0 += len(tok.string) - len(text)
        for k, part in enumerate(text.split("\n")):
            r, c = r0 - 1 + k, (c0 if k == 0 else 0)
            out[r] = out[r][:c] + part + out[r][c + len(part):]
    return "".join(out)


def joined(text):
    "(text with every whitespace run, and a newline + `#` that continues a comment, as one space; offset in `text` of each joined piece)."
    pieces, starts, pos = [], [], 0
    for m in re.finditer(r"(?:\s*\n\s*#(?!\|)\s*|\s+)", text):
        pieces.append(text[pos:m.start()]); starts.append(pos); pos = m.end()
    pieces.append(text[pos:]); starts.append(pos)
    offsets = [0]
    for piece in pieces[:-1]: offsets.append(offsets[-1] + len(piece) + 1)
    return " ".join(pieces), offsets, starts


def hits(text):
    flat, offsets, starts = joined(text)
    for pattern, why in FORBIDDEN:
        for m in re.finditer(pattern, flat, flags=re.IGNORECASE):
            k = bisect.bisect_right(offsets, m.start()) - 1
            line = text[: starts[k] + m.start() - offsets[k]].count("\n") + 1
            yield f"line {line}: {' '.join(m.group(0).split())!r} ({why})"


@pytest.mark.parametrize("text, expected", [
    ("as the spec §4 says", 1), ("(spec T9)", 1), ("def config_path(spec):", 0), ("see shared/design/MAMBA3_SPEC.md", 2), ("pitfall 3 bites here", 1),
    ("fixed in PR #12", 1), ("issue 7 asked for it", 1), ("like the reference does", 1), ("the tuning guide", 1),
    ("(Before this change the kernel had two biases)", 1), ("the GPU was lent for this session", 2), ("No GPU has been lent to the project yet", 1),
    ("on the development box", 1), ("the machine this project is developed and tested on", 1),
    ("the official code (https://github.com/state-spaces/mamba) computes §4.2 of the paper", 0),
    ("a reference implementation beside every kernel", 0), ("tests/shared_fixture.py", 0),
    ("The\nreference's own numbers", 1), ("as the\n  reference did", 1), ("# compare with the\n# reference's spelling", 1),
    ("checked against the reference implementation", 0), ("the\nreference oracle", 0), ("reference = ssd_naive(x)", 0),
    ("measures the issue's configuration", 1), ("the\nissue asks", 1), ("the target is >=100k tokens/s", 1),
    ("the target\n  is 100k", 1), ('label="heavy tail f (current)"', 1), ('label="softplus (release)"', 1),
    ("mamba-ssm 2.3.2.post1 (PyPI release)", 0), ("targets a GPU", 0), ("stop(new) or f(old)", 0),
])
def test_scan_catches_what_it_should(text, expected):
    assert len(list(hits(text))) == expected, list(hits(text))


def test_hits_name_the_line_where_a_broken_phrase_starts():
    assert [h.split(":")[0] for h in hits("one\ntwo the\n\n   reference's\nthree")] == ["line 2"]


def test_python_prose_keeps_comments_and_strings_in_place():
    src = 'reference = 1  # the\n# reference\'s spelling\nx = "the issue"\n'
    prose = python_prose(src)
    assert prose.count("\n") == src.count("\n") and "reference =" not in prose
    assert [h.split(" (")[0] for h in hits(prose)] == ["line 1: \"the reference's\"", "line 3: 'the issue'"]


def test_notebooks_and_readme_are_self_contained():
    found = [f"{where} {h}" for where, text in documents() for h in hits(text)]
    assert not found, f"{len(found)} references a reader cannot follow:\n" + "\n".join(found)


def plotting_cells(nb):
    "Code cells that show a figure (plt.show, display(Image)) and that a CPU run executes (not `#| gpu`, `#| eval: false` or an export)."
    for i, cell in enumerate(nb["cells"]):
        src = "".join(cell["source"])
        if cell["cell_type"] != "code" or re.search(r"^\s*#\|\s*(gpu|eval:\s*false|export)", src, flags=re.M): continue
        if re.search(r"\bplt\.show\(|\bdisplay\(Image\(", src): yield i, cell


@pytest.mark.parametrize("nb", sorted((REPO / "nbs").glob("*.ipynb")), ids=lambda p: p.name)
def test_notebook_is_saved_executed_with_its_plots(nb):
    "Each notebook is committed with its outputs (run .ci/execute_notebooks.sh): every figure it draws is saved as a PNG, and one with examples shows what they print."
    assert nb.stat().st_size < 1.5e6, f"{nb.name} is {nb.stat().st_size / 1e6:.2f} MB (limit 1.5 MB)"
    cells = json.loads(nb.read_text())["cells"]
    missing = [i for i, cell in plotting_cells({"cells": cells})
               if not any("image/png" in out.get("data", {}) for out in cell.get("outputs", []))]
    assert not missing, f"{nb.name}: cells {missing} draw a figure but have no saved PNG; run .ci/execute_notebooks.sh {nb.relative_to(REPO)}"
    examples = [c for c in cells if c["cell_type"] == "code" and not re.search(r"^\s*#\|\s*(export|hide|gpu)", "".join(c["source"]), flags=re.M)]
    assert not examples or any(c.get("outputs") for c in cells), (
        f"{nb.name}: {len(examples)} example cells and not one saved output; run .ci/execute_notebooks.sh {nb.relative_to(REPO)}")


def test_readme_links_every_notebook():
    "The README's notebook table links each numbered notebook by its relative path."
    readme = (REPO / "README.md").read_text()
    unlinked = [nb.name for nb in sorted((REPO / "nbs").glob("[0-9][0-9]*_*.ipynb")) if f"](nbs/{nb.name})" not in readme]
    assert not unlinked, f"README.md does not link {unlinked}; add them to the table in nbs/index.ipynb and run .ci/render_readme.py"


def test_bench_readme_lists_every_script():
    "bench/README.md tells a newcomer what each script is for: a table row starting with it (CPU, GPU or helper table)."
    readme = (REPO / "bench" / "README.md").read_text()
    scripts = sorted(f.name for f in (REPO / "bench").iterdir() if f.suffix in (".py", ".sh"))
    unlisted = [name for name in scripts if not re.search(rf"^\| `{re.escape(name)}[` ]", readme, flags=re.M)]
    assert not unlisted, f"bench/README.md has no table row for {unlisted}: add one to the CPU, GPU or helper table"


def test_section_citations_exist():
    "A citation such as `00_ssd` §11 names a numbered heading that the cited notebook has (02_block's sections are titled, not numbered)."
    cited = [(where, nb, sec) for where, text in documents()
             for nb, sec in re.findall(r"`?(\d\d[a-z]?_\w+)`?\s*\(?§\s*(\d+(?:\.\d+)*)", text)]
    assert cited, "no section citations found: the pattern no longer matches how notebooks cite each other"
    missing = []
    for where, nb, sec in cited:
        path = REPO / "nbs" / f"{nb}.ipynb"
        cells = json.loads(path.read_text())["cells"] if path.exists() else []
        heads = {m for c in cells if c["cell_type"] == "markdown"
                 for m in re.findall(r"^#+\s+(\d+(?:\.\d+)*)\.?\s", "".join(c["source"]), flags=re.M)}
        if sec not in heads: missing.append(f"{where}: {nb} §{sec} (its numbered sections: {sorted(heads) or 'none'})")
    assert not missing, "citations of sections that do not exist:\n" + "\n".join(missing)


# An agreement check shows the number it measured: a bare `test_close(` or `assert nmax(` passes or fails without
# saying by how much. Such a check goes through `check_close` / `check_worst` / `assert_grads_close`
# (mamba3_lite.testing), or its cell prints the value.
SILENT_CHECK = re.compile(r"\btest_close\(|\bassert\s+nmax\(")
SHOWS_VALUE = re.compile(r"\bprint\(|\bcheck_close\(|\bcheck_worst\(|\bassert_grads_close\(|\bdisplay\(")


def silent_checks(nb):
    "(index, first line) of each code cell, not an export, with a bare `test_close(` / `assert nmax(` and nothing that shows a value."
    for i, cell in enumerate(nb["cells"]):
        src = "".join(cell["source"])
        if cell["cell_type"] != "code" or re.search(r"^\s*#\|\s*export", src, flags=re.M): continue
        if SILENT_CHECK.search(src) and not SHOWS_VALUE.search(src):
            yield i, SILENT_CHECK.search(src).group(0) + " ... in: " + src.strip().splitlines()[0][:60]


def test_silent_check_scan_catches_what_it_should():
    cell = lambda src: {"cell_type": "code", "source": [src]}
    nb = {"cells": [cell("test_close(a, b, eps=1e-6)"), cell("assert nmax(y, ref) < 1e-5"), cell("assert  nmax(y, ref) < 1e-5 and ok"),
                    cell("check_close(a, b, 1e-6, 'y')"), cell("e = nmax(y, ref)\nprint(f'{e:.1e}'); assert e < 1e-5"),
                    cell("test_close(a, b)\nassert_grads_close(g, r, 1e-3)"), cell("#| export\ndef f(a, b): test_close(a, b)"),
                    {"cell_type": "markdown", "source": ["test_close(a, b)"]}, cell("test_eq(a, b)"), cell("assert max(errs) < 1e-5")]}
    assert [i for i, _ in silent_checks(nb)] == [0, 1, 2]


@pytest.mark.parametrize("nb", sorted((REPO / "nbs").glob("*.ipynb")), ids=lambda p: p.name)
def test_agreement_checks_show_their_number(nb):
    "Every agreement check in a notebook prints its measured error beside its bound (`check_close`, `check_worst`, a print)."
    found = list(silent_checks(json.loads(nb.read_text())))
    assert not found, f"{nb.name}: {len(found)} cells check agreement without showing the number:\n" + "\n".join(
        f"  cell {i}: {what}" for i, what in found)


# Numbers the README (nbs/index.ipynb) quotes from a committed benchmark result are rebuilt here from that file: a
# re-run that writes a new result and leaves the prose behind fails, and so does a number edited by hand.
def _rows(result):
    return {(r["model"], r["variant"]): r for r in result["rows"]}


def _load_range(m, sep):
    lo, hi = sorted((m["load_average_1min_start"], m["load_average_1min_end"]))
    return f"{math.floor(lo)}–{math.ceil(hi)}" if sep == "–" else f"{m['load_average_1min_start']:.0f} → {m['load_average_1min_end']:.0f}"


ISA_NAMES = {"avx2": "AVX2", "avx512f": "AVX-512", "avx512_bf16": "AVX-512 BF16", "amx_tile": "AMX"}


def train_cpu_quotes(result):
    rows, r, cpu = _rows(result), result["ratios"], lambda k: _rows(result)[k]["cpu_s_per_step"]["median"]
    rss, m = lambda k: f"{rows[k]['peak_rss_mib']:,.0f}", result["machine"]
    cpu_named = [f"{m['cpu_model']} ({', '.join(ISA_NAMES[f] for f in m['isa_flags'])})"] if "cpu_model" in m else []
    return cpu_named + [f"step **{r['mamba3/gpt step/chunked cpu, 1 thread(s)']:.2f}×** the GPT's "
            f"({cpu(('mamba3', 'step/chunked')):.2f} vs {cpu(('gpt', 'step/chunked')):.2f} s)",
            f"backbone alone {r['mamba3/gpt backbone cpu, 1 thread(s)']:.2f}× "
            f"({cpu(('mamba3', 'backbone')):.2f} vs {cpu(('gpt', 'backbone')):.2f} s)",
            f"load average {_load_range(result['machine'], '–')}",
            f"peak RSS **{rss(('mamba3', 'step/full'))} → {rss(('mamba3', 'step/chunked'))} MiB** (Mamba) and "
            f"{rss(('gpt', 'step/full'))} → {rss(('gpt', 'step/chunked'))} MiB (GPT); step CPU time "
            f"{r['mamba3 chunked/full cpu, 1 thread(s)']:.2f}× and {r['gpt chunked/full cpu, 1 thread(s)']:.2f}×"]


def train_cpu_compile_quotes(result):
    r, cpu = result["ratios"], lambda k: _rows(result)[k]["cpu_s_per_step"]["median"]
    return [f"load average {_load_range(result['machine'], '→')}",
            f"**{r['mamba3 compiled/eager cpu, 1 thread(s)']:.2f}×** the eager one's CPU time "
            f"({cpu(('mamba3', 'step/compiled')):.2f} vs {cpu(('mamba3', 'step/chunked')):.2f} s)",
            f"compiles for **{r['mamba3 compile cost, CPU s (first step - steady step)']:.0f} CPU-s**",
            f"about **{round(r['mamba3 compile break-even, steps'], -1):,.0f} steps**"]


def newest(pattern):
    "The name of the newest committed bench/results file matching `pattern` (dated names sort by date)."
    return sorted(p.name for p in (REPO / "bench" / "results").glob(pattern))[-1]


def decode_cpu_quotes(result):
    row = result["rows"]["this tree"]
    return [f"**{row['tokens_per_s_median']:.1f} tokens/s**, {row['aten_ops_per_step']:,} aten ops per decode step",
            f"load average {result['load_average_1min']:.0f})"]


def ssd_mamba2_quotes(result):
    ratios = [", ".join(f"{r['ratio_to_ssd_chunked']['ssd_minimal_discrete']:.2f}×" for r in run["rows"]) for run in result["runs"]]
    return [f"`ssd_minimal_discrete` takes {ratios[0]} our time", f"and {ratios[1]} at T ="]


def _traffic_totals(result):
    return {r["phase"]: r["bytes"] / 1e9 for r in result["rows"] if r["kernel"] == "total"}


def ssd_traffic_quotes(result):
    total = _traffic_totals(result)
    return [f"forward **{total['fwd']:.2f} GB**, forward + backward **{total['fwd+bwd']:.2f} GB**"]


def ssd_traffic_official_quotes(result):
    "The official op's counted totals, and ours over them (ours: the newest ssd_traffic result)."
    theirs, ours = _traffic_totals(result), _traffic_totals(json.loads((REPO / "bench" / "results" / TRAFFIC).read_text()))
    return [f"forward **{theirs['fwd']:.2f} GB**, forward + backward **{theirs['fwd+bwd']:.2f} GB**",
            f"{ours['fwd'] / theirs['fwd']:.2f}× and {ours['fwd+bwd'] / theirs['fwd+bwd']:.2f}× its bytes",
            re.search(r"mamba_ssm [^)]+", result["implementation"])[0]]


TRAFFIC = newest("ssd_traffic_2???-??-??.json")
TRAIN_CPU = newest("train_cpu_2???-??-??*.json")   # a second run of a day: train_cpu_<date>T<HHMM>.json
QUOTED_RESULTS = {TRAIN_CPU: train_cpu_quotes, "decode_cpu_ops_2026-12-02.json": decode_cpu_quotes,
                  newest("ssd_cpu_mamba2_2???-??-??.json"): ssd_mamba2_quotes, newest("train_cpu_compile_2???-??-??.json"): train_cpu_compile_quotes,
                  TRAFFIC: ssd_traffic_quotes, newest("ssd_traffic_official_2???-??-??.json"): ssd_traffic_official_quotes}


def markdown_text(nb):
    "The markdown of a notebook, its whitespace runs joined into single spaces."
    cells = json.loads(nb.read_text())["cells"]
    return " ".join("\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown").split())


def index_text():
    return markdown_text(REPO / "nbs" / "index.ipynb")


def prose_texts():
    "{where: joined text} of every notebook's markdown and bench/README.md: where a quoted result could be repeated."
    texts = {nb.name: markdown_text(nb) for nb in sorted((REPO / "nbs").glob("*.ipynb"))}
    return {**texts, "bench/README.md": " ".join((REPO / "bench" / "README.md").read_text().split())}


@pytest.mark.parametrize("name", sorted(QUOTED_RESULTS))
def test_index_quotes_the_committed_results(name):
    "Each number index.ipynb quotes from a bench/results file is that file's number, and the file is named beside it."
    text, quotes = index_text(), QUOTED_RESULTS[name](json.loads((REPO / "bench" / "results" / name).read_text()))
    assert f"bench/results/{name}" in text, f"nbs/index.ipynb quotes bench/results/{name} without naming it"
    missing = [q for q in quotes if q not in text]
    assert not missing, f"nbs/index.ipynb does not quote bench/results/{name} as it is; expected:\n" + "\n".join(missing)


def same_number(a: str, b: str) -> bool:
    "Whether two quoted decimals agree at the coarser of their two precisions (3.90 and 3.903 do; 3.78 and 3.903 do not)."
    places = min(len(x.partition(".")[2]) for x in (a, b))
    return round(float(a), places) == round(float(b), places)


# "Validation loss 10.815 → 3.903", "Validation loss (first 64 windows) 10.81 (step 0) → 4.77 (50) → … → **3.78 (300)**"
VAL_LOSS_CHAIN = re.compile(r"[Vv]alidation loss(?: \([^)]*\))?(?: went)? \**(\d+\.\d+)\**(?: \([^)]*\))?\**((?: → \**\d+\.\d+\**(?: \([^)]*\))?\**)+)")


def val_loss_quotes(text):
    "(first, last) of each validation-loss chain quoted in `text`."
    return [(m[1], re.findall(r"\d+\.\d+", re.sub(r"\([^)]*\)", "", m[2]))[-1]) for m in VAL_LOSS_CHAIN.finditer(text)]


def gpt_ratio_parts(text):
    "(part, its ratios) for each sentence or table cell of `text` that names the GPT and quotes `N.NN×` or `ratio N.NN`."
    for part in re.split(r"(?<=[.;|])\s", text):
        if "GPT" in part.replace("GPT-2", ""):
            found = [r for r in re.findall(r"(\d+\.\d\d)×|ratio \**(\d+\.\d\d)", part) for r in r if r]
            if found:
                yield part, found


def gpt_ratios(text):
    "The Mamba-3 / GPT ratios quoted in `text`."
    return [r for _, found in gpt_ratio_parts(text) for r in found]


def test_the_quote_scans_find_what_they_should():
    assert val_loss_quotes("Validation loss went **10.815 → 3.903** (first") == [("10.815", "3.903")]
    assert val_loss_quotes("Validation loss (first 64 windows) 10.81 (step 0) → 4.77 (50) → **3.78 (300)**, 7") == [("10.81", "3.78")]
    assert val_loss_quotes("validation loss on the first 64 tokens 6.285 → 6.239") == []
    assert gpt_ratios("a same-size GPT 2,213 tokens/s — ratio **0.84**; at 2 × 1024. The SSD is 32.9× faster.") == ["0.84"]
    assert gpt_ratios("| step **1.22×** the GPT's (2.82 vs 2.30 s) | GPT-2 BPE 3.50× |") == ["1.22"]
    assert same_number("3.90", "3.903") and not same_number("3.78", "3.903")


def test_quickstart_validation_loss_is_quoted_one_way():
    "The quickstart's validation losses are quoted the same wherever they are given (any notebook, bench/README.md), and index's drop is their difference."
    quotes = [(where, q) for where, text in prose_texts().items() for q in val_loss_quotes(text)]
    (first, last), = val_loss_quotes(re.split(r"## Measured numbers", index_text())[0])[:1] or [(None, None)]
    assert first, "index.ipynb no longer quotes the quickstart's validation loss where this test looks for it"
    differ = [(where, q) for where, q in quotes if not (same_number(q[0], first) and same_number(q[1], last))]
    assert not differ, f"index.ipynb quotes the quickstart's validation loss as {first} → {last}, elsewhere: {differ}"
    drop = re.search(r"\*\*−(\d+\.\d+) nats\*\*", index_text())
    assert drop and abs(float(first) - float(last) - float(drop[1])) < 0.006, (first, last, drop and drop[1])


def test_gpt_ratios_are_the_committed_ones_everywhere():
    """Any notebook or bench/README.md that quotes a Mamba-3 / GPT ratio quotes one that a committed
    bench/results/train_cpu_*.json holds: the file its sentence names, else the newest."""
    committed = lambda name: {f"{v:.2f}" for v in json.loads((REPO / "bench" / "results" / name).read_text())["ratios"].values()}
    quoted, stray = [], []
    for where, text in prose_texts().items():
        for part, found in gpt_ratio_parts(text):
            names = re.findall(r"train_cpu_2[0-9T-]+\.json", part) or [TRAIN_CPU]
            held = set().union(*map(committed, names))
            quoted += found
            stray += [(where, names, r) for r in found if r not in held]
    assert quoted, "no Mamba-3 / GPT ratio found: the scan no longer matches how index.ipynb quotes it"
    assert not stray, f"ratios not in the train_cpu results their sentence names (or the newest, {TRAIN_CPU}): {stray}"


def test_loss_notebook_quotes_the_committed_loss_bench():
    "03a_loss's layout and chunk-size figures are those of the newest bench/results/loss_cpu_<date>.json, named beside them."
    name = newest("loss_cpu_2???-??-??.json")
    result = json.loads((REPO / "bench" / "results" / name).read_text())
    r, c = result["ratios"], result["default_chunk"]
    text = markdown_text(REPO / "nbs" / "03a_loss.ipynb")
    base = next(k for k in r if k.startswith(f"loss chunk {c}: this tree / "))
    quotes = [f"bench/results/{name}",
              f"products {r['logits: view / row-major']:.1f}× and {r['weight gradient: G^T H / H^T G']:.1f}× slower",
              f"{1 / r[base]:.1f}× slower, with the same values",
              f"within {math.ceil(100 * abs(r[f'loss chunk 64 / chunk {c}'] - 1))}% of each other",
              f"32-token chunks were {r[f'loss chunk 32 / chunk {c}']:.2f}× slower",
              f"512-token ones {r[f'loss chunk 512 / chunk {c}']:.2f}×"]
    missing = [q for q in quotes if q not in text]
    assert not missing, f"nbs/03a_loss.ipynb does not quote bench/results/{name} as it is; expected:\n" + "\n".join(missing)
