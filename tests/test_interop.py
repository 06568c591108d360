"""Weights in and out of the official mamba_ssm layout, checked against golden files the official code wrote
(tests/fixtures/README.md). MAMBA_SSM_SOURCE=<state-spaces/mamba tree at e9594ce> (einops and huggingface_hub
installed) also runs the official `MambaLMHeadModel.from_pretrained` on what `save_pretrained` writes."""
import importlib.util
import json
import os
import sys
import types
from pathlib import Path

import pytest
import safetensors.torch
import torch

from mamba3_lite.interop import (from_mamba_ssm, from_pretrained, mamba_ssm_config, model_config_from_mamba_ssm,
                                 save_pretrained, to_mamba_ssm)
from mamba3_lite.model import Mamba3Transformer, ModelConfig
from mamba3_lite.ssd import nmax

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = FIXTURES / "mamba_ssm_e9594ce"
VARIANTS = {"siso": ("tiny", {}), "siso-rope1": ("tiny", dict(rope_fraction=1.0, ngroups=2)),
            "mimo-outnorm": ("tiny-mimo", dict(outproj_norm=True, ngroups=2)), "mimo-rope1": ("tiny-mimo", dict(rope_fraction=1.0)),
            "bare": ("tiny", dict(d_ff=0, tie_embeddings=False))}    # no MLP, an untied head


def perturbed(cfg: ModelConfig, seed=0) -> Mamba3Transformer:
    "Every parameter random: no all-ones norm weight or bias can hide a misplaced or mispermuted tensor."
    torch.manual_seed(seed)
    m = Mamba3Transformer(cfg)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return m.eval()


def golden(name):
    d = GOLDEN / name
    return (json.loads((d / "config.json").read_text()), safetensors.torch.load_file(d / "model.safetensors"),
            safetensors.torch.load_file(d / "golden.safetensors"))


@pytest.mark.parametrize("variant", VARIANTS)
def test_round_trip_ours_official_ours_is_bit_exact(variant, tmp_path):
    preset, over = VARIANTS[variant]
    m = perturbed(ModelConfig.from_preset(preset, vocab_size=1001, **over))
    ids = torch.randint(0, 1001, (2, 24))
    save_pretrained(m, tmp_path)
    for back in (from_mamba_ssm(*to_mamba_ssm(m)), from_pretrained(tmp_path)):
        assert back.config == m.config
        for (k, a), b in zip(m.state_dict().items(), back.state_dict().values()):
            assert torch.equal(a, b), k  # exact: copies and permutations
        with torch.no_grad():
            assert torch.equal(back(ids).logits, m(ids).logits)  # exact: equal weights, the same ops on the same shapes
    (tmp_path / "model.safetensors").unlink()                     # the official loader's only file also suffices
    assert torch.equal(from_pretrained(tmp_path).state_dict()["embed.weight"], m.state_dict()["embed.weight"])  # exact: round trip


@pytest.mark.parametrize("name, d_ff", [("siso", 256), ("mimo", 192), ("siso_bare", 0)])
def test_golden_official_weights_reproduce_official_logits(name, d_ff):
    config, sd, g = golden(name)
    m = from_mamba_ssm(config, sd).eval()
    assert m.config.d_ff == d_ff          # siso: learnt (nonzero) MLP padding kept; mimo: zero padding trimmed; bare: none
    assert m.config.tie_embeddings == config["tie_embeddings"]    # siso_bare: the official untied head, d_intermediate 0
    V = m.config.vocab_size
    with torch.no_grad():
        e32 = nmax(m(g["input_ids"]).logits, g["logits"][..., :V])
        e64 = nmax(m.double()(g["input_ids"]).logits, g["logits"][..., :V])
    print(f"{name}: logits rel. error float32 {e32:.2e}, float64 {e64:.2e}")
    assert e32 <= 1e-5, e32
    assert e64 <= 1e-12, e64


@pytest.mark.parametrize("name", ["siso", "mimo", "siso_bare"])
def test_golden_round_trip_official_ours_official_is_bit_exact(name):
    config, sd, _ = golden(name)
    config2, sd2 = to_mamba_ssm(from_mamba_ssm(config, sd))
    if name == "siso":      # learnt padding: our d_ff is the official width, the same GatedMLP (192 and 256 -> 256)
        assert config2["d_intermediate"] == 256
        config2["d_intermediate"] = config["d_intermediate"]
    assert config2 == config
    assert list(sd2) == list(json.loads((GOLDEN / name / "official_layout.json").read_text()))
    rows = ["backbone.embedding.weight"] + ["lm_head.weight"] * (not config["tie_embeddings"])   # (an untied head's too)
    for emb in rows:                    # the official rows past vocab_size (random here) come back as zeros
        assert torch.equal(sd2[emb][:1001], sd[emb][:1001]) and not sd2[emb][1001:].any() and sd[emb][1001:].any()  # exact: round trip
    for k, v in sd.items():
        assert k in rows or torch.equal(sd2[k], v), k  # exact: round trip


