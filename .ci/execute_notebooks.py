"""Execute one notebook top to bottom on CPU and save its outputs in place (used by .ci/execute_notebooks.sh).

Cells that nbdev_test skips are skipped here too (`#| eval: false`, and cells flagged with a `tst_flags` flag such as
`#| gpu`: their saved outputs are cleared, since this run cannot produce them). Outputs are made portable before the
notebook is written: the repository path, the home directory, temporary directories, the user name and host name are
replaced by placeholders. A cell that raises stops the run, and the notebook on disk is left untouched."""
import getpass
import os
import re
import socket
import sys
import tempfile
import time
from configparser import ConfigParser
from pathlib import Path

from execnb.nbio import read_nb, write_nb
from execnb.shell import CaptureShell

REPO = Path(__file__).resolve().parents[1]


def skip_flags():
    cfg = ConfigParser(delimiters=["="])
    cfg.read(REPO / "settings.ini")
    return set(cfg["DEFAULT"].get("tst_flags", "").split())


def directives(src):
    "The `#| ...` lines at the top of a cell, as lists of words."
    out = []
    for line in src.splitlines():
        if not line.strip(): continue
        m = re.match(r"\s*#\|\s*(.*)", line)
        if not m: break
        out.append(m.group(1).replace(":", ": ").split())
    return out


def skipped(cell, flags):
    if cell.cell_type != "code": return True
    for words in directives(cell.source):
        if words[:2] == ["eval:", "false"] or (words and words[0].rstrip(":") in flags): return True
    return False


def portable(text):
    "Replace machine-specific strings in an output."
    subs = [(sys.prefix, "<venv>"), (sys.base_prefix, "<python>"), (str(REPO), "<repo>"), (str(REPO.resolve()), "<repo>"),
            (str(Path.home()), "~")]
    subs += [(d, "<tmp>") for d in {tempfile.gettempdir(), "/tmp", "/var/tmp"}]
    for old, new in subs: text = text.replace(old, new)
    text = re.sub(r"<tmp>/[\w.\-]+", "<tmp>/…", text)                        # random temp-dir names
    host, user = socket.gethostname(), getpass.getuser()
    if len(host) > 3: text = text.replace(host, "<host>")
    if len(user) > 3 and user not in ("user", "root"): text = re.sub(rf"\b{re.escape(user)}\b", "<user>", text)
    return text


def clean(obj):
    if isinstance(obj, str): return portable(obj)
    if isinstance(obj, list): return [clean(o) for o in obj]
    if isinstance(obj, dict): return {k: (v if k == "image/png" else clean(v)) for k, v in obj.items()}
    return obj


def main(fn):
    fn = Path(fn).resolve()
    flags = skip_flags()
    nb = read_nb(fn)
    shell = CaptureShell(fn, mpl_format="png")
    t0 = time.time()
    cwd = os.getcwd()
    os.chdir(fn.parent)
    try:
        for cell in nb.cells:
            if skipped(cell, flags):
                if cell.cell_type == "code": cell.outputs = []
                continue
            cell.outputs = []
            shell.cell(cell)
            if shell.exc:
                sys.stderr.write(shell.prettytb(fname=fn.relative_to(REPO)) + "\n")
                return 1
            cell.outputs = [clean(dict(o)) for o in cell.get("outputs", [])]
    finally:
        os.chdir(cwd)
    write_nb(nb, fn)
    print(f"{fn.relative_to(REPO)}: {time.time() - t0:.0f} s, {fn.stat().st_size / 1e6:.2f} MB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
