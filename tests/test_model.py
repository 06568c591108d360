"""Block and LM tests that do not fit the notebooks (02_block, 03_model): long lists of bad configs, the Triton
dispatch opt-in (environment variables), tying under copies/conversions, generation edge cases, autocast."""
import copy
import warnings

import pytest
import torch

import mamba3_lite.block as block_mod
from mamba3_lite.block import Mamba3Block
from mamba3_lite.model import (
    PRESETS,
    Mamba3Transformer,
    ModelConfig,
    closed_form_num_parameters,
    sample_next,
)
from mamba3_lite.ssd import SSDState, nmax, p95
from mamba3_lite.testing import greedy_by_recompute

torch.set_num_threads(1)


def tiny_block(**kw):
    return Mamba3Block(64, **{"d_state": 32, "headdim": 16, "chunk_size": 16, **kw})


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    "override, field",
    [
        ({"headdim": 24}, "headdim"),              # d_inner = 128 not divisible by 24
        ({"expand": 3, "headdim": 17}, "headdim"),
        ({"rope_fraction": 1.5}, "rope_fraction"),
        ({"rope_fraction": -0.1}, "rope_fraction"),
        ({"ngroups": 3}, "ngroups"),               # 8 heads
        ({"d_model": 0}, "d_model"),
        ({"n_layers": -1}, "n_layers"),
        ({"vocab_size": 2.5}, "vocab_size"),
        ({"d_ff": True}, "d_ff"),
        ({"d_state": 0}, "d_state"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"mimo_rank": 0}, "mimo_rank"),
        ({"is_mimo": "yes"}, "is_mimo"),
        ({"ssd_dispatch": "cuda"}, "ssd_dispatch"),
        ({"grad_checkpoint": 1}, "grad_checkpoint"),
        ({"outproj_norm": "no"}, "outproj_norm"),
        ({"dt_min": 0.5, "dt_max": 0.1}, "dt_min"),
        ({"a_floor": 0.0}, "a_floor"),
        ({"norm_eps": 0.0}, "norm_eps"),
        ({"init_std": -1.0}, "init_std"),
        ({"not_a_field": 1}, "not_a_field"),
    ],
)
def test_bad_config_raises_value_error_naming_the_field(override, field):
    with pytest.raises(ValueError, match=field):
        ModelConfig.from_preset("tiny", **override)


def test_unknown_preset_and_bad_block_args():
    with pytest.raises(ValueError, match="preset"):
        ModelConfig.from_preset("a100-900m")
    with pytest.raises(ValueError, match="headdim"):
        Mamba3Block(64, headdim=48)
    with pytest.raises(ValueError, match="cfg"):
        Mamba3Transformer({"d_model": 64})
    with pytest.raises(ValueError, match="seq_len"):
        ModelConfig().flops_per_token(0)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_count_exactly(name):
    cfg = ModelConfig.from_preset(name)
    with torch.device("meta"):
        model = Mamba3Transformer(cfg)
    assert model.num_parameters() == closed_form_num_parameters(cfg)
    expected = {"tiny": 3_489_728, "a100-400m": 434_359_040, "a100-400m-mimo": 432_982_784}
    if name in expected:
        assert model.num_parameters() == expected[name]




# ---------------------------------------------------------------- Triton dispatch (two-part opt-in)


@pytest.fixture
def fresh_env_warning(monkeypatch):
    monkeypatch.setattr(block_mod, "_ENV_WARNED", False)


def _warnings_of(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(w.message) for w in caught]


def test_triton_without_env_var_warns_once_and_runs_pytorch(monkeypatch, fresh_env_warning):
    monkeypatch.delenv("ENABLE_TRITON_KERNELS", raising=False)
    ref = tiny_block()
    blocks = [tiny_block(ssd_dispatch="triton") for _ in range(2)]
    u = torch.randn(2, 20, 64)
    for b in blocks:
        b.load_state_dict(ref.state_dict())
    with torch.no_grad():
        outs, msgs = _warnings_of(lambda: [b(u) for b in blocks] + [blocks[0](u)])
        want = ref(u)
    assert sum("ENABLE_TRITON_KERNELS" in m for m in msgs) == 1     # once per process
    for o in outs:
        assert torch.equal(o, want)  # exact: the same PyTorch ops on the same shapes


def test_triton_refusing_the_config_falls_back_once_per_block(monkeypatch, fresh_env_warning):
    monkeypatch.setenv("ENABLE_TRITON_KERNELS", "1")
    ref = tiny_block(chunk_size=24)                                  # not a power of two
    blocks = [tiny_block(chunk_size=24, ssd_dispatch="triton") for _ in range(2)]
    u = torch.randn(2, 30, 64)
    for b in blocks:
        b.load_state_dict(ref.state_dict())
    with torch.no_grad():
        outs, msgs = _warnings_of(lambda: [b(u) for b in blocks] + [b(u) for b in blocks])
        want = ref(u)
    fallbacks = [m for m in msgs if "falling back" in m]
    assert len(fallbacks) == 2 and all("chunk_size" in m for m in fallbacks)   # once per block, says why
    for o in outs:
        assert torch.equal(o, want)  # exact: the same PyTorch ops on the same shapes


