"""Render README.md from nbs/index.ipynb (quarto, which nbdev_readme needs, cannot be installed offline).

Markdown cells are copied as they are; code cells become ```python blocks with their text outputs;
cells whose first line is `#| hide` are left out. `--check` exits 1 when README.md is out of date."""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEADER = "<!-- Rendered from nbs/index.ipynb by .ci/render_readme.py: edit the notebook, not this file. -->\n\n"


def cell_text(cell):
    src = "".join(cell["source"])
    lines = src.splitlines()
    if cell["cell_type"] == "markdown":
        return src.strip() + "\n"
    if lines and lines[0].strip().replace(" ", "") in ("#|hide",):
        return ""
    code = "\n".join(l for l in lines if not l.startswith("#|")).strip()
    out = [f"```python\n{code}\n```\n"] if code else []
    for o in cell.get("outputs", []):
        text = "".join(o.get("text", "")) or "".join(o.get("data", {}).get("text/plain", ""))
        if text.strip():
            out.append(f"```\n{text.rstrip()}\n```\n")
    return "\n".join(out)


def render():
    nb = json.loads((ROOT / "nbs" / "index.ipynb").read_text(encoding="utf-8"))
    parts = [t for t in (cell_text(c) for c in nb["cells"]) if t]
    return HEADER + "\n".join(parts)


if __name__ == "__main__":
    text, readme = render(), ROOT / "README.md"
    if "--check" in sys.argv:
        if not readme.exists() or readme.read_text(encoding="utf-8") != text:
            print("README.md is out of date with nbs/index.ipynb: run `python .ci/render_readme.py`")
            sys.exit(1)
        print("README.md matches nbs/index.ipynb")
    else:
        readme.write_text(text, encoding="utf-8")
        print(f"wrote {readme}")