@pytest.mark.parametrize("name", ["siso", "mimo", "siso_bare"])
def test_export_reproduces_the_official_config_and_layout(name):
    config = json.loads((GOLDEN / name / "config.json").read_text())
    layout = json.loads((GOLDEN / name / "official_layout.json").read_text())
    m = Mamba3Transformer(model_config_from_mamba_ssm(config))    # d_ff 192: export must pad to the official 256
    ours_config, sd = to_mamba_ssm(m)
    assert ours_config == config
    assert [(k, list(v.shape)) for k, v in sd.items()] == list(layout.items())
    assert (sd["lm_head.weight"] is sd["backbone.embedding.weight"]) == config["tie_embeddings"]


def _one_line(exc_info):
    msg = str(exc_info.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize("change, field", [
    (dict(attn_layer_idx=[0]), "attn_layer_idx:"), (dict(rms_norm=False), "rms_norm:"),
    (dict(tie_embeddings="false"), "tie_embeddings:"), (dict(d_intermediate=-1), "d_intermediate:"),
    (dict(ssm_cfg={"layer": "Mamba2"}), "ssm_cfg.layer:"), (dict(ssm_cfg={}), "ssm_cfg.layer:"),
    (dict(ssm_cfg={"layer": "Mamba3", "rope_fraction": 0.25}), "ssm_cfg.rope_fraction:"),
    (dict(ssm_cfg={"layer": "Mamba3", "Afloor": 1e-4}), "ssm_cfg.Afloor:"), (dict(norm_epsilon=1e-6), "norm_epsilon:")])
def test_unrepresentable_official_configs_are_refused_in_one_line(change, field):
    config, sd, _ = golden("siso")
    with pytest.raises(ValueError) as e:
        from_mamba_ssm({**config, **change}, sd)
    assert _one_line(e).startswith(field)


def test_export_refuses_a_model_without_an_official_twin():
    with pytest.raises(ValueError) as e:
        mamba_ssm_config(ModelConfig.from_preset("tiny", norm_eps=1e-6))
    assert _one_line(e).startswith("norm_eps: the official model's norms always use eps 1e-05")


def test_bad_weights_are_refused_naming_the_key(tmp_path):
    config, sd, _ = golden("mimo")
    for bad, key in (({k: v for k, v in sd.items() if k != "backbone.norm_f.weight"}, "backbone.norm_f.weight"),
                     ({**sd, "backbone.layers.1.mixer.D": torch.ones(3)}, "backbone.layers.1.mixer.D"),
                     ({**sd, "lm_head.weight": torch.zeros_like(sd["backbone.embedding.weight"])}, "lm_head.weight"),
                     ({**sd, "backbone.layers.2.norm.weight": torch.ones(64)}, "backbone.layers.2.norm.weight")):
        with pytest.raises(ValueError) as e:
            from_mamba_ssm(config, bad)
        assert _one_line(e).startswith(key + ":")
    with pytest.raises(FileNotFoundError) as e:
        from_pretrained(tmp_path)
    assert "config.json: missing" in _one_line(e)


def test_hub_ids_go_through_huggingface_hub(tmp_path, monkeypatch):
    config, sd, g = golden("siso")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "config.json").write_text(json.dumps(config))
    torch.save({**sd, "lm_head.weight": sd["backbone.embedding.weight"]}, repo / "pytorch_model.bin")
    asked = []

    def hf_hub_download(repo_id, filename):
        asked.append((repo_id, filename))
        if not (repo / filename).exists():
            raise FileNotFoundError(f"404 {filename}")
        return str(repo / filename)

    monkeypatch.setitem(sys.modules, "huggingface_hub", types.SimpleNamespace(hf_hub_download=hf_hub_download))
    m = from_pretrained("someone/mamba3-tiny")
    assert asked == [("someone/mamba3-tiny", "config.json"), ("someone/mamba3-tiny", "model.safetensors"),
                     ("someone/mamba3-tiny", "pytorch_model.bin")]
    with torch.no_grad():
        assert nmax(m(g["input_ids"]).logits, g["logits"][..., :1001]) <= 1e-5
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)     # not installed
    with pytest.raises(FileNotFoundError) as e:
        from_pretrained("someone/mamba3-tiny")
    assert "huggingface_hub is not installed" in _one_line(e)


@pytest.mark.skipif(not os.environ.get("MAMBA_SSM_SOURCE"), reason="MAMBA_SSM_SOURCE (official source at e9594ce) not set")
@pytest.mark.parametrize("variant", ["siso", "mimo-outnorm", "bare"])
def test_official_from_pretrained_loads_what_we_write(variant, tmp_path):
    spec = importlib.util.spec_from_file_location("make_official_golden", FIXTURES / "make_official_golden.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    official = gen.load_official(Path(os.environ["MAMBA_SSM_SOURCE"]).resolve())
    preset, over = VARIANTS[variant]
    ours = perturbed(ModelConfig.from_preset(preset, vocab_size=1001, **over))
    save_pretrained(ours, tmp_path)
    theirs = official.MambaLMHeadModel.from_pretrained(str(tmp_path)).eval()
    ids = torch.randint(0, 1001, (2, 32))
    with torch.no_grad():
        err = nmax(ours(ids).logits, theirs(ids).logits[..., :1001])
    print(f"{variant}: ours vs official from_pretrained, float32 logits rel. error {err:.2e}")
    assert err <= 1e-5
