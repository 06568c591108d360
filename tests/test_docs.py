"""The notebooks and the README speak for themselves: no citation of a document the repository does not hold
(a design spec, numbered pitfalls, issue or pull-request numbers, "the reference", a tuning guide, files outside
the repository) and no development history (which machine ran what, "before this change"). Sources are cited by
URL instead: the Mamba-3 paper (https://arxiv.org/abs/2603.15569) and the official code
(https://github.com/state-spaces/mamba)."""
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# (pattern, what is wrong with it); matched case-insensitively against every cell's source and text outputs
FORBIDDEN = [
    (r"\bspec\s*§|\bspec\s+T\d|\bthe spec\b|MAMBA3_SPEC", "cites a design spec the repository does not hold"),
    (r"(?<![\w.])shared/", "cites a file outside the repository"),
    (r"\bpitfalls?\s*#?\d", "names a pitfall by number instead of saying what it is"),
    (r"\bPR\s*#\s*\d*|\bpull request\s*#?\d", "cites a pull request"),
    (r"\bissues?\s*#?\d", "cites an issue number"),
    (r"\bthe reference\b", 'leans on "the reference", which a reader never sees'),
    (r"\btuning guide\b", "cites a tuning guide the repository does not hold"),
    (r"\b(before|after|until) this (change|commit|PR|issue)\b", "development history: belongs in git log"),
    (r"\b(was|were|been) lent\b|\bno GPU was\b|\bthis session\b|\bno GPU (is|was) available to\b|\bdevelopment (box|machine)\b"
     r"|\bis developed (and tested )?on\b", "development history: which machine ran what"),
]


def documents():
    for nb in sorted((REPO / "nbs").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
            yield f"{nb.relative_to(REPO)} cell {i}", "".join(cell["source"])
            for out in cell.get("outputs", []):
                text = out.get("text") or out.get("data", {}).get("text/plain") or out.get("data", {}).get("text/markdown") or ""
                yield f"{nb.relative_to(REPO)} cell {i} output", "".join(text)
    yield "README.md", (REPO / "README.md").read_text()


def hits(text):
    for pattern, why in FORBIDDEN:
        for m in re.finditer(pattern, text, flags=re.IGNORECASE):
            line = text[: m.start()].count("\n") + 1
            yield f"line {line}: {m.group(0)!r} ({why})"


@pytest.mark.parametrize("text, expected", [
    ("as the spec §4 says", 1), ("(spec T9)", 1), ("def config_path(spec):", 0), ("see shared/design/MAMBA3_SPEC.md", 2), ("pitfall 3 bites here", 1),
    ("fixed in PR #12", 1), ("issue 7 asked for it", 1), ("like the reference does", 1), ("the tuning guide", 1),
    ("(Before this change the kernel had two biases)", 1), ("the GPU was lent for this session", 2), ("No GPU has been lent to the project yet", 1),
    ("on the development box", 1), ("the machine this project is developed and tested on", 1),
    ("the official code (https://github.com/state-spaces/mamba) computes §4.2 of the paper", 0),
    ("a reference implementation beside every kernel", 0), ("tests/shared_fixture.py", 0),
])
def test_scan_catches_what_it_should(text, expected):
    assert len(list(hits(text))) == expected, list(hits(text))


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
    "Each notebook is committed with its outputs (run .ci/execute_notebooks.sh): every figure it draws is saved as a PNG."
    assert nb.stat().st_size < 1.5e6, f"{nb.name} is {nb.stat().st_size / 1e6:.2f} MB (limit 1.5 MB)"
    cells = json.loads(nb.read_text())["cells"]
    missing = [i for i, cell in plotting_cells({"cells": cells})
               if not any("image/png" in out.get("data", {}) for out in cell.get("outputs", []))]
    assert not missing, f"{nb.name}: cells {missing} draw a figure but have no saved PNG; run .ci/execute_notebooks.sh {nb.relative_to(REPO)}"


def test_readme_links_every_notebook():
    "The README's notebook table links each numbered notebook by its relative path."
    readme = (REPO / "README.md").read_text()
    unlinked = [nb.name for nb in sorted((REPO / "nbs").glob("[0-9][0-9]*_*.ipynb")) if f"](nbs/{nb.name})" not in readme]
    assert not unlinked, f"README.md does not link {unlinked}; add them to the table in nbs/index.ipynb and run .ci/render_readme.py"
