"""Every bit-exact tensor comparison in the checks says why it is exact.

Exact float equality holds where the same operations run on the same shapes (a save/load round trip, a copy or
permutation, a resumed run on the same batches, token ids, exact zeros); two different computations (padding, another
kernel, chunked vs loop, other batch shapes, another inner size of a matmul) are compared with a stated tolerance
(`nmax`, `test_close`), because BLAS groups a sum by the CPU's vector width and blocking: results that agree bit for bit
on one x86 CPU can differ in the last bit on another (AVX2, AVX-512, AMX).

The rule checked here: in tests/*.py and in the notebooks' non-exported code cells, each positive `torch.equal`,
`np.array_equal`, `Tensor.equal` and `assert_close(..., rtol=0, atol=0)` carries a comment `# exact: <why>` on its
statement (or on a comment line just above it). `test_eq` and `==` also compare ints, strings and shapes, so they are
not checked by this scan; the float `test_eq` checks in the notebooks carry the same comment by convention."""
import ast
import io
import json
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARK = re.compile(r"#.*\bexact:\s*\S")
EXACT_CALLS = {"equal", "array_equal", "assert_array_equal"}


def _is_zero(node):
    return isinstance(node, ast.Constant) and node.value == 0 and not isinstance(node.value, bool)


def _is_exact_call(node):
    "A call that compares tensors bit for bit: torch.equal, np.array_equal, t.equal(u), assert_close(rtol=0, atol=0)."
    if not isinstance(node, ast.Call):
        return False
    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
    if name in EXACT_CALLS:
        return True
    kw = {k.arg: k.value for k in node.keywords}
    return name in ("assert_close", "assert_allclose") and _is_zero(kw.get("rtol")) and _is_zero(kw.get("atol"))


def _negative(call, parents):
    "`not torch.equal(...)`, or `test_eq(torch.equal(...), False)`: a check that values differ."
    up = parents.get(call)
    if isinstance(up, ast.UnaryOp) and isinstance(up.op, ast.Not):
        return True
    return (isinstance(up, ast.Call) and getattr(up.func, "id", "") == "test_eq" and len(up.args) == 2
            and isinstance(up.args[1], ast.Constant) and up.args[1].value is False)


def unjustified(source: str):
    "Line numbers of the bit-exact comparisons in `source` without a `# exact: <why>` comment."
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    comments = {t.start[0]: t.string for t in tokenize.generate_tokens(io.StringIO(source).readline)
                if t.type == tokenize.COMMENT}
    lines = source.splitlines()
    bad = []
    for node in ast.walk(tree):
        if not _is_exact_call(node) or _negative(node, parents):
            continue
        stmt = node
        while not isinstance(stmt, ast.stmt):
            stmt = parents[stmt]
        span = range(stmt.lineno, stmt.end_lineno + 1)
        above = stmt.lineno - 1
        if above >= 1 and lines[above - 1].lstrip().startswith("#"):
            span = range(above, stmt.end_lineno + 1)
        if not any(MARK.search(comments.get(i, "")) for i in span):
            bad.append(node.lineno)
    return bad


def _exported(src: str) -> bool:
    "A cell whose leading `#|` directives include export: library code, not a check."
    for line in src.splitlines():
        if not line.startswith("#|"):
            return False
        if re.match(r"#\|\s*export", line):
            return True
    return False


def check_sources(root: Path = ROOT):
    "(place, source) of every test module and every non-exported notebook code cell (magics blanked)."
    for p in sorted((root / "tests").glob("*.py")):
        if p.name != Path(__file__).name:
            yield p.relative_to(root).as_posix(), p.read_text()
    for p in sorted((root / "nbs").glob("*.ipynb")):
        for c in json.loads(p.read_text())["cells"]:
            src = "".join(c["source"])
            if c["cell_type"] == "code" and not _exported(src):
                src = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in src.splitlines())
                yield f"nbs/{p.name} cell {c.get('id')}", src


def test_the_scan_finds_what_it_should():
    assert unjustified("assert torch.equal(a, b)\n") == [1]
    assert unjustified("assert torch.equal(a, b)  # exact: a copy\n") == []
    assert unjustified("# exact: a save/load round trip\nassert torch.equal(a, b)\n") == []
    assert unjustified("assert torch.equal(a, b)  # exactly the same\n") == [1]          # the marker, with a reason
    assert unjustified("x = 1  # exact: not this one\nassert torch.equal(a, b)\n") == [2]  # a code line above is not a reason
    assert unjustified("for k in d: test_eq(torch.equal(d[k], e[k]), True)\n") == [1]
    assert unjustified("assert all(np.array_equal(u, v)\n           for u, v in z)  # exact: token ids\n") == []
    assert unjustified("assert a.equal(b)\n") == [1]
    assert unjustified("torch.testing.assert_close(a, b, rtol=0, atol=0)\n") == [1]
    assert unjustified("torch.testing.assert_close(a, b, rtol=1e-6, atol=0)\n") == []     # a stated tolerance
    assert unjustified("assert not torch.equal(a, b)\n") == []                              # a check that values differ
    assert unjustified("test_eq(np.array_equal(a, b), False)\n") == []
    assert _exported("#| export\ndef f(): pass") and _exported("#| hide\n#| exporti\nx = 1") and not _exported("x = 1")


def test_every_bit_exact_check_says_why():
    found = [f"{place}: line {n}" for place, src in check_sources() for n in unjustified(src)]
    assert not found, ("bit-exact comparisons without a '# exact: <why>' comment (same ops on the same shapes?) "
                       "- or compare with a stated tolerance:\n" + "\n".join(found))
