"""`prepare` from the formats corpora ship in — parquet files and directories, Hugging Face datasets (a
`save_to_disk` directory, `load_dataset` streaming over local json/parquet files) — checked token for token
against the same texts prepared from .jsonl; --max-tokens, resume after an interruption, bad columns, the CLI
flags, and the one-line error of a missing extra. No network: HF_DATASETS_OFFLINE / HF_HUB_OFFLINE are set.
Skipped (with the reason) only where the `data` extra is not installed."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pyarrow", reason="pyarrow is not installed: pip install 'mamba3-lite[data]'")
pytest.importorskip("datasets", reason="datasets is not installed: pip install 'mamba3-lite[data]'")
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"

import datasets  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from mamba3_lite.data import Shard  # noqa: E402
from mamba3_lite.prepare import MissingExtraError, iter_parquet_documents, prepare_corpus  # noqa: E402
from mamba3_lite.testing import gpt2_available  # noqa: E402

pytestmark = pytest.mark.skipif(not gpt2_available(), reason="GPT-2 ranks not available offline (set MAMBA3_LITE_GPT2_RANKS)")
ROOT = Path(__file__).resolve().parents[1]


def corpus_texts(n=300, seed=0):
    "Documents of varied length and content: code, prose, non-ASCII, CRLF, an empty one, special-token-looking text."
    rng = np.random.default_rng(seed)
    words = ["state", "λ", "def", "return x * 2", "über", "数据", "\r\n", "\n\n", "<|endoftext|>", "  ", "ß", "🙂", "token"]
    texts = [" ".join(rng.choice(words, rng.integers(1, 120))) for _ in range(n)]
    texts[7] = ""
    return texts


def write_jsonl(path, texts):
    path.write_text("".join(json.dumps({"text": t, "meta": {"i": i}}) + "\n" for i, t in enumerate(texts)))
    return path


def write_parquet_set(root, texts, n_files=3, row_group_size=17, field="text"):
    "The texts over `n_files` parquet files (sorted names keep their order), small row groups, a metadata column."
    root.mkdir(parents=True, exist_ok=True)
    for k, part in enumerate(np.array_split(np.arange(len(texts)), n_files)):
        t = pa.table({"id": pa.array(part, pa.int64()), field: pa.array([texts[i] for i in part], pa.string()),
                      "score": pa.array(np.linspace(0, 1, len(part)))})
        pq.write_table(t, root / f"part-{k:05d}.parquet", row_group_size=row_group_size)
    return root


def stream(out, split):
    m = json.loads((Path(out) / split / "manifest.json").read_text())
    return np.concatenate([Shard(Path(out) / split / s["file"]).tokens for s in m["shards"]]), m


def assert_same_tokens(a, b):
    for split in ("train", "val"):
        (ta, ma), (tb, mb) = stream(a, split), stream(b, split)
        assert ta.size > 0 and np.array_equal(ta, tb), split  # exact: token ids
        assert (ma["n_tokens"], ma["n_documents"], ma["n_empty_documents_skipped"]) == \
               (mb["n_tokens"], mb["n_documents"], mb["n_empty_documents_skipped"])
        assert [s["sha256"] for s in ma["shards"]] == [s["sha256"] for s in mb["shards"]]


KW = dict(shard_size_tokens=1000, val_fraction=0.05, progress=False)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    "The texts, their .jsonl and the .jsonl-prepared output every other source must equal."
    root = tmp_path_factory.mktemp("ref")
    texts = corpus_texts()
    jl = write_jsonl(root / "corpus.jsonl", texts)
    res = prepare_corpus([jl], root / "out_jsonl", **KW)
    assert res["train"]["n_documents"] + res["val"]["n_documents"] == len(texts) - 1      # the empty one is skipped
    return texts, jl, root / "out_jsonl"


@pytest.mark.parametrize("workers", [1, 2])
def test_parquet_directory_equals_jsonl(reference, tmp_path, workers):
    texts, _, ref = reference
    d = write_parquet_set(tmp_path / "pq", texts)
    res = prepare_corpus([d], tmp_path / "out", workers=workers, batch_bytes=4096, **KW)
    assert_same_tokens(ref, tmp_path / "out")
    assert [s["path"] for s in res["train"]["sources"]] == [str(p) for p in sorted(d.glob("*.parquet"))]


def test_parquet_files_and_text_field(reference, tmp_path):
    texts, _, ref = reference
    d = write_parquet_set(tmp_path / "pq", texts, n_files=2, row_group_size=1000, field="content")
    prepare_corpus(sorted(d.glob("*.parquet")), tmp_path / "out", text_field="content", **KW)
    assert_same_tokens(ref, tmp_path / "out")
    with pytest.raises(ValueError, match=r"part-00000.parquet: no column 'text' \(columns: id, content, score\)"):
        prepare_corpus([d], tmp_path / "out2", **KW)


def test_parquet_reader_streams_record_batches(tmp_path):
    "Rows come out batch by batch: the reader is a generator over record batches, not a whole-file read."
    texts = corpus_texts(50)
    f = write_parquet_set(tmp_path, texts, n_files=1, row_group_size=10) / "part-00000.parquet"
    it = iter_parquet_documents(f, batch_rows=4)
    assert [next(it)[0] for _ in range(5)] == texts[:5]
    rest = [t for t, _ in it]
    assert rest == texts[5:]


def test_saved_dataset_equals_jsonl(reference, tmp_path):
    texts, _, ref = reference
    datasets.Dataset.from_dict({"text": texts, "n": list(range(len(texts)))}).save_to_disk(str(tmp_path / "ds"))
    res = prepare_corpus(None, tmp_path / "out", hf_dataset=str(tmp_path / "ds"), workers=2, **KW)
    assert_same_tokens(ref, tmp_path / "out")
    assert res["train"]["sources"][0]["fingerprint"]
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["x"]}),
                               "web": datasets.Dataset.from_dict({"text": texts})})
    dd.save_to_disk(str(tmp_path / "dd"))
    prepare_corpus(None, tmp_path / "out_dd", hf_dataset=str(tmp_path / "dd"), hf_split="web", **KW)
    assert_same_tokens(ref, tmp_path / "out_dd")


@pytest.mark.parametrize("builder", ["json", "parquet"])
def test_hf_streaming_over_local_files_equals_jsonl(reference, tmp_path, builder):
    "The same `load_dataset(..., streaming=True)` path as a hub name, pointed at local files."
    texts, jl, ref = reference
    files = [jl] if builder == "json" else sorted(write_parquet_set(tmp_path / "pq", texts).glob("*.parquet"))
    res = prepare_corpus(None, tmp_path / "out", hf_dataset=builder, hf_data_files=files, **KW)
    assert_same_tokens(ref, tmp_path / "out")
    assert [f["path"] for f in res["train"]["sources"][0]["data_files"]] == [str(f) for f in files]


def test_max_tokens_stops_at_a_document_boundary(reference, tmp_path):
    "The output is the whole corpus's token stream up to the end of the first document that reaches max_tokens."
    texts, jl, _ = reference
    kw = dict(shard_size_tokens=1000, val_tokens=500, progress=False)    # val = the first documents: val + train = corpus order
    prepare_corpus([jl], tmp_path / "all", **kw)
    everything = np.concatenate([stream(tmp_path / "all", "val")[0], stream(tmp_path / "all", "train")[0]])
    doc_ends = np.flatnonzero(everything == 50256) + 1
    want = int(doc_ends[doc_ends >= 3000][0])
    assert 3000 < want < everything.size
    for name, src in (("files", dict(inputs=[jl])), ("hf", dict(inputs=None, hf_dataset="json", hf_data_files=[jl]))):
        res = prepare_corpus(out=tmp_path / name, max_tokens=3000, **src, **kw)
        got = np.concatenate([stream(tmp_path / name, "val")[0], stream(tmp_path / name, "train")[0]])
        assert np.array_equal(got, everything[:want]), name  # exact: token ids
        assert res["train"]["max_tokens"] == 3000


def test_interrupted_parquet_prepare_continues(reference, tmp_path):
    "A prepare killed mid-way (shards written, no manifests) continues: finished shards are kept, the result is the same."
    texts, _, ref = reference
    d = write_parquet_set(tmp_path / "pq", texts)
    out = tmp_path / "out"
    code = (f"import os, sys; sys.path.insert(0, {str(ROOT)!r})\n"
            "import mamba3_lite.prepare as D\n"
            "orig = D._SplitWriter._emit\n"
            "def emit(self, tokens):\n"
            "    orig(self, tokens)\n"
            "    if self.dir.name == 'train' and len(self.shards) == 3: os._exit(9)   # killed after its 3rd train shard\n"
            "D._SplitWriter._emit = emit\n"
            f"D.prepare_corpus([{str(d)!r}], {str(out)!r}, shard_size_tokens=1000, val_fraction=0.05, progress=False)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 9, r.stderr
    assert len(list((out / "train").glob("shard_*.bin"))) == 3 and not (out / "train" / "manifest.json").exists()
    res = prepare_corpus([d], out, **KW)
    assert res["stats"]["train"]["skipped"] == 3 and res["stats"]["train"]["written"] > 0
    assert_same_tokens(ref, out)


def test_bad_sources_are_one_clear_error(tmp_path):
    (tmp_path / "a.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match="a.parquet: not a readable parquet file"):
        prepare_corpus([tmp_path / "a.parquet"], tmp_path / "o1", **KW)
    pq.write_table(pa.table({"text": ["ok", None]}), tmp_path / "b.parquet")
    with pytest.raises(ValueError, match=r"b.parquet: row 1: 'text' is null"):
        prepare_corpus([tmp_path / "b.parquet"], tmp_path / "o2", **KW)
    datasets.Dataset.from_dict({"body": ["a"]}).save_to_disk(str(tmp_path / "ds"))
    with pytest.raises(ValueError, match=r"no column 'text' \(columns: body\)"):
        prepare_corpus(None, tmp_path / "o3", hf_dataset=str(tmp_path / "ds"), **KW)
    with pytest.raises(ValueError, match="not both"):
        prepare_corpus([tmp_path / "b.parquet"], tmp_path / "o4", hf_dataset=str(tmp_path / "ds"), **KW)
    with pytest.raises(ValueError, match="--hf-dataset no/such-dataset-m3l: cannot open it"):
        prepare_corpus(None, tmp_path / "o5", hf_dataset="no/such-dataset-m3l", **KW)


def test_missing_extra_is_one_line(tmp_path, monkeypatch):
    texts = corpus_texts(10)
    d = write_parquet_set(tmp_path / "pq", texts, n_files=1)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)     # import pyarrow.parquet now raises ImportError
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'mamba3-lite\[data\]'"):
        prepare_corpus([d], tmp_path / "o", **KW)
    with pytest.raises(MissingExtraError, match=r"--hf-dataset needs the Python package 'datasets'.*mamba3-lite\[data\]"):
        prepare_corpus(None, tmp_path / "o", hf_dataset="json", hf_data_files=[d / "part-00000.parquet"], **KW)


def test_cli_flags(reference, tmp_path):
    "`mamba3-lite prepare` from a parquet directory and from --hf-dataset, as a user runs it; usage mistakes are one line."
    texts, _, ref = reference
    cli = [sys.executable, "-c", "import sys; from mamba3_lite.cli import main; sys.exit(main())", "prepare"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = lambda *args: subprocess.run(cli + [str(a) for a in args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    same = ["--shard-size-tokens", 1000, "--val-fraction", 0.05, "--quiet"]
    d = write_parquet_set(tmp_path / "pq", texts)
    r = run(d, "--out", tmp_path / "o1", "--workers", 2, *same)
    assert r.returncode == 0, r.stderr
    assert_same_tokens(ref, tmp_path / "o1")
    datasets.DatasetDict({"web": datasets.Dataset.from_dict({"text": texts})}).save_to_disk(str(tmp_path / "dd"))
    r = run("--hf-dataset", tmp_path / "dd", "--split", "web", "--out", tmp_path / "o2", *same)
    assert r.returncode == 0, r.stderr
    assert_same_tokens(ref, tmp_path / "o2")
    r = run("--hf-dataset", "parquet", "--hf-data-files", *sorted(d.glob("*.parquet")), "--max-tokens", 2000, "--out", tmp_path / "o3", *same)
    assert r.returncode == 0, r.stderr
    assert 2000 <= json.loads((tmp_path / "o3" / "train" / "manifest.json").read_text())["n_tokens"] + \
        json.loads((tmp_path / "o3" / "val" / "manifest.json").read_text())["n_tokens"] < 4000
    for args, msg in ((["--out", tmp_path / "o4"], "give INPUT files or directories, or --hf-dataset"),
                      ([d, "--hf-config", "x", "--out", tmp_path / "o4"], "--hf-config and --hf-data-files go with --hf-dataset"),
                      ([d, "--hf-dataset", tmp_path / "dd", "--out", tmp_path / "o4"], "not both"),
                      ([d, "--text-field", "body", "--out", tmp_path / "o4"], "no column 'body'")):
        r = run(*args, "--quiet")
        assert r.returncode == 2 and "Traceback" not in r.stderr and msg in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
