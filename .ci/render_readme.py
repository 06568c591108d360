"""Render README.md from nbs/index.ipynb (quarto, which nbdev_readme needs, cannot be installed offline).

Markdown cells are copied as they are; code cells become ```python blocks with their text outputs;
cells whose first line is `#| hide` are left out. The README's figure is the saved plot of one cell of a notebook
(`FIGURE`), written to an image file beside the notebooks. `--check` exits 1 when README.md or the image is out of date."""
import base64
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIGURE = ("00_ssd.ipynb", "c0a5e1f2", ROOT / "nbs" / "images" / "00_ssd_trapezoid.png")   # notebook, cell id, image
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


def figure() -> bytes:
    "The PNG of the README's figure: the one plot saved in the output of cell `FIGURE[1]` of `FIGURE[0]`."
    nb, cell_id, _ = FIGURE
    cells = json.loads((ROOT / "nbs" / nb).read_text(encoding="utf-8"))["cells"]
    found = [c for c in cells if c.get("id") == cell_id]
    if not found: sys.exit(f"render_readme: nbs/{nb} has no cell {cell_id} (the README's figure)")
    pngs = [o["data"]["image/png"] for o in found[0].get("outputs", []) if "image/png" in o.get("data", {})]
    if len(pngs) != 1: sys.exit(f"render_readme: cell {cell_id} of nbs/{nb} saved {len(pngs)} plots, expected 1 (run .ci/execute_notebooks.sh)")
    return base64.b64decode(pngs[0])


if __name__ == "__main__":
    text, readme, png, image = render(), ROOT / "README.md", figure(), FIGURE[2]
    if "--check" in sys.argv:
        stale = [p.name for p, want in ((readme, text.encode()), (image, png)) if not p.exists() or p.read_bytes() != want]
        if stale:
            print(f"{', '.join(stale)} out of date with the notebooks: run `python .ci/render_readme.py`")
            sys.exit(1)
        print("README.md and its figure match the notebooks")
    else:
        readme.write_text(text, encoding="utf-8")
        image.parent.mkdir(exist_ok=True)
        image.write_bytes(png)
        print(f"wrote {readme} and {image.relative_to(ROOT)}")