@pytest.mark.parametrize("rank", [2, 4])
def test_chunk_size_counts_tokens_at_every_mimo_rank(monkeypatch, rank):
    "`chunk_size` is tokens per chunk in the config and the SSD alike (as the official Mamba3's): any length, unchanged."
    calls, real = [], block_mod.ssd_chunked
    monkeypatch.setattr(block_mod, "ssd_chunked", lambda *a, **kw: calls.append(kw["chunk_size"]) or real(*a, **kw))
    torch.manual_seed(0)
    blk = tiny_block(chunk_size=6, is_mimo=True, mimo_rank=rank)      # 6 tokens: not a multiple of the rank 4
    longer = tiny_block(chunk_size=6 * rank, is_mimo=True, mimo_rank=rank)   # an older meta's rows read as tokens
    longer.load_state_dict(blk.state_dict())
    u = torch.randn(1, 13, 64)
    with torch.no_grad():
        y, y_long = blk(u), longer(u)
    assert calls == [6, 6 * rank]
    assert nmax(y_long, y) < 1e-5        # another chunk length changes speed only (fp32 rounding)
    assert ModelConfig.from_preset("tiny-mimo").chunk_size == ModelConfig.from_preset("tiny").chunk_size == 16


def test_triton_opt_in_uses_the_kernel(monkeypatch, fresh_env_warning):
    ssd_triton_mod = pytest.importorskip("mamba3_lite.ssd_triton")
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("ENABLE_TRITON_KERNELS", "1")
    calls = []
    real = ssd_triton_mod.ssd_triton

    def counting(*args, **kw):
        calls.append(kw.get("chunk_size"))
        return real(*args, **kw)

    monkeypatch.setattr(ssd_triton_mod, "ssd_triton", counting)
    torch.manual_seed(0)
    ref = tiny_block()
    tri = tiny_block(ssd_dispatch="triton")
    tri.load_state_dict(ref.state_dict())
    u = torch.randn(1, 20, 64)
    with torch.no_grad():
        out, msgs = _warnings_of(lambda: tri(u))
        want = ref(u)
    assert calls == [16] and not any("falling back" in m for m in msgs)
    assert nmax(out, want) < 1e-4


# ---------------------------------------------------------------- tying


def test_tying_survives_copies_and_conversions():
    torch.manual_seed(0)
    model = Mamba3Transformer(ModelConfig.from_preset("tiny"))
    assert "lm_head.weight" not in model.state_dict() and "embed.weight" in model.state_dict()
    for m in (copy.deepcopy(model), model.to(torch.float64), model.double().float()):
        assert m.lm_head.weight is m.embed.weight
    other = Mamba3Transformer(ModelConfig.from_preset("tiny"))
    other.load_state_dict(model.state_dict(), assign=True)
    assert other.lm_head.weight is other.embed.weight
    assert torch.equal(other.lm_head.weight, model.embed.weight)  # exact: load_state_dict copies the values
    other.apply(lambda m: m.reset_parameters() if isinstance(m, torch.nn.Linear) else None)
    assert other.lm_head.weight is other.embed.weight
    # a gradient through the head lands on the embedding
    ids = torch.randint(0, 50257, (1, 5))
    other(ids[:, :-1], targets=ids[:, 1:]).loss.backward()
    assert other.embed.weight.grad is not None and other.embed.weight.grad.abs().sum() > 0


# ---------------------------------------------------------------- generation


@pytest.mark.parametrize("preset, extra", [("tiny-mimo", {}), ("tiny", {"ngroups": 2, "outproj_norm": True,
                                                                       "rope_fraction": 1.0, "chunk_size": 8})])
def test_greedy_generation_matches_recompute(preset, extra):
    torch.manual_seed(0)
    model = Mamba3Transformer(ModelConfig.from_preset(preset, **extra))
    prompt = torch.randint(0, 50257, (3, 5))
    assert torch.equal(model.generate(prompt, max_new_tokens=8, temperature=0), greedy_by_recompute(model, prompt, 8))  # exact: token ids


