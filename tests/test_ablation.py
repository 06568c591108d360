"""The ablation switches (rotation, discretization, bc_bias, bc_norm): the defaults reproduce the model recorded
before the switches existed, the Mamba-2 special case equals the official Mamba-2 SSD, the switches travel through
YAML and --set, every switched model's parameter count has its closed form, and the official export refuses them.
MAMBA_SSM_SOURCE=<an official mamba_ssm source tree> enables the comparison with `ssd_minimal_discrete` (its
`einops` import is satisfied by a four-pattern stand-in when einops is not installed)."""
import importlib.util
import os
import sys
import types
from pathlib import Path

import pytest
import torch

from mamba3_lite.block import Mamba3Block
from mamba3_lite.model import Mamba3Transformer, ModelConfig, closed_form_num_parameters
from mamba3_lite.ssd import nmax, ssd_chunked

FIXTURES = Path(__file__).parent / "fixtures"
SWITCHES = [dict(rotation="fixed"), dict(rotation="none"), dict(discretization="half"), dict(discretization="euler"),
            dict(bc_bias=False), dict(bc_norm=False), dict(rotation="none", discretization="euler", bc_bias=False)]


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("preset", ["tiny", "tiny-mimo"])
def test_defaults_reproduce_the_model_from_before_the_switches(preset):
    gen = _load("make_default_golden", FIXTURES / "make_default_golden.py")
    golden = torch.load(gen.GOLDEN)[preset]
    now = gen.record(preset)
    exact = lambda h: {k: v for k, v in h.items() if not k.endswith(gen.INEXACT)}
    assert now["param_sha256"].keys() == golden["param_sha256"].keys()
    assert exact(now["param_sha256"]) == exact(golden["param_sha256"])   # drawn and constant parameters: bit for bit
    for k, ref in golden["params"].items():                        # exp/log results: AVX2 and AVX-512 differ in the last bits
        assert (now["params"][k] - ref).abs().max() <= 1e-6 * ref.abs().max(), k
    assert torch.equal(now["ids"], golden["ids"])                  # exact: token ids
    # fp32 rounding of sums whose order is not pinned (the chunked SSD's products, other CPUs' kernels): measured up
    # to 1.05e-6; moving one layer's D by 1e-3 moves the logits by 2.9e-4
    assert nmax(now["logits"], golden["logits"]) <= 1e-5


@pytest.mark.parametrize("kw", SWITCHES + [dict(rotation="fixed", is_mimo=True, mimo_rank=2)])
def test_switched_parameter_count_has_its_closed_form(kw):
    cfg = ModelConfig.from_preset("tiny", vocab_size=97, **kw)
    model = Mamba3Transformer(cfg)
    assert model.num_parameters() == closed_form_num_parameters(cfg)
    assert closed_form_num_parameters(cfg) != closed_form_num_parameters(ModelConfig.from_preset("tiny", vocab_size=97, is_mimo=cfg.is_mimo, mimo_rank=cfg.mimo_rank))


def test_switches_travel_through_yaml_and_set(tmp_path):
    from mamba3_lite.cli import _cli_config, train_parser
    from mamba3_lite.config import build_model_config, load_config
    y = tmp_path / "ablate.yaml"
    y.write_text("model:\n  preset: tiny\n  rotation: fixed\n  bc_bias: false\ndata:\n  data_path: nowhere\n")
    cfg = build_model_config(load_config(y), log=lambda *_: None)
    assert (cfg.rotation, cfg.bc_bias, cfg.discretization, cfg.bc_norm) == ("fixed", False, "trapezoid", True)
    a = train_parser().parse_args(["--config", str(y), "--set", "model.discretization=euler", "--set", "model.bc_norm=false"])
    cfg = build_model_config(_cli_config(a), log=lambda *_: None)
    assert (cfg.rotation, cfg.discretization, cfg.bc_norm) == ("fixed", "euler", False)
    a = train_parser().parse_args(["--config", str(y), "--set", "model.rotation=spin"])
    with pytest.raises(ValueError, match=r"rotation: expected one of \('data', 'fixed', 'none'\), got 'spin'"):
        build_model_config(_cli_config(a), log=lambda *_: None)


