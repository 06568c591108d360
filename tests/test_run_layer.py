"""The run layer has one home per concern: the dataset makes `Batch`es that every consumer reads by name, the mixer's
fields live in `MixerConfig` (which `ModelConfig` extends and each `Mamba3Block` is built from), and `reset_at_eos` is
read where it acts. Static checks on the exported source, plus one tiny model on the meta device."""
import ast
import dataclasses
from pathlib import Path

import pytest
import torch

from mamba3_lite.block import Mamba3Block, MixerConfig
from mamba3_lite.data import Batch, PretrainDataset
from mamba3_lite.model import Mamba3Transformer, ModelConfig
from mamba3_lite.ssd import seq_idx_from_eos

PKG = Path(__file__).resolve().parent.parent / "mamba3_lite"
tree = lambda m: ast.parse((PKG / f"{m}.py").read_text())


@pytest.mark.parametrize("module", ["train", "evaluate", "streams", "cli", "harness", "data"])
def test_no_positional_batch_unpacking(module):
    "No `x, y, *docs = batch`: a batch's parts are read by name (`batch.x`, `batch.seq_idx`)."
    starred = [ast.unparse(n) for n in ast.walk(tree(module)) if isinstance(n, (ast.Assign, ast.For))
               for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
               if isinstance(t, ast.Tuple) and any(isinstance(e, ast.Starred) for e in t.elts)]
    assert not starred, starred


def test_the_dataset_makes_batches():
    with pytest.warns(UserWarning):
        plain = PretrainDataset(None, 16, 100, dummy=True, dummy_windows=4)
        docs = PretrainDataset(None, 16, 100, dummy=True, dummy_windows=4, reset_at_eos=True, seed=0)
    b, d = plain.get_batch([0, 3]), docs.get_batch([0, 3])
    assert isinstance(b, Batch) and b.seq_idx is None and b.x.shape == (2, 16)
    assert torch.equal(d.x, b.x) and torch.equal(d.seq_idx, seq_idx_from_eos(d.x, docs.eos_id))  # exact: token ids
    assert torch.equal(b.to("cpu").y, b.y) and b.to("cpu").seq_idx is None  # exact: the same tensor, moved to the same device


def test_mixer_fields_are_written_once():
    "ModelConfig extends MixerConfig without re-declaring its fields; every layer's block is built from the config itself."
    mixer = {f.name for f in dataclasses.fields(MixerConfig)}
    assert issubclass(ModelConfig, MixerConfig) and mixer <= {f.name for f in dataclasses.fields(ModelConfig)}
    model_cls = next(n for n in tree("model").body if isinstance(n, ast.ClassDef) and n.name == "ModelConfig")
    redeclared = {n.target.id for n in model_cls.body if isinstance(n, ast.AnnAssign)} & mixer
    assert not redeclared, redeclared
    names = {n.name for n in ast.walk(tree("block")) if isinstance(n, ast.FunctionDef)} | {
        n.name for n in ast.walk(tree("model")) if isinstance(n, ast.FunctionDef)}
    assert not names & {"check_mixer_args", "mixer_kwargs"}
    cfg = ModelConfig.from_preset("tiny", n_layers=2)
    with torch.device("meta"):
        model = Mamba3Transformer(cfg)
    blocks = [m for m in model.modules() if isinstance(m, Mamba3Block)]
    assert len(blocks) == 2 and all(b.config is cfg for b in blocks)
    assert Mamba3Block(64, d_state=32, headdim=16, chunk_size=16).config == MixerConfig(64, 32, headdim=16, chunk_size=16)
    with pytest.raises(ValueError, match="headdim"):
        MixerConfig(d_model=64, headdim=48)


def test_reset_at_eos_is_read_where_it_acts():
    """Read by the config (its field), the dataset (`PretrainDataset.from_config`, the one place a run's dataset is made,
    for the streams and for eval alike) and `generate`; in the CLI only the train flag that sets the field and generate;
    in train only the startup banner that shows it."""
    readers = {}
    for m in sorted(PKG.glob("*.py")):
        if m.stem == "_modidx": continue
        for top in tree(m.stem).body:
            if any(isinstance(n, ast.Attribute) and n.attr == "reset_at_eos" for n in ast.walk(top)):
                readers.setdefault(m.stem, set()).add(getattr(top, "name", "<module>"))
    assert sorted(readers) == ["cli", "data", "train"], readers
    assert readers["cli"] == {"_cli_config", "generate_cli"}, readers["cli"]
    assert readers["train"] == {"_banner_options"}, readers["train"]
    assert "from_config" in readers["data"], readers["data"]
    assert not any("get_doc_batch" in (PKG / f"{m}.py").read_text() for m in ("data", "evaluate", "streams", "train", "cli"))


def test_one_name_for_the_checkpoint_directory():
    "The directory of checkpoints + metrics.jsonl is `checkpoint_dir` in every module that handles it (`save_dir`, `run_dir`: never)."
    import re
    found = {m: sorted(set(re.findall(r"(?<![\w.])(?:\w+\.)?(?:save_dir|run_dir)\b|['\"](?:save_dir|run_dir)['\"]", (PKG / f"{m}.py").read_text())))
             for m in ("checkpoint", "train", "logger", "cli", "config", "interop", "harness")}
    found["cli"] = [n for n in found["cli"] if n != "args.run_dir"]   # quickstart's --run-dir: the parent that holds checkpoints/
    assert not any(found.values()), found
