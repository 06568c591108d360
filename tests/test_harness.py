"""lm-eval-harness end to end, no network: local task YAMLs over small .jsonl files, run through lm-eval with
`Mamba3LM`, every per-sample answer checked against a direct computation with the model (log-softmax sums of
one plain forward; greedy decoding by re-reading the whole sequence), and `mamba3-lite eval --tasks` on a run
directory. Skipped (with the reason) only where the `eval` extra is not installed."""
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval", reason="lm-eval is not installed: pip install 'mamba3-lite[eval]'")
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"

from lm_eval.utils import get_rolling_token_windows, make_disjoint_window  # noqa: E402

from mamba3_lite.tokenizer import TokenizerUnavailableError, gpt2_encoding  # noqa: E402
from mamba3_lite.harness import Mamba3LM, rolling_windows, run_tasks  # noqa: E402
from mamba3_lite.model import Mamba3Transformer, ModelConfig  # noqa: E402


def _gpt2():
    try:
        return gpt2_encoding()
    except TokenizerUnavailableError:
        return None


ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(_gpt2() is None, reason="GPT-2 ranks not available offline (set MAMBA3_LITE_GPT2_RANKS)")

QA = [{"q": "The capital of France is", "choices": [" Paris", " Rome", " a large city on the Seine"], "label": 0},
      {"q": "def add(a, b):\n    return", "choices": [" a + b", " a - b"], "label": 0},
      {"q": "2 + 2 =", "choices": [" 4", " 5", " 22"], "label": 0},
      {"q": "for i in range(10):", "choices": ["\n    print(i)", "\nprint(i)"], "label": 0}]
DOCS = [{"text": "import os\nimport sys\n\n\ndef main():\n    print(os.getcwd())\n"},
        {"text": "The quick brown fox jumps over the lazy dog. " * 9},          # ~90 tokens: several 32-token windows
        {"text": "x"}]
PROMPTS = [{"prompt": "def square(x):\n    return", "answer": " x * x"},
           {"prompt": "Hello, my name is", "answer": " Bob"},
           {"prompt": "a", "answer": "b"}]