@pytest.mark.parametrize("kw", [dict(rotation="none"), dict(rotation="fixed"), dict(discretization="half"),
                                dict(bc_bias=False), dict(bc_norm=False)])
def test_official_export_refuses_a_switched_model(kw):
    from mamba3_lite.interop import to_mamba_ssm
    field = next(iter(kw))
    model = Mamba3Transformer(ModelConfig.from_preset("tiny", vocab_size=97, **kw))
    with pytest.raises(ValueError, match=f"^{field}: the official Mamba3 has no such switch"):
        to_mamba_ssm(model)


def _einops_stand_in():
    "The four einops patterns `ssd_minimal.py` uses."
    m = types.ModuleType("einops")
    def rearrange(x, pattern, **kw):
        if pattern == "b (c l) ... -> b c l ...": return x.reshape(x.shape[0], -1, kw["l"], *x.shape[2:])
        if pattern == "b c l h -> b h c l": return x.permute(0, 3, 1, 2)
        if pattern == "b c l h p -> b (c l) h p": return x.reshape(x.shape[0], -1, *x.shape[3:])
        raise NotImplementedError(pattern)
    def repeat(x, pattern, **kw):
        if pattern == "... d -> ... d e": return x[..., None].expand(*x.shape, kw["e"])
        raise NotImplementedError(pattern)
    m.rearrange, m.repeat = rearrange, repeat
    return m


@pytest.fixture
def official_ssd_minimal(monkeypatch):
    src = os.environ.get("MAMBA_SSM_SOURCE")
    if not src:
        pytest.skip("MAMBA_SSM_SOURCE (an official mamba_ssm source tree) not set")
    if importlib.util.find_spec("einops") is None:
        monkeypatch.setitem(sys.modules, "einops", _einops_stand_in())
    combined = types.ModuleType("mamba_ssm.ops.triton.ssd_combined")      # the CUDA kernel it imports, unused here
    combined.mamba_chunk_scan_combined = None
    for name in ("mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "mamba_ssm.ops.triton.ssd_combined", combined)
    return _load("official_ssd_minimal", Path(src) / "mamba_ssm" / "modules" / "ssd_minimal.py").ssd_minimal_discrete


def test_no_rotation_and_euler_is_the_official_mamba2_ssd(official_ssd_minimal):
    torch.manual_seed(0)
    blk = Mamba3Block(64, d_state=32, headdim=16, chunk_size=16, rotation="none", discretization="euler").double()
    with torch.no_grad():
        for p in blk.parameters(): p.add_(0.3 * torch.randn_like(p))
        u = torch.randn(2, 48, 64, dtype=torch.float64)
        inp = blk.ssd_inputs(u)
        assert inp.theta is None and bool((inp.lam == 1).all())
        X, dA = inp.x * inp.dt[..., None], inp.A * inp.dt
        y_official, h_official = official_ssd_minimal(X, dA, inp.B, inp.C, block_len=16)
        y_ours, state = ssd_chunked(inp.x, inp.dt, inp.A, inp.B, inp.C, inp.lam, chunk_size=16)
        assert nmax(y_ours, y_official) <= 1e-12
        assert nmax(state.h, h_official) <= 1e-12
        assert nmax(blk(u), blk._output(y_official + blk.D[:, None] * inp.x, inp.z)) <= 1e-12
        default = Mamba3Block(64, d_state=32, headdim=16, chunk_size=16).double()   # the Mamba-3 SSD is not Mamba-2's
        inp3 = default.ssd_inputs(u)
        y3, _ = ssd_chunked(inp3.x, inp3.dt, inp3.A, inp3.B, inp3.C, inp3.lam, theta=inp3.theta, chunk_size=16)
        assert nmax(y3, official_ssd_minimal(inp3.x * inp3.dt[..., None], inp3.A * inp3.dt, inp3.B, inp3.C, block_len=16)[0]) > 1e-3
