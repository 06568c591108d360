"""The training and evaluation loss (`lm_loss`, hence `train_step` and `evaluate`) runs the chunked loss: nothing of
size (b, T, V) is kept for backward, and it equals the loss of the materialised logits."""
import torch
from torch.autograd.graph import saved_tensors_hooks

from mamba3_lite.data import Batch
from mamba3_lite.evaluate import evaluate, lm_loss
from mamba3_lite.model import Mamba3Transformer, ModelConfig
from mamba3_lite.ssd import nmax, seq_idx_from_eos


def largest_saved(fn):
    "(result of fn, bytes of the largest storage autograd saved while it ran)."
    sizes = [0]
    with saved_tensors_hooks(lambda t: sizes.append(t.untyped_storage().nbytes()) or t, lambda t: t):
        out = fn()
    return out, max(sizes)


def test_lm_loss_keeps_no_logits_and_equals_the_full_loss():
    torch.manual_seed(0)
    model = Mamba3Transformer(ModelConfig.from_preset("tiny"))
    ids = torch.randint(0, 50257, (4, 65))
    x, y = ids[:, :-1], ids[:, 1:]
    logits_bytes = x.numel() * 50257 * 4
    for batch in (Batch(x, y), Batch(x, y, seq_idx_from_eos(x, int(x[0, 10])))):
        loss, largest = largest_saved(lambda: lm_loss(model, batch))
        assert largest <= 50257 * 64 * 4 < logits_bytes, largest   # at most the head weight's gradient
        full, full_largest = largest_saved(lambda: model(x, targets=y, seq_idx=batch.seq_idx).loss)
        assert full_largest >= logits_bytes
        assert nmax(loss, full) < 1e-6
        loss.backward()
    r = evaluate(model, [Batch(x, y)])
    with torch.no_grad():
        assert r["loss"] == lm_loss(model, Batch(x, y)).item()   # evaluation and training: the same ops, the same loss
        assert abs(r["loss"] - model(x, targets=y).loss.item()) < 1e-5
