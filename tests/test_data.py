"""mamba3_lite.data: readers, windows, sampler, bad inputs, prepare, tokenizer install, CLI.
Tests needing the GPT-2 ranks read them from $MAMBA3_LITE_GPT2_RANKS and skip when it is unset; nothing downloads."""
import json
import os
import subprocess
import sys
from itertools import islice
from pathlib import Path

import numpy as np
import pytest
import torch

from mamba3_lite import tokenizer as Tok
from mamba3_lite.cli import install_tokenizer_cli, prepare_cli, train_cli
from mamba3_lite import prepare as Prep
from mamba3_lite.data import PretrainDataset, Shard, WindowSampler, window_naive, write_shard
from mamba3_lite.prepare import prepare_corpus
from mamba3_lite.testing import run_captured
from mamba3_lite.tokenizer import GPT2_EOS_ID, GPT2_VOCAB_SIZE, TokenizerUnavailableError, install_tokenizer

RANKS = os.environ.get("MAMBA3_LITE_GPT2_RANKS")
needs_ranks = pytest.mark.skipif(not RANKS, reason="set MAMBA3_LITE_GPT2_RANKS to a copy of gpt2.tiktoken "
                                 "(whisper/assets/gpt2.tiktoken, sha256 306cd27f...) to run tokenizer tests")
ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- layouts over the same tokens
def _tokens(T=4096, V=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (T,), generator=g, dtype=torch.long)


def _layouts(tmp_path, tokens, cuts, V=128):
    """The same tokens as: our single file, torch single file, reference shard dir, our shard dir. Returns paths."""
    write_shard(tmp_path / "single.bin", tokens.numpy(), vocab_size=V, eos_id=V - 1)
    torch.save(tokens, tmp_path / "single.pt")
    (tmp_path / "ref").mkdir()
    (tmp_path / "ours").mkdir()
    for k, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
        torch.save(tokens[a:b].clone(), tmp_path / "ref" / f"shard_{k:04d}.bin")
        write_shard(tmp_path / "ours" / f"shard_{k:06d}.bin", tokens[a:b].numpy(), vocab_size=V, eos_id=V - 1)
    return [tmp_path / n for n in ("single.bin", "single.pt", "ref", "ours")]


def test_reference_numbers_all_readers(tmp_path):
    tokens = _tokens()
    for p in _layouts(tmp_path, tokens, [0, 1024, 2048, 3072, 4096]):
        ds = PretrainDataset(p, 32, 128)
        assert len(ds) == 127
        x, y = ds[126]
        assert torch.equal(x, tokens[4032:4064]) and torch.equal(y, tokens[4033:4065])  # exact: token ids
        assert x.shape == (32,) and x.dtype == torch.long and not x.is_cuda
        with pytest.raises(IndexError):
            ds[127]
        batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=4, drop_last=True, num_workers=0)))
        assert batch[0].shape == (4, 32)


@pytest.mark.parametrize("seed", range(6))
def test_windows_equal_flat_slices_spanning_small_shards(tmp_path, seed):
    rng = np.random.default_rng(seed)
    T = int(rng.integers(300, 700))
    L = int(rng.integers(3, 40))
    inner = sorted(set(rng.integers(1, T, int(rng.integers(1, 40))).tolist()))  # many shards smaller than L
    cuts = [0] + inner + [T]
    tokens = _tokens(T, seed=seed)
    sets = [PretrainDataset(p, L, 128) for p in _layouts(tmp_path, tokens, cuts)]
    n = (T - 1) // L
    for ds in sets:
        assert len(ds) == n
    shards = [tokens[a:b].numpy() for a, b in zip(cuts[:-1], cuts[1:])]
    for i in range(n):
        xs = [ds[i] for ds in sets]
        for x, y in xs:  # the readers agree with each other, with the flat stream and with the plain list stitch (window_naive)
            assert torch.equal(x, tokens[i * L:i * L + L]) and torch.equal(y, tokens[i * L + 1:i * L + L + 1])  # exact: token ids
            assert torch.equal(y[:-1], x[1:])  # exact: token ids
        xn, yn = window_naive(shards, cuts[:-1], [len(s) for s in shards], i, L)
        assert torch.equal(xs[3][0], xn) and torch.equal(xs[3][1], yn)  # exact: token ids