def write_tasks(root):
    "Three local tasks, one per request type, over .jsonl files in `root`."
    for name, rows in (("qa", QA), ("docs", DOCS), ("prompts", PROMPTS)):
        (root / f"{name}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    head = lambda task, data: f"task: {task}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {root / data}\ntest_split: test\n"
    (root / "qa.yaml").write_text(head("local_qa", "qa.jsonl") + 'output_type: multiple_choice\ndoc_to_text: "{{q}}"\n'
                                  'doc_to_choice: "{{choices}}"\ndoc_to_target: label\ntarget_delimiter: ""\n'
                                  "metric_list:\n  - metric: acc\n  - metric: acc_norm\n")
    (root / "docs.yaml").write_text(head("local_docs", "docs.jsonl") + 'output_type: loglikelihood_rolling\ndoc_to_text: ""\n'
                                    'doc_to_target: "{{text}}"\nmetric_list:\n  - metric: word_perplexity\n'
                                    "  - metric: byte_perplexity\n  - metric: bits_per_byte\n")
    (root / "prompts.yaml").write_text(head("local_gen", "prompts.jsonl") + 'output_type: generate_until\n'
                                       'doc_to_text: "{{prompt}}"\ndoc_to_target: "{{answer}}"\n'
                                       'generation_kwargs:\n  until: ["\\n", "."]\n  max_gen_toks: 6\n  do_sample: false\n'
                                       "metric_list:\n  - metric: exact_match\n")
    return root


@torch.no_grad()
def direct_loglikelihood(model, ids, n_scored):
    "Sum of log p of the last `n_scored` ids given the ones before, from one forward over all of them."
    logp = model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    return sum(logp[t - 1, ids[t]].item() for t in range(len(ids) - n_scored, len(ids)))


@torch.no_grad()
def direct_greedy(model, ids, max_new, eos):
    "Greedy continuation by re-reading the whole sequence for each new token."
    ids, new = list(ids), []
    for _ in range(max_new):
        nxt = model(torch.tensor([ids])).logits[0, -1].argmax().item()
        new.append(nxt)
        ids.append(nxt)
        if nxt == eos:
            break
    return new


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(0)
    model = Mamba3Transformer(ModelConfig.from_preset("tiny")).eval()
    return Mamba3LM(model, max_length=32, batch_size=3, max_gen_toks=16, progress=False)


def test_rolling_windows_are_lm_evals(lm):
    rng = random.Random(0)
    for _ in range(200):
        toks, L = [rng.randrange(1000) for _ in range(rng.randrange(1, 60))], rng.randrange(1, 20)
        want = [make_disjoint_window(w) for w in get_rolling_token_windows(toks, 5, L, 1)]
        assert rolling_windows(toks, 5, L) == [(list(a), list(b)) for a, b in want]


def test_local_tasks_end_to_end_match_direct_computation(lm, tmp_path):
    res = run_tasks(lm, ["local_qa", "local_docs", "local_gen"], include_path=str(write_tasks(tmp_path)), log_samples=True)
    model, enc, eos = lm.model, lm.enc, lm.eot_token_id
    # loglikelihood: every choice of every question
    qa = res["samples"]["local_qa"]
    assert len(qa) == len(QA)
    n_checked = 0
    for s in qa:
        row = QA[s["doc_id"]]
        for choice, resp in zip(row["choices"], s["resps"]):
            ctx = enc.encode(row["q"])
            whole = enc.encode(row["q"] + choice)
            assert whole[:len(ctx)] == ctx
            lp, greedy = resp[0]
            assert lp == pytest.approx(direct_loglikelihood(model, whole, len(whole) - len(ctx)), abs=2e-3)
            n_checked += 1
    assert n_checked == sum(len(r["choices"]) for r in QA)
    acc = res["results"]["local_qa"]["acc,none"]
    picks = [max(range(len(s["resps"])), key=lambda k: s["resps"][k][0][0]) for s in qa]
    assert acc == pytest.approx(sum(p == QA[s["doc_id"]]["label"] for p, s in zip(picks, qa)) / len(qa))
    # loglikelihood_rolling: the short documents in one window, the long one over several 32-token windows
    for s in res["samples"]["local_docs"]:
        toks = enc.encode(DOCS[s["doc_id"]]["text"])
        if len(toks) < 32:
            want = direct_loglikelihood(model, [eos] + toks, len(toks))
        else:
            want = sum(direct_loglikelihood(model, a + b, len(b))
                       for a, b in map(make_disjoint_window, get_rolling_token_windows(toks, eos, 32, 1)))
            assert len(toks) > 64
        assert s["resps"][0][0] == pytest.approx(want, abs=5e-3)
    bpb = res["results"]["local_docs"]["bits_per_byte,none"]
    total = sum(s["resps"][0][0] for s in res["samples"]["local_docs"])
    assert bpb == pytest.approx(-total / math.log(2) / sum(len(d["text"].encode()) for d in DOCS), rel=1e-4)
    # generate_until: greedy, cut at the first stop string
    for s in res["samples"]["local_gen"]:
        ids = direct_greedy(model, enc.encode(PROMPTS[s["doc_id"]]["prompt"]), 6, eos)
        text = enc.decode(ids)
        for stop in ("\n", "."):
            text = text.split(stop, 1)[0]
        assert s["resps"][0][0] == text


def test_limit_and_unknown_task(lm, tmp_path):
    write_tasks(tmp_path)
    res = run_tasks(lm, "local_qa", limit=2, include_path=str(tmp_path), log_samples=True)
    assert len(res["samples"]["local_qa"]) == 2
    with pytest.raises(ValueError, match="unknown lm-eval task.*no_such_task"):   # looked up among the built-ins too
        run_tasks(lm, ["local_qa", "no_such_task"], include_path=str(tmp_path))


def test_cli_eval_tasks_on_a_run_directory(tmp_path):
    "`mamba3-lite eval --tasks` on a run that `mamba3-lite train` wrote: table on stdout, JSON beside metrics.jsonl."
    cli = [sys.executable, "-c", "import sys; from mamba3_lite.cli import main; sys.exit(main())"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = lambda *a: subprocess.run(cli + [str(x) for x in a], capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    r = run("train", "--config", ROOT / "configs" / "tiny_cpu.yaml", "--dry-run", "--checkpoint-dir", tmp_path / "run",
            "--data-path", tmp_path / "no-data", "--no-compile")
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / "run" / "dry_run"
    assert (run_dir / "metrics.jsonl").is_file()
    (tmp_path / "tasks").mkdir()
    tasks = write_tasks(tmp_path / "tasks")
    r = run("eval", "--checkpoint-dir", run_dir, "--tasks", "local_qa,local_docs", "--include-path", tasks,
            "--limit", 3, "--batch-size", 2)                                   # lm-eval's default bootstrap iterations
    assert r.returncode == 0, r.stderr
    assert "local_qa" in r.stdout and "acc" in r.stdout and "bits_per_byte" in r.stdout
    written = sorted(run_dir.glob("lm_eval_step*_local_qa+local_docs.json"))
    assert len(written) == 1, list(run_dir.iterdir())
    saved = json.loads(written[0].read_text())
    step = saved["mamba3_lite"]["step"]
    assert written[0].name == f"lm_eval_step{step}_local_qa+local_docs.json" and saved["mamba3_lite"]["limit"] == 3
    assert isinstance(saved["results"]["local_qa"]["acc_stderr,none"], float)       # standard errors by default, as in lm-eval
    assert saved["mamba3_lite"]["bootstrap_iters"] == 100_000
    # the same numbers in-process, from the same checkpoint
    lm = Mamba3LM.from_checkpoint_dir(run_dir, progress=False, batch_size=2)
    assert lm.step == step and lm.max_length == 128                           # the run's max_seq_len
    res = run_tasks(lm, ["local_qa", "local_docs"], limit=3, include_path=str(tasks))
    for task, metric in (("local_qa", "acc,none"), ("local_docs", "bits_per_byte,none")):
        assert saved["results"][task][metric] == pytest.approx(res["results"][task][metric], rel=1e-5)
    for args, msg in ((["--checkpoint-dir", run_dir], "no-data: no such directory"),     # the run's own data (missing here)
                      (["--checkpoint-dir", run_dir, "--data-path", tmp_path, "--limit", 3], "go with --tasks"),
                      (["--checkpoint-dir", run_dir, "--tasks", "local_qa,nope_m3l", "--include-path", tasks], "unknown lm-eval task(s) nope_m3l")):
        r = run("eval", *args)
        assert r.returncode == 2 and "Traceback" not in r.stderr and msg in r.stderr, (args, r.stderr)


def test_exported_and_imported_models_give_the_same_answers(lm, tmp_path):
    "A model written in the official mamba_ssm layout, read back directly or imported as a run, answers as the original."
    from mamba3_lite.interop import from_pretrained, import_run, save_pretrained
    save_pretrained(lm.model, tmp_path / "exported", torch_bin=False)
    import_run(tmp_path / "exported", tmp_path / "run")
    tasks = str(write_tasks(tmp_path))
    want = run_tasks(lm, ["local_qa", "local_docs"], include_path=tasks, log_samples=True)["samples"]
    for other in (Mamba3LM(from_pretrained(tmp_path / "exported"), max_length=32, batch_size=3, progress=False),
                  Mamba3LM.from_checkpoint_dir(tmp_path / "run", max_length=32, batch_size=3, progress=False)):
        got = run_tasks(other, ["local_qa", "local_docs"], include_path=tasks, log_samples=True)["samples"]
        for task in ("local_qa", "local_docs"):
            flat = lambda samples: [r[0][0] if isinstance(r[0], (list, tuple)) else r[0] for s in samples for r in s["resps"]]
            assert flat(got[task]) == pytest.approx(flat(want[task]), abs=1e-3), task
