"""The results ledger, bench/RESULTS.md: one row per headline number, each read from a committed JSON file.

Every row's number is recomputed from its file by its field expression, and every quote of a row elsewhere (a bold
number followed by a link to the row's id, as in **1.23×** ([`train_cpu.step`](bench/RESULTS.md))) is the row's number.
So a rerun that commits a new JSON file changes one row, and this test names every quote that has to follow it."""
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LEDGER = REPO / "bench" / "RESULTS.md"
COLUMNS = ["id", "what", "number", "date", "machine", "commit", "command", "JSON file", "field"]
# **number** ([`id`](…RESULTS.md)): a quote of a ledger row
QUOTE = re.compile(r"\*\*([^*]+)\*\*\s*\(\[`([\w.]+)`\]\([^)]*RESULTS\.md\)\)")
LINK = re.compile(r"\[`(?!(?:bench/)?RESULTS\.md`)([\w.]+)`\]\([^)]*RESULTS\.md\)")   # a row id (a link to the file itself is not one)


def ledger_rows(text: str) -> dict:
    "{id: {column: cell}} of the ledger table in `text` (cells stripped of their backticks)."
    lines = [l for l in text.splitlines() if l.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    assert head == COLUMNS, f"bench/RESULTS.md columns {head}, expected {COLUMNS}"
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        row = dict(zip(COLUMNS, (c[1:-1] if c.startswith("`") and c.endswith("`") else c for c in cells)))
        assert len(cells) == len(COLUMNS) and row["id"] not in rows, f"malformed or repeated ledger row: {line[:80]}"
        rows[row["id"]] = row
    return rows


def field_value(result: dict, field: str) -> float:
    "The row's field expression evaluated on its JSON (`r`), with only the builtins the ledger's expressions use."
    return eval(field, {"__builtins__": {"next": next, "len": len, "sum": sum, "max": max, "min": min}}, {"r": result})


def matches(cell: str, value: float) -> bool:
    "Whether a number cell ('1.23×', '5.16 GB', '114 s', '315.3', '352') is `value` at the cell's own precision."
    m = re.match(r"[^\d-]*(-?[\d,]*\.?\d+)", cell)
    if not m: return False
    shown = m.group(1).replace(",", "")
    places = len(shown.partition(".")[2])
    return round(float(value), places) == float(shown)


def quoting_texts() -> dict:
    "{where: text} of every file that may quote the ledger: README, the usage guide, bench/README.md, notebook markdown."
    texts = {"README.md": (REPO / "README.md").read_text(), "bench/README.md": (REPO / "bench" / "README.md").read_text()}
    texts.update({str(p.relative_to(REPO)): p.read_text() for p in sorted((REPO / "nbs").glob("*.md"))})
    for nb in sorted((REPO / "nbs").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        texts[str(nb.relative_to(REPO))] = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return {k: " ".join(v.split()) for k, v in texts.items()}


def test_the_checks_can_fail():
    "The parser, the number match and the quote scan reject what they should."
    table = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n| `a.b` | x | 1.23× | d | m | `c` | `cmd` | `f.json` | `r[\"v\"]` |\n"
    assert ledger_rows(table)["a.b"]["field"] == 'r["v"]'
    assert field_value({"v": 1.2251}, 'r["v"]') == 1.2251
    assert matches("1.23×", 1.2251) and not matches("1.23×", 1.236) and matches("5.16 GB", 5.1629) and matches("786", 786.2)
    assert not matches("352", 351) and matches("2,897 MiB", 2897.4)
    assert QUOTE.findall("step **1.23×** ([`train_cpu.step`](bench/RESULTS.md)) the GPT's") == [("1.23×", "train_cpu.step")]
    assert LINK.findall("[`RESULTS.md`](RESULTS.md), [`a.b`](../bench/RESULTS.md)") == ["a.b"]
    with pytest.raises(NameError):
        field_value({}, "open('/etc/passwd')")


def test_each_row_is_its_json():
    "Every row's number is what its field expression reads from its committed JSON file."
    rows = ledger_rows(LEDGER.read_text())
    assert len(rows) >= 10, "the ledger lost its rows"
    wrong = []
    for rid, row in rows.items():
        path = REPO / "bench" / "results" / row["JSON file"]
        assert path.is_file(), f"{rid}: bench/results/{row['JSON file']} is not in the repository"
        assert re.fullmatch(r"[0-9a-f]{7,40}", row["commit"]), f"{rid}: commit {row['commit']!r} is not a git hash"
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", row["date"]), f"{rid}: date {row['date']!r} is not YYYY-MM-DD"
        value = field_value(json.loads(path.read_text()), row["field"])
        if not matches(row["number"], value):
            wrong.append(f"{rid}: the ledger says {row['number']}, {row['JSON file']} gives {value!r}")
    assert not wrong, "ledger rows that differ from their JSON:\n" + "\n".join(wrong)


def test_every_quote_is_its_row():
    "A number quoted with a link to a ledger id is that row's number, and every linked id exists."
    rows = ledger_rows(LEDGER.read_text())
    found, wrong = 0, []
    for where, text in quoting_texts().items():
        wrong += [f"{where}: links unknown ledger id {rid!r}" for rid in LINK.findall(text) if rid not in rows]
        for number, rid in QUOTE.findall(text):
            found += 1
            if rid in rows and number.strip() != rows[rid]["number"]:
                wrong.append(f"{where}: quotes **{number}** for {rid}, the ledger has {rows[rid]['number']}")
    assert found >= 5, "no quotes of the ledger found: the scan no longer matches how the README quotes it"
    assert not wrong, "\n".join(wrong)


def test_readme_and_guide_quote_the_ledger_not_result_files():
    "The README and the usage guide name no dated result file: their numbers come from the ledger."
    named = [(f, m) for f in ("README.md", *(str(p.relative_to(REPO)) for p in (REPO / "nbs").glob("*.md")))
             for m in re.findall(r"bench/results/[\w./-]+", (REPO / f).read_text())]
    assert not named, f"result files named outside the ledger: {named}"
