"""The notebooks, the README and bench/ speak for themselves: no citation of a document the repository does not hold
(a design spec, numbered pitfalls, issue or pull-request numbers, "the reference", "the issue", a tuning guide, files
outside the repository), no target quoted from such a document, and no development history (which machine ran what,
"before this change", a "(current)" version). Sources are cited by URL instead: the Mamba-3 paper
(https://arxiv.org/abs/2603.15569) and the official code (https://github.com/state-spaces/mamba).

Each text is matched with its whitespace runs (and a `#` that continues a comment on the next line) read as one
space, so a phrase broken across lines is still found; a hit is reported at the line where it starts.

Notebooks also show what they check: an agreement check prints its measured error beside its bound. Numbers quoted
from committed benchmark results go through the results ledger, bench/RESULTS.md (tests/test_results_ledger.py).
The README fits its readers: at most 10 KB, its figure in the repository."""
import bisect
import io
import json
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
    for md in sorted((REPO / "nbs").glob("*.md")): yield str(md.relative_to(REPO)), md.read_text()
    yield "bench/README.md", (REPO / "bench" / "README.md").read_text()
    yield "bench/RESULTS.md", (REPO / "bench" / "RESULTS.md").read_text()
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


def test_readme_fits_on_a_screen_or_two():
    "README.md is at most 10 KB (the rest lives in the usage guide, nbs/usage.md) and every image it shows exists."
    readme = (REPO / "README.md").read_text()
    size = len(readme.encode())
    assert size <= 10 * 1024, f"README.md is {size:,} bytes (at most 10,240): move detail to nbs/usage.md"
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", readme)
    assert images and all((REPO / p).is_file() for p in images), f"README images {images}: missing files"
    assert "](nbs/usage.md)" in readme, "the README no longer links the usage guide"


# In the SSD notebooks every check shows what it checked: a cell that asserts prints (or plots) its evidence.
SHOWS_EVERY_CHECK = ("00_ssd", "00a_ssd_fast")


def checks_without_output(nb):
    "(index, first line) of each code cell, neither exported nor hidden, that checks something and saved no output."
    for i, cell in enumerate(nb["cells"]):
        src = "".join(cell["source"])
        if cell["cell_type"] != "code" or re.search(r"^\s*#\|\s*(export|hide)", src, flags=re.M): continue
        if re.search(r"\bassert\b|\btest_(eq|fail|close)\(|\bcheck_(close|worst)\(", src) and not cell.get("outputs"):
            yield i, src.strip().splitlines()[0][:60]


def test_check_scan_catches_what_it_should():
    cell = lambda src, out=(): {"cell_type": "code", "source": [src], "outputs": list(out)}
    nb = {"cells": [cell("assert x"), cell("test_eq(a, b)", [{"text": "1"}]), cell("#| hide\nassert x"), cell("y = 1")]}
    assert [i for i, _ in checks_without_output(nb)] == [0]


@pytest.mark.parametrize("name", SHOWS_EVERY_CHECK)
def test_every_check_shows_its_number(name):
    found = list(checks_without_output(json.loads((REPO / "nbs" / f"{name}.ipynb").read_text())))
    assert not found, f"{name}: cells that check without showing anything: {found}"
