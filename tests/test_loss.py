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


def test_chunked_loss_and_gradients_equal_the_full_loss_fp32_and_fp64():
    "Chunks that do not divide n, one larger than n, a chunk of ignored targets only; the loss and both gradients."
    import torch.nn.functional as F
    from mamba3_lite.loss import chunked_lm_loss, full_lm_loss

    def loss_and_grads(fn, h, w, t):
        h, w = h.detach().requires_grad_(), w.detach().requires_grad_()
        loss = fn(h, w, t)
        return (loss.detach(), *torch.autograd.grad(1.5 * loss, (h, w)))

    torch.manual_seed(0)
    for dtype, eps in ((torch.float32, 1e-5), (torch.float64, 1e-12)):
        h, w = torch.randn(2, 45, 24, dtype=dtype), torch.randn(301, 24, dtype=dtype)
        t = torch.randint(0, 301, (2, 45)); t[0, :12] = -100; t[1, -3] = -100
        ref = loss_and_grads(lambda h, w, t: full_lm_loss(F.linear(h, w), t), h, w, t)
        for chunk in (4, 7, 90, 500):
            got = loss_and_grads(lambda h, w, t: chunked_lm_loss(h, w, t, chunk_tokens=chunk), h, w, t)
            errs = [nmax(a, b) for a, b in zip(got, ref)]
            assert max(errs) <= eps, (dtype, chunk, errs)