def test_training_after_generate(monkeypatch):
    "The decode step's cached constants are made outside inference mode, so a backward after a generate can save them."
    import mamba3_lite.ssd_fast as fast_mod
    monkeypatch.setattr(fast_mod, "_CONSTS", {})              # first asked for inside generate's inference mode
    torch.manual_seed(0)
    model = Mamba3Transformer(ModelConfig.from_preset("tiny", n_layers=1))
    prompt = torch.randint(0, 50257, (1, 4))
    model.generate(prompt, 2, temperature=0)
    model(prompt).logits.float().logsumexp(-1).mean().backward()
    norm = torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]).norm()
    print(f"after generate: gradient norm {norm:.3e}")
    assert torch.isfinite(norm) and norm > 0


def test_generate_edge_cases():
    torch.manual_seed(0)
    model = Mamba3Transformer(ModelConfig.from_preset("tiny"))
    prompt = torch.randint(0, 50257, (2, 4))
    one = prompt[:, :1]                                      # a one-token prompt: prefill of T = 1
    assert torch.equal(model.generate(one, 1, temperature=0), greedy_by_recompute(model, one, 1))  # exact: token ids
    assert torch.equal(model.generate(prompt, 0), prompt)  # exact: token ids
    out = model.generate(prompt, 5, top_k=1)                # top_k = 1 is greedy
    assert torch.equal(out, model.generate(prompt, 5, temperature=0))  # exact: token ids
    assert out.dtype == torch.long and out.shape == (2, 9)
    # once every row has produced eos, generation stops
    first = int(out[0, 4])
    both = model.generate(prompt[:1].expand(2, 4), 5, temperature=0, eos_id=first)
    assert both.shape == (2, 5) and (both[:, 4] == first).all()
    for bad, field in (({"temperature": -1.0}, "temperature"), ({"top_k": 0}, "top_k"),
                       ({"top_p": 0.0}, "top_p")):
        with pytest.raises(ValueError, match=field):
            model.generate(prompt, 2, **bad)
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(prompt, -1)
    with pytest.raises(ValueError, match="input_ids"):
        model.generate(prompt[0], 2)
    with pytest.raises(ValueError, match="token_ids"):
        model.step(prompt, model.allocate_cache(2))
    with pytest.raises(ValueError, match="cache"):
        model.step(prompt[:, 0], model.allocate_cache(2)[:2])


def test_sampling_respects_its_sets_over_many_rows():
    torch.manual_seed(0)
    logits = torch.randn(64, 30) * 3
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        tok = sample_next(logits, temperature=0.7, top_k=4, top_p=0.6, generator=g)
        top4 = logits.topk(4).indices
        assert (tok[:, None] == top4).any(-1).all()
        p = (logits / 0.7).softmax(-1)
        sp, order = p.sort(-1, descending=True)
        keep_sorted = (sp.cumsum(-1) - sp) < 0.6
        rank = (order == tok[:, None]).float().argmax(-1)
        assert keep_sorted.gather(-1, rank[:, None]).all()


def test_prefill_cache_owns_its_memory():
    torch.manual_seed(0)
    model = Mamba3Transformer(ModelConfig.from_preset("tiny"))
    _, cache = model.prefill(torch.randint(0, 50257, (2, 20)))
    for s in cache:
        assert isinstance(s, SSDState)
        for t in s:
            assert t.is_contiguous() and t.dtype == torch.float32
            assert t.untyped_storage().nbytes() == t.numel() * t.element_size()


# ---------------------------------------------------------------- mixed precision


def test_bf16_autocast_forward_backward_and_decode():
    torch.manual_seed(0)
    model = Mamba3Transformer(ModelConfig.from_preset("tiny"))
    ids = torch.randint(0, 50257, (2, 24))
    with torch.no_grad():
        ref = model(ids).logits
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(ids[:, :-1], targets=ids[:, 1:])
        inp = model.layers[0].mixer.ssd_inputs(torch.randn(2, 3, 64))
    out.loss.backward()
    assert torch.isfinite(out.loss) and out.loss.dtype == torch.float32
    assert all(t.dtype == torch.float32 for t in (inp.dt, inp.A, inp.lam, inp.theta))
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        ref16 = model(ids).logits.float()
        cache = model.allocate_cache(2)
        stepped = torch.stack([model.step(ids[:, t], cache) for t in range(24)], 1).float()
    # LM level: decode in bf16 is as close to the bf16 forward as the bf16 forward is to fp32
    assert nmax(stepped, ref16) < 2 * nmax(ref16, ref) + 1e-3
    # module level: bf16 decode vs bf16 forward, p95 of |a-b|/|b| over |b| >= 1e-2 below 5e-2
    blk = model.layers[0].mixer
    u = torch.randn(2, 24, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        y = blk(u).float()
        state, ys = blk.allocate_state(2), []
        for t in range(24):
            o, state = blk.step(u[:, t], state)
            ys.append(o.float())
    ys = torch.stack(ys, 1)
    assert p95(ys, y) < 5e-2