def test_window_starting_exactly_on_a_boundary(tmp_path):
    tokens = _tokens(200)
    ds = PretrainDataset(_layouts(tmp_path, tokens, [0, 40, 80, 81, 200])[3], 40, 128)
    for i in (1, 2):  # windows 1 and 2 start at offsets 40 and 80 = first tokens of shards 1 and 2
        x, y = ds[i]
        assert torch.equal(x, tokens[40 * i:40 * i + 40]) and torch.equal(y, tokens[40 * i + 1:40 * i + 41])  # exact: token ids


def test_release_keeps_windows_correct(tmp_path):
    tokens = _tokens(5000)
    p = _layouts(tmp_path, tokens, [0, 1000, 2500, 5000])[3]
    ds = PretrainDataset(p, 64, 128, max_resident_mb=0.3)  # releases mapped pages every couple of windows
    for i in np.random.default_rng(0).permutation(len(ds))[:60]:
        x, _ = ds[int(i)]
        assert torch.equal(x, tokens[i * 64:i * 64 + 64])  # exact: token ids


# ---------------------------------------------------------------- dummy
def test_missing_path_is_an_error_and_dummy_is_explicit(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        PretrainDataset(tmp_path / "nope.bin", 16, 100)
    with pytest.raises(ValueError, match="data_path is None"):
        PretrainDataset(None, 16, 100)
    with pytest.warns(UserWarning, match="RANDOM"):
        a = PretrainDataset(None, 16, 100, dummy=True, seed=1)
    with pytest.warns(UserWarning):
        b = PretrainDataset(tmp_path / "nope.bin", 16, 100, dummy=True, seed=1)
        c = PretrainDataset(None, 16, 100, dummy=True, seed=2)
    torch.manual_seed(123)  # the global RNG does not matter
    for i in (0, 7, 999):
        (xa, ya), (xb, yb) = a[i], b[i]
        assert torch.equal(xa, xb) and torch.equal(ya, yb) and torch.equal(ya[:-1], xa[1:])  # exact: token ids
        assert int(xa.max()) < 100 and xa.dtype == torch.long
    assert not torch.equal(a[0][0], c[0][0])
    assert not torch.equal(a[0][0], a[1][0])


# ---------------------------------------------------------------- bad inputs, each naming the file
def test_empty_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        PretrainDataset(tmp_path, 16, 128)


def test_truncated_shards(tmp_path):
    p = tmp_path / "d"
    p.mkdir()
    write_shard(p / "shard_000000.bin", np.arange(100), vocab_size=128, eos_id=127)
    raw = (p / "shard_000000.bin").read_bytes()
    (p / "shard_000000.bin").write_bytes(raw[:-2])
    with pytest.raises(ValueError, match="shard_000000.bin.*truncated"):
        PretrainDataset(p, 16, 128)
    (p / "shard_000000.bin").write_bytes(raw[:10])
    with pytest.raises(ValueError, match="shard_000000.bin"):
        PretrainDataset(p, 16, 128)
    q = tmp_path / "t.pt"
    torch.save(torch.arange(100), q)
    q.write_bytes(q.read_bytes()[:-50])
    with pytest.raises(ValueError, match="t.pt"):
        PretrainDataset(q, 16, 128)


def _prepared_dir(tmp_path, V=128, n=(100, 100, 37)):
    """A sharded directory with manifest, as prepare writes it (without a tokenizer)."""
    d = tmp_path / "tok" / "train"
    d.mkdir(parents=True)
    shards = []
    for k, m in enumerate(n):
        sha = write_shard(d / f"shard_{k:06d}.bin", (np.arange(m) + k) % V, vocab_size=V, eos_id=V - 1)
        shards.append({"file": f"shard_{k:06d}.bin", "n_tokens": m, "dtype": "uint16", "sha256": sha})
    m = {"format": "mamba3-lite-shards", "tokenizer": "test", "vocab_size": V, "eos_id": V - 1,
         "n_tokens": sum(n), "shards": shards}
    (d / "manifest.json").write_text(json.dumps(m))
    return d, m


def test_manifest_checks(tmp_path):
    d, m = _prepared_dir(tmp_path)
    assert len(PretrainDataset(d.parent, 16, 128, full_check=True)) == (237 - 1) // 16
    mf = d / "manifest.json"

    def bad(change, match, **kw):
        mm = json.loads(json.dumps(m))
        change(mm)
        mf.write_text(json.dumps(mm))
        with pytest.raises(ValueError, match=match):
            PretrainDataset(d, 16, 128, **kw)
        mf.write_text(json.dumps(m))

    bad(lambda mm: mm["shards"][1].update(n_tokens=99), "shard_000001.bin: header n_tokens=100")
    bad(lambda mm: mm["shards"][2].update(dtype="uint32"), "shard_000002.bin: header dtype")
    bad(lambda mm: mm["shards"].pop(), "not in the manifest")
    bad(lambda mm: mm.update(eos_id=5), "eos_id")
    bad(lambda mm: mm["shards"][0].update(sha256="0" * 64), "shard_000000.bin: sha256", full_check=True)
    bad(lambda mm: mm.update(vocab_size=50257, tokenizer="gpt2"), "'gpt2' \\(50257 ids\\).*vocab_size=128")
    (d / "shard_000001.bin").unlink()
    with pytest.raises(ValueError, match="missing on disk"):
        PretrainDataset(d, 16, 128)


def test_vocab_mismatch_and_out_of_range_ids(tmp_path):
    d, _ = _prepared_dir(tmp_path)
    with pytest.raises(ValueError, match="manifest.json.*vocab_size=50257"):
        PretrainDataset(d, 16, 50257)
    (d / "manifest.json").unlink()  # header alone still carries the vocab
    with pytest.raises(ValueError, match="shard_000000.bin: tokenized with a 128-id vocabulary"):
        PretrainDataset(d, 16, 50257)
    # an id beyond the vocab inside one of our shards (corrupt bytes): named with file and offset
    p = d / "shard_000001.bin"
    raw = bytearray(p.read_bytes())
    raw[32 + 2 * 50:32 + 2 * 51] = np.array([300], "<u2").tobytes()
    p.write_bytes(bytes(raw))
    ds = PretrainDataset(d, 16, 128)
    with pytest.raises(ValueError, match="shard_000001.bin: token id 300 at offset 50"):
        ds[150 // 16]
    with pytest.raises(ValueError, match="shard_000001.bin: token ids outside"):
        PretrainDataset(d, 16, 128, full_check=True)
    # reference-format tensors: ids >= vocab and negative ids
    for k, val in ((0, 128), (1, -1)):
        t = torch.arange(64) % 100
        t[10] = val
        q = tmp_path / f"r{k}.pt"
        torch.save(t, q)
        with pytest.raises(ValueError, match=f"r{k}.pt: token id {val}"):
            PretrainDataset(q, 16, 128)[0]


@pytest.mark.parametrize("obj,match", [(torch.rand(100), "1-D integer"), (torch.zeros(4, 25, dtype=torch.long), "1-D integer"),
                                       ({"tokens": torch.arange(9)}, "gave a dict")])
def test_bad_torch_files(tmp_path, obj, match):
    q = tmp_path / "bad.pt"
    torch.save(obj, q)
    with pytest.raises(ValueError, match="bad.pt: .*" + match):
        PretrainDataset(q, 4, 128)


def test_bad_arguments_and_too_short(tmp_path):
    write_shard(tmp_path / "s.bin", np.arange(10), vocab_size=128, eos_id=127)
    with pytest.raises(ValueError, match="no window of 16"):
        PretrainDataset(tmp_path / "s.bin", 16, 128)
    with pytest.raises(ValueError, match="max_seq_len"):
        PretrainDataset(tmp_path / "s.bin", 0, 128)
    (tmp_path / "junk.bin").write_bytes(b"hello, not a tensor" * 10)
    with pytest.raises(ValueError, match="junk.bin: neither a mamba3-lite shard"):
        PretrainDataset(tmp_path / "junk.bin", 4, 128)


# ---------------------------------------------------------------- sampler
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_rank_split_disjoint_complete_deterministic(shuffle, world_size):
    n = 97
    for epoch in range(3):
        parts = []
        for r in range(world_size):
            s = WindowSampler(n, 1, shuffle=shuffle, seed=11, rank=r, world_size=world_size)
            parts.append(s.rank_order(epoch).tolist())
            assert parts[-1] == WindowSampler(n, 1, shuffle, 11, r, world_size).rank_order(epoch).tolist()
            assert parts[-1] == s.epoch_order(epoch)[r::world_size].tolist()
        allw = sum(parts, [])
        assert sorted(allw) == list(range(n)) and len(allw) == n
        assert max(map(len, parts)) - min(map(len, parts)) <= 1
    s = WindowSampler(n, 1, shuffle=shuffle, seed=11)
    assert (s.epoch_order(0).tolist() == list(range(n))) == (not shuffle)
    if shuffle:
        assert s.epoch_order(0).tolist() != s.epoch_order(1).tolist()
        assert s.epoch_order(0).tolist() != WindowSampler(n, 1, True, seed=12).epoch_order(0).tolist()


def test_iteration_runs_over_epochs():
    s = WindowSampler(10, batch_size=4, shuffle=False, rank=1, world_size=2)  # rank 1: 1 3 5 7 9
    assert list(islice(iter(s), 3)) == [[1, 3, 5, 7], [9, 1, 3, 5], [7, 9, 1, 3]]
    assert s.state_dict()["epoch"] == 2 and s.state_dict()["position"] == 2


@pytest.mark.parametrize("stop", [1, 6, 13, 25])
def test_resume_exact_through_dataloader(tmp_path, stop):
    tokens = _tokens(3000)
    ds = PretrainDataset(_layouts(tmp_path, tokens, [0, 700, 1500, 3000])[3], 16, 128)

    def run(sampler, k):
        return [x for x, _ in islice(iter(torch.utils.data.DataLoader(ds, batch_sampler=sampler, num_workers=0)), k)]

    want = run(WindowSampler(len(ds), 8, True, seed=3, rank=0, world_size=2), 30)
    a = WindowSampler(len(ds), 8, True, seed=3, rank=0, world_size=2)
    got = run(a, stop)
    st = json.loads(json.dumps(a.state_dict()))  # survives a JSON checkpoint
    b = WindowSampler(len(ds), 8, True, seed=3, rank=0, world_size=2)
    b.load_state_dict(st)
    got += run(b, 30 - stop)
    assert all(torch.equal(u, v) for u, v in zip(got, want)) and len(got) == 30  # exact: token ids


@pytest.mark.parametrize("kw,match", [(dict(world_size=4, rank=0), "world_size=2"), (dict(rank=1), "rank=0"),
                                      (dict(seed=4), "seed=3"), (dict(shuffle=False), "shuffle=True"),
                                      (dict(n_windows=50), "n_windows=60")])
def test_resume_refuses_mismatch(kw, match):
    a = WindowSampler(60, 4, True, seed=3, rank=0, world_size=2)
    next(iter(a))
    base = dict(n_windows=60, batch_size=4, shuffle=True, seed=3, rank=0, world_size=2)
    with pytest.raises(ValueError, match=match):
        WindowSampler(**{**base, **kw}).load_state_dict(a.state_dict())


def test_sampler_bad_arguments():
    for kw in (dict(rank=2, world_size=2), dict(n_windows=0), dict(batch_size=0), dict(n_windows=3, world_size=4), dict(seed=-1)):
        with pytest.raises(ValueError):
            WindowSampler(**{"n_windows": 10, "batch_size": 2, **kw})


# ---------------------------------------------------------------- tokenizer
def test_no_ranks_offline_is_one_clear_error(tmp_path, monkeypatch, capsys):
    import tiktoken.load
    import tiktoken.registry

    def no_network(url):
        raise ConnectionError(f"no network for {url}")

    monkeypatch.delenv("MAMBA3_LITE_GPT2_RANKS", raising=False)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(tiktoken.load, "read_file", no_network)
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    with pytest.raises(TokenizerUnavailableError) as e:
        Tok.gpt2_encoding()
    msg = str(e.value)
    for part in (Tok.WHISPER_ARCHIVE_URL, Tok.WHISPER_SDIST_SHA256, "whisper/assets/gpt2.tiktoken",
                 "mamba3-lite install-tokenizer", "MAMBA3_LITE_GPT2_RANKS"):
        assert part in msg
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.txt").write_text("hi")
    assert prepare_cli([str(tmp_path / "c"), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "install-tokenizer" in err and "Traceback" not in err


def test_ranks_file_checks(tmp_path, monkeypatch):
    bad = tmp_path / "bad.tiktoken"
    bad.write_bytes(b"aGk= 0\n")
    with pytest.raises(ValueError, match="bad.tiktoken has sha256"):
        Tok.gpt2_encoding(bad)
    monkeypatch.setenv("MAMBA3_LITE_GPT2_RANKS", str(tmp_path / "missing.tiktoken"))
    with pytest.raises(FileNotFoundError, match="missing.tiktoken"):
        Tok.gpt2_encoding()
    with pytest.raises(ValueError, match="expected 306cd27f"):
        install_tokenizer(bad, tmp_path / "cache")
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").iterdir())


@needs_ranks
def test_install_tokenizer_makes_plain_tiktoken_work_offline(tmp_path, monkeypatch):
    import tiktoken
    import tiktoken.load
    from tiktoken_ext.openai_public import r50k_base

    def no_network(url):
        raise AssertionError(f"test tried to download {url}")

    monkeypatch.setattr(tiktoken.load, "read_file", no_network)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))
    assert install_tokenizer_cli([RANKS]) == 0
    assert Tok.r50k_cache_path().is_file()
    plain = tiktoken.Encoding(**r50k_base())
    ours = Tok.gpt2_encoding(RANKS)
    text = "def f(x):\n    return x ** 2  # λ\r\n<|endoftext|> ends here"
    assert plain.encode_ordinary(text) == ours.encode_ordinary(text)
    assert plain._mergeable_ranks == ours._mergeable_ranks and plain.n_vocab == ours.n_vocab == GPT2_VOCAB_SIZE
    monkeypatch.delenv("MAMBA3_LITE_GPT2_RANKS", raising=False)
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    assert Tok.gpt2_encoding().encode_ordinary(text) == ours.encode_ordinary(text)  # our default path, from the cache


# ---------------------------------------------------------------- prepare
def _corpus(root):
    root.mkdir(parents=True, exist_ok=True)
    docs = [f"doc {i}: ünïcode ✓ and\r\nCRLF, tabs\t, <|endoftext|> as text.\n" * (1 + i % 7) for i in range(30)]
    for i, d in enumerate(docs[:20]):
        sub = root / ("a" if i % 2 else "b")
        sub.mkdir(exist_ok=True)
        (sub / f"d{i:02d}.txt").write_bytes(d.encode())
    (root / "x.jsonl").write_text("\n".join(json.dumps({"body": d}) for d in docs[20:]) + "\n\n")
    (root / "skip.py").write_text("print('not included')\n")
    return docs


def _decode_split(enc, out, split):
    m = json.loads((out / split / "manifest.json").read_text())
    if not m["shards"]:
        return [], m
    t = np.concatenate([Shard(out / split / s["file"]).tokens for s in m["shards"]])
    assert int(t[-1]) == GPT2_EOS_ID
    return [enc.decode(seg[:-1].tolist()) for seg in np.split(t, np.flatnonzero(t == GPT2_EOS_ID) + 1)[:-1]], m


@needs_ranks
@pytest.mark.parametrize("workers", [1, 2])
def test_prepare_round_trip(tmp_path, workers):
    docs = _corpus(tmp_path / "c")
    enc = Tok.gpt2_encoding(RANKS)
    out = tmp_path / "out"
    res = prepare_corpus([tmp_path / "c"], out, shard_size_tokens=100, val_fraction=0.25, text_field="body",
                         workers=workers, progress=False, bpe_file=RANKS, batch_bytes=300)
    tr, mt = _decode_split(enc, out, "train")
    va, mv = _decode_split(enc, out, "val")
    assert sorted(tr + va) == sorted(docs)
    assert 0.15 < mv["n_tokens"] / (mv["n_tokens"] + mt["n_tokens"]) < 0.35
    assert mt["tokenizer"] == "gpt2" and mt["vocab_size"] == GPT2_VOCAB_SIZE and mt["eos_id"] == GPT2_EOS_ID
    assert mt["dtype"] == "uint16" and all(s["n_tokens"] == 100 for s in mt["shards"][:-1])
    assert len(mt["sources"]) == 21 and not any("skip.py" in s["path"] for s in mt["sources"])
    assert res["train"]["shards"] == mt["shards"]
    ds = PretrainDataset(out, 16, GPT2_VOCAB_SIZE, full_check=True)
    assert ds.total_tokens == mt["n_tokens"]
    assert len(PretrainDataset(out, 16, GPT2_VOCAB_SIZE, split="val")) == (mv["n_tokens"] - 1) // 16
    assert not list(out.rglob("*.tmp"))


@needs_ranks
def test_prepare_val_tokens_whole_documents_and_rerun(tmp_path):
    _corpus(tmp_path / "c")
    enc = Tok.gpt2_encoding(RANKS)
    out = tmp_path / "out"
    kw = dict(shard_size_tokens=64, val_tokens=150, text_field="body", progress=False, bpe_file=RANKS)
    prepare_corpus([tmp_path / "c"], out, **kw)
    va, mv = _decode_split(enc, out, "val")
    files = Prep.list_input_files([tmp_path / "c"])
    assert mv["n_tokens"] >= 150 and va == [f.read_bytes().decode() for f in files[:len(va)]]  # the first documents
    assert mv["n_tokens"] - (len(enc.encode_ordinary(va[-1])) + 1) < 150  # ... stopping as soon as N is reached
    # rerun: nothing rewritten; lose a shard: only that one is rewritten; stale extra shard removed
    mtimes = {p.name: p.stat().st_mtime_ns for p in (out / "train").glob("shard_*.bin")}
    mf_time = (out / "train" / "manifest.json").stat().st_mtime_ns
    res = prepare_corpus([tmp_path / "c"], out, **kw)  # complete and unchanged: returns without writing anything
    assert res["stats"]["train"] == {"written": 0, "skipped": len(mtimes), "removed": 0}
    assert (out / "train" / "manifest.json").stat().st_mtime_ns == mf_time
    res = prepare_corpus([tmp_path / "c"], out, **{**kw, "val_tokens": 151})  # other settings: a real run
    assert (out / "train" / "manifest.json").stat().st_mtime_ns != mf_time
    res = prepare_corpus([tmp_path / "c"], out, **kw)
    (out / "train" / "shard_000002.bin").unlink()
    (out / "train" / "shard_999999.bin").write_bytes(b"stale")
    res = prepare_corpus([tmp_path / "c"], out, **kw)
    assert res["stats"]["train"] == {"written": 1, "skipped": len(mtimes) - 1, "removed": 1}
    assert {p.name: p.stat().st_mtime_ns for p in (out / "train").glob("shard_*.bin") if p.name != "shard_000002.bin"} == \
        {k: v for k, v in mtimes.items() if k != "shard_000002.bin"}
    PretrainDataset(out, 16, GPT2_VOCAB_SIZE, full_check=True)


@needs_ranks
def test_prepare_bad_inputs(tmp_path, capsys):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "bad.txt").write_bytes(b"caf\xe9")
    (tmp_path / "j.jsonl").write_text('{"text": "ok"}\n{"nope": 1}\n')
    (tmp_path / "k.jsonl").write_text('{"text": "ok"}\nnot json\n')
    cases = [([tmp_path / "c"], "bad.txt: not UTF-8"), ([tmp_path / "j.jsonl"], "j.jsonl:2: expected an object with a string field 'text'"),
             ([tmp_path / "k.jsonl"], "k.jsonl:2: not valid JSON"), ([tmp_path / "none"], "none does not exist")]
    for inputs, match in cases:
        with pytest.raises((ValueError, FileNotFoundError), match=match):
            prepare_corpus(inputs, tmp_path / "o", progress=False, bpe_file=RANKS)
    with pytest.raises(FileNotFoundError, match="no files matching"):
        prepare_corpus([tmp_path / "c"], tmp_path / "o", include=["*.md"], progress=False, bpe_file=RANKS)
    with pytest.raises(ValueError, match="not both"):
        prepare_corpus([tmp_path / "j.jsonl"], tmp_path / "o", val_tokens=1, val_fraction=0.1, bpe_file=RANKS)
    for args in (["--shard-size-tokens", "0"], ["--val-fraction", "1.5"], ["--workers", "0"]):
        assert prepare_cli([str(tmp_path / "j.jsonl"), "--out", str(tmp_path / "o"), "--quiet", *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("mamba3-lite prepare: error:")


def test_train_on_raw_text_suggests_prepare(tmp_path):
    "`train --data-path` on a text file or a folder of text: one line naming the `prepare` command that makes the corpus."
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text("def f(x):\n    return x\n")
    for raw, out in ((tmp_path / "texts", tmp_path / "texts_tokens"), (tmp_path / "texts" / "a.txt", tmp_path / "texts" / "a_tokens")):
        rc, _, err = run_captured(train_cli, ["--config", "tiny_cpu", "--data-path", str(raw), "--checkpoint-dir", str(tmp_path / "run")])
        assert rc == 2 and err.count("\n") == 1, err
        assert f"mamba3-lite prepare {raw} --out {out}, then use that --out directory" in err, err
    assert not (tmp_path / "run").exists()


@needs_ranks
def test_prepare_cli_subprocess(tmp_path):
    _corpus(tmp_path / "c")
    code = "import sys; from mamba3_lite.cli import prepare_cli; sys.exit(prepare_cli())"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "c"), "--out", str(tmp_path / "o"), "--include", "*.txt",
                        "--val-tokens", "20", "--shard-size-tokens", "500", "--quiet"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "train:" in r.stdout and (tmp_path / "o" / "val" / "manifest.json").is_file()
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "missing"), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "missing does not exist" in r.stderr


def test_stdlib_corpus_files():
    files = Prep.stdlib_corpus_files()
    names = {f.name for f in files}
    assert len(files) > 300 and "os.py" in names and "bisect.py" in names
    assert not any(part in ("test", "tests", "idle_test", "site-packages") for f in files for part in f.parts)


@pytest.mark.parametrize("ctx,workers", [("fork", 2), ("spawn", 1)])
def test_dataloader_workers_and_resume_with_state_at(tmp_path, ctx, workers):
    """Worker processes (forked, or spawned: the dataset pickles as its constructor call) give the same batches, and
    state_at(batches consumed) resumes exactly even though the loader draws batches ahead."""
    tokens = _tokens(3000)
    ds = PretrainDataset(_layouts(tmp_path, tokens, [0, 700, 1500, 3000])[3], 16, 128)

    def run(sampler, k, nw):
        dl = torch.utils.data.DataLoader(ds, batch_sampler=sampler, num_workers=nw,
                                         multiprocessing_context=ctx if nw else None)
        return [x for x, _ in islice(iter(dl), k)]

    want = run(WindowSampler(len(ds), 8, True, seed=5), 20, 0)
    a = WindowSampler(len(ds), 8, True, seed=5)
    got = run(a, 7, workers)
    assert a.state_dict() != a.state_at(7)  # the loader ran ahead
    b = WindowSampler(len(ds), 8, True, seed=5)
    b.load_state_dict(a.state_at(7))
    got += run(b, 13, 0)
    assert all(torch.equal(u, v) for u, v in zip(got, want)) and len(got) == 20  # exact: token ids
