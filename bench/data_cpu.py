"""CPU data-path benchmark for mamba3_lite.data, all numbers measured side by side in one run:

1. spanning-window fetch: PretrainDataset (tensor/numpy piece copies) vs a plain Python-list stitch (`window_naive`);
2. random-access windows/s over a generated >= 1 GB uint16 corpus, and the resident memory of the reading process;
3. `prepare` throughput (MB/s of source text) with 1 and 2 tokenizer threads on the Python standard library sources
   (needs the GPT-2 ranks: $MAMBA3_LITE_GPT2_RANKS or tiktoken's cache; skipped with a note otherwise);
4. `prepare` from a >= 1 GB parquet set and from the same texts as one .jsonl: text MB/s, tokens/s and peak RSS with 1 and
   2 tokenizer threads, each run in a fresh process (needs the [data] extra: pyarrow).

    .venv/bin/python bench/data_cpu.py                 # defaults: L=2048, 1.0 GiB corpus
    .venv/bin/python bench/data_cpu.py --corpus-gib 0.1 --skip-prepare --parquet-gb 0   # quick
    .venv/bin/python bench/data_cpu.py --only-parquet                              # section 4 alone
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mamba3_lite.data import PretrainDataset, window_fast, window_naive, write_shard  # noqa: E402
from mamba3_lite.prepare import prepare_corpus, stdlib_corpus_files  # noqa: E402
from mamba3_lite.tokenizer import GPT2_EOS_ID, GPT2_VOCAB_SIZE, TokenizerUnavailableError, gpt2_encoding  # noqa: E402


def rss_mb():
    "(VmRSS, VmHWM, RssAnon, RssFile) of this process in MB (Linux /proc)."
    f = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return tuple(int(f[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM", "RssAnon", "RssFile"))


def timeit_interleaved(fns, n, repeats=5):
    """Best-of-`repeats` CPU seconds (this thread's, so time the shared machine gives to others does not count) per
    call of each fn(0..n-1); the fns take turns so they see the same machine load."""
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for j, fn in enumerate(fns):
            t = time.thread_time()
            for i in range(n):
                fn(i)
            best[j] = min(best[j], (time.thread_time() - t) / n)
    return best


def bench_spanning(L, n_windows, tmp):
    """Windows over shards smaller than L (every window spans several shards), reference stitch vs ours."""
    rows = []
    for shard_len in (L // 3, 3 * L // 2):
        n_shards = max(4, (n_windows * L) // shard_len + 2)
        g = torch.Generator().manual_seed(0)
        shards = [torch.randint(0, GPT2_VOCAB_SIZE, (shard_len,), generator=g) for _ in range(n_shards)]
        d_ref, d_ours = tmp / f"ref{shard_len}", tmp / f"ours{shard_len}"
        d_ref.mkdir()
        d_ours.mkdir()
        for k, s in enumerate(shards):
            torch.save(s, d_ref / f"shard_{k:06d}.bin")
            write_shard(d_ours / f"shard_{k:06d}.bin", s.numpy())
        offsets = [k * shard_len for k in range(n_shards)]
        sizes = [shard_len] * n_shards
        ds_ref = PretrainDataset(d_ref, L, GPT2_VOCAB_SIZE)
        t0 = time.perf_counter()
        ds_ours = PretrainDataset(d_ours, L, GPT2_VOCAB_SIZE)
        t_open = time.perf_counter() - t0
        t0 = time.perf_counter()
        PretrainDataset(d_ours, L, GPT2_VOCAB_SIZE, seam_cache_mb=0)
        t_open_seam = t_open - (time.perf_counter() - t0)   # the one-time cost of stitching the seams
        del shards  # the list stitch reads torch.save'd int64 shards: torch.load(..., mmap=True)
        shards = [torch.load(p, weights_only=True, mmap=True) for p in sorted(d_ref.glob("shard_*.bin"))]
        n = min(n_windows, len(ds_ours))
        spans = [k for k in range(n) if (k * L) // shard_len != (k * L + L) // shard_len]
        m = len(spans)
        for i in spans:  # warm-up: fault every page in once
            ds_ref[i], ds_ours[i]
        t_naive, t_fn, t_ref, t_ours = timeit_interleaved([
            lambda i: window_naive(shards, offsets, sizes, spans[i], L),
            lambda i: window_fast(ds_ref.shards, offsets, sizes, spans[i], L, GPT2_VOCAB_SIZE),
            lambda i: ds_ref[spans[i]], lambda i: ds_ours[spans[i]]], m)
        for i in spans[:50]:
            assert torch.equal(window_naive(shards, offsets, sizes, i, L)[0], ds_ours[i][0])
        rows.append((shard_len, m, t_naive, t_fn, t_ref, t_ours, len(ds_ours._seams), t_open_seam))
    print(f"\n1. spanning-window fetch, L={L}: only windows that cross a shard boundary; CPU us per window, best of 5 interleaved")
    print("   list stitch = a plain .tolist() stitch (window_naive) on its torch.load(mmap=True) int64 shards;")
    print("   window_fast = our per-fetch stitch on the same shards; dataset = PretrainDataset[i] on the same torch.save'd-format")
    print("   directory (torch.save'd int64) and on our uint16 shards: the crossing windows were stitched and id-checked once at")
    print("   construction (the seam cache; its one-time cost and size are in the last two columns)")
    print(f"{'shard len':>10} {'windows':>8} {'list stitch':>12} {'window_fast':>12} {'dataset int64':>14} {'dataset uint16':>15} "
          f"{'fn speedup':>11} {'ds speedup':>11} {'seams':>6} {'seam build ms':>14}")
    for shard_len, m, a, f, b, c, n_seams, t_seam in rows:
        print(f"{shard_len:>10} {m:>8} {a * 1e6:>12.1f} {f * 1e6:>12.1f} {b * 1e6:>14.1f} {c * 1e6:>15.1f} "
              f"{a / f:>10.1f}x {a / max(b, c):>10.1f}x {n_seams:>6} {t_seam * 1e3:>14.1f}")
    return rows


def make_corpus(root, gib, shard_tokens):
    """Write >= gib GiB of random GPT-2 ids as our uint16 shards + manifest."""
    n_total = int(gib * 2**30) // 2
    d = root / "train"
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    shards, k, left = [], 0, n_total
    while left > 0:
        n = min(shard_tokens, left)
        toks = rng.integers(0, GPT2_VOCAB_SIZE, n, dtype=np.uint16)
        sha = write_shard(d / f"shard_{k:06d}.bin", toks)
        shards.append({"file": f"shard_{k:06d}.bin", "n_tokens": n, "dtype": "uint16", "sha256": sha})
        del toks
        left -= n
        k += 1
    man = {"format": "mamba3-lite-shards", "tokenizer": "gpt2", "vocab_size": GPT2_VOCAB_SIZE, "eos_id": GPT2_EOS_ID,
           "n_tokens": n_total, "shards": shards}
    (d / "manifest.json").write_text(json.dumps(man))
    return n_total


def random_access_child(path, L, n, budget):
    """Run in a fresh process: open the corpus, fetch n random windows, report rate and memory as JSON."""
    torch.set_num_threads(1)
    base = rss_mb()
    ds = PretrainDataset(path, L, GPT2_VOCAB_SIZE, max_resident_mb=budget)
    idx = np.random.default_rng(1).integers(0, len(ds), n)
    peak = 0.0
    t = time.perf_counter()
    for j, i in enumerate(idx):
        x, y = ds[int(i)]
        if j % 512 == 0:
            peak = max(peak, rss_mb()[0])
    dt = time.perf_counter() - t
    peak = max(peak, rss_mb()[0])
    print(json.dumps({"windows": n, "seconds": dt, "base_rss": base[0], "peak_rss": peak, "hwm": rss_mb()[1],
                      "end_anon": rss_mb()[2], "end_file": rss_mb()[3], "n_windows": len(ds), "tokens": ds.total_tokens}))


def bench_random(L, gib, n, budget, tmp):
    t = time.perf_counter()
    n_tok = make_corpus(tmp / "big", gib, 50_000_000)
    t_gen = time.perf_counter() - t
    rows = []
    for b in (budget, 1e6):
        r = subprocess.run([sys.executable, __file__, "--_child", str(tmp / "big"), str(L), str(n), str(b)],
                           capture_output=True, text=True, check=True)
        rows.append((b, json.loads(r.stdout.strip().splitlines()[-1])))
    print(f"\n2. random access over {n_tok * 2 / 2**30:.2f} GiB ({n_tok:,} uint16 tokens, {len(list((tmp / 'big' / 'train').glob('*.bin')))} "
          f"shards, generated in {t_gen:.1f}s, warm page cache), L={L}, {n:,} random windows, fresh process each")
    print(f"{'max_resident_mb':>16} {'windows/s':>10} {'RSS after import MB':>20} {'peak RSS MB':>12} {'end anon MB':>12} {'end file MB':>12}")
    for b, j in rows:
        label = f"{b:g}" if b < 1e6 else "off (no release)"
        print(f"{label:>16} {j['windows'] / j['seconds']:>10,.0f} {j['base_rss']:>20.0f} {j['peak_rss']:>12.0f} "
              f"{j['end_anon']:>12.0f} {j['end_file']:>12.0f}")
    return rows


def bench_prepare(tmp, repeats):
    try:
        gpt2_encoding()
    except (TokenizerUnavailableError, FileNotFoundError, ValueError) as e:
        print(f"\n3. prepare throughput: SKIPPED, no GPT-2 ranks:\n{e}")
        return None
    files = stdlib_corpus_files()
    mb = sum(f.stat().st_size for f in files) / 1e6
    for f in files:  # warm the page cache so both runs read from memory
        f.read_bytes()
    rows = []
    for w in (1, 2):
        best, cpu = float("inf"), 0.0
        for rep in range(repeats):
            out = tmp / f"prep{w}_{rep}"
            t, c = time.perf_counter(), time.process_time()
            res = prepare_corpus(files, out, shard_size_tokens=1_000_000, val_fraction=0.01, workers=w, progress=False)
            if time.perf_counter() - t < best:
                best, cpu = time.perf_counter() - t, time.process_time() - c
        rows.append((w, best, cpu, res["train"]["n_tokens"] + res["val"]["n_tokens"]))
    print(f"\n3. prepare on the Python stdlib sources: {len(files)} files, {mb:.1f} MB (read + tokenize + write shards; best of {repeats})")
    print(f"   load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; CPU s / wall s > 1 means threads ran in parallel")
    print(f"{'threads':>8} {'wall s':>7} {'CPU s':>6} {'CPU/wall':>9} {'MB/s':>7} {'Mtok/s':>7} {'vs 1 thread':>12}")
    for w, dt, cpu, n in rows:
        print(f"{w:>8} {dt:>7.2f} {cpu:>6.2f} {cpu / dt:>9.2f} {mb / dt:>7.2f} {n / dt / 1e6:>7.2f} {rows[0][1] / dt:>11.2f}x")
    return rows


def make_text_corpus(root, gb):
    """>= gb GB of UTF-8 text as documents (the stdlib sources, repeated with a pass number so no two are equal), written
    twice with the same documents in the same order: one .jsonl and a directory of parquet files (zstd, no dictionary,
    row groups of 1,024 documents, ~128 MB of text per file). Returns (text bytes, documents, jsonl path, parquet dir)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    base = [f.read_text(encoding="utf-8", errors="replace") for f in stdlib_corpus_files()]
    jl, pqdir = root / "corpus.jsonl", root / "parquet"
    pqdir.mkdir(parents=True)
    n_bytes = n_docs = part = 0
    pending, pending_bytes = [], 0
    def flush():
        nonlocal pending, pending_bytes, part
        pq.write_table(pa.table({"id": pa.array(range(n_docs - len(pending), n_docs), pa.int64()), "text": pending}),
                       pqdir / f"part-{part:05d}.parquet", row_group_size=1024, compression="zstd", use_dictionary=False)
        pending, pending_bytes, part = [], 0, part + 1
    with open(jl, "w", encoding="utf-8") as fj:
        rep = 0
        while n_bytes < gb * 1e9:
            for text in base:
                doc = f"# pass {rep}\n{text}"
                fj.write(json.dumps({"text": doc, "id": n_docs}) + "\n")
                b = len(doc.encode("utf-8"))
                n_bytes, n_docs = n_bytes + b, n_docs + 1
                pending.append(doc); pending_bytes += b
                if pending_bytes >= 128e6: flush()
                if n_bytes >= gb * 1e9: break
            rep += 1
    if pending: flush()
    return n_bytes, n_docs, jl, pqdir


def prepare_child(spec):
    "Run in a fresh process: one prepare, then its wall time, CPU time, tokens and peak RSS as JSON."
    torch.set_num_threads(1)
    s = json.loads(spec)
    t, c = time.perf_counter(), time.process_time()
    res = prepare_corpus(s["inputs"], s["out"], shard_size_tokens=s["shard"], val_fraction=0.001, workers=s["workers"],
                         progress=False)
    dt, cpu = time.perf_counter() - t, time.process_time() - c
    print(json.dumps({"seconds": dt, "cpu": cpu, "tokens": res["train"]["n_tokens"] + res["val"]["n_tokens"],
                      "shas": [sh["sha256"] for sp in ("train", "val") for sh in res[sp]["shards"]], "peak_rss": rss_mb()[1]}))


def bench_parquet(tmp, gb):
    "Section 4: prepare from a parquet set vs the same texts as .jsonl, 1 and 2 tokenizer threads, fresh process each."
    try:
        gpt2_encoding()
        import pyarrow  # noqa: F401
    except (TokenizerUnavailableError, FileNotFoundError, ValueError, ImportError) as e:
        print(f"\n4. prepare from parquet: SKIPPED ({str(e).splitlines()[0]}; pyarrow: pip install 'mamba3-lite[data]')")
        return None
    t = time.perf_counter()
    n_bytes, n_docs, jl, pqdir = make_text_corpus(tmp / "text", gb)
    t_gen = time.perf_counter() - t
    on_disk = {"parquet": sum(f.stat().st_size for f in pqdir.glob("*.parquet")), "jsonl": jl.stat().st_size}
    rows = []
    # the four comparable runs (50M-token shards, the default), then parquet with 5M-token shards: the peak RSS follows
    # the shard writer's buffer, not the input's size
    for fmt, inp, w, shard in (("parquet", pqdir, 1, 50_000_000), ("parquet", pqdir, 2, 50_000_000), ("jsonl", jl, 1, 50_000_000),
                               ("jsonl", jl, 2, 50_000_000), ("parquet", pqdir, 1, 5_000_000)):
        spec = json.dumps({"inputs": [str(inp)], "out": str(tmp / "out"), "workers": w, "shard": shard})
        r = subprocess.run([sys.executable, __file__, "--_prepare_child", spec], capture_output=True, text=True, check=True)
        rows.append((fmt, w, shard, json.loads(r.stdout.strip().splitlines()[-1])))
        shutil.rmtree(tmp / "out")
    same = len({tuple(j["shas"]) for _, _, shard, j in rows if shard == 50_000_000}) == 1
    print(f"\n4. prepare from parquet vs .jsonl, the same {n_docs:,} documents = {n_bytes / 1e9:.2f} GB of UTF-8 text (stdlib sources "
          f"repeated; generated in {t_gen:.0f}s): parquet {on_disk['parquet'] / 1e6:,.0f} MB on disk ({len(list(pqdir.glob('*.parquet')))} "
          f"files, zstd), jsonl {on_disk['jsonl'] / 1e6:,.0f} MB; fresh process each, page cache warm from writing")
    print("   peak RSS = the process's high-water mark (VmHWM), interpreter and torch included; the shard writer holds up to one "
          "shard's tokens (as uint32) and its copies while writing it")
    print(f"   identical shards from the four 50M-token-shard runs: {same}; load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'input':>8} {'threads':>8} {'shard tokens':>13} {'wall s':>7} {'CPU/wall':>9} {'text MB/s':>10} {'Mtok/s':>7} {'peak RSS MB':>12} {'tokens':>14}")
    for fmt, w, shard, j in rows:
        print(f"{fmt:>8} {w:>8} {shard:>13,} {j['seconds']:>7.1f} {j['cpu'] / j['seconds']:>9.2f} {n_bytes / 1e6 / j['seconds']:>10.2f} "
              f"{j['tokens'] / j['seconds'] / 1e6:>7.2f} {j['peak_rss']:>12.0f} {j['tokens']:>14,}")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-len", type=int, default=2048, help="window length L (default 2048, production)")
    ap.add_argument("--span-windows", type=int, default=1500, help="windows for the spanning-fetch comparison")
    ap.add_argument("--corpus-gib", type=float, default=1.0, help="size of the generated random-access corpus (default 1.0 GiB)")
    ap.add_argument("--random-windows", type=int, default=50_000, help="random windows fetched")
    ap.add_argument("--max-resident-mb", type=float, default=32, help="PretrainDataset page-release budget")
    ap.add_argument("--prepare-repeats", type=int, default=2, help="best of N prepare runs per thread count")
    ap.add_argument("--skip-prepare", action="store_true", help="skip the stdlib prepare throughput part")
    ap.add_argument("--parquet-gb", type=float, default=1.0, help="GB of text for the parquet vs .jsonl prepare (default 1.0; 0 skips it)")
    ap.add_argument("--only-parquet", action="store_true", help="run section 4 only")
    ap.add_argument("--tmp", default=None, help="scratch directory (default: a new temp dir, deleted at the end)")
    ap.add_argument("--_child", nargs=4, help=argparse.SUPPRESS)
    ap.add_argument("--_prepare_child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._child:
        path, L, n, b = a._child
        return random_access_child(path, int(L), int(n), float(b))
    if a._prepare_child:
        return prepare_child(a._prepare_child)
    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="m3l_bench_", dir=a.tmp))
    try:
        if not a.only_parquet:
            bench_spanning(a.seq_len, a.span_windows, tmp)
            bench_random(a.seq_len, a.corpus_gib, a.random_windows, a.max_resident_mb, tmp)
            if not a.skip_prepare:
                bench_prepare(tmp, a.prepare_repeats)
        if a.parquet_gb > 0:
            bench_parquet(tmp, a.parquet_gb)
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
