"""Training throughput of the tiny Mamba-3 preset on CPU against a same-size GPT baseline.

Both models run the same loop (forward, loss, backward, AdamW step, fp32) at the same batch and sequence
length on the same random tokens; the GPT is plain PyTorch with `scaled_dot_product_attention`, its depth
chosen so its parameter count is the closest to the Mamba model's. Prints tokens/s of each and the ratio.

    python bench/train_cpu.py [--batch 8] [--seq-len 256] [--steps 10] [--warmup 2] [--threads 2]
"""
import argparse
import math
import time
from collections import namedtuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from mamba3_lite.model import Mamba3Transformer, ModelConfig
from mamba3_lite.config import LoopConfig
from mamba3_lite.train import build_optimizer, keep_freed_memory_in_heap, train_step


LMOut = namedtuple("LMOut", "logits loss")


class GPTBlock(nn.Module):
    "Pre-norm causal self-attention + GELU MLP (4x)."
    def __init__(self, d: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):  # (b, T, d)
        b, T, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, T, 3, self.n_heads, d // self.n_heads).unbind(2)  # (b, T, h, hd)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, T, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    "A GPT-2-style LM with tied embeddings and learned positions; forward matches Mamba3Transformer's."
    def __init__(self, vocab_size: int, d: int, n_layers: int, n_heads: int, max_len: int):
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab_size, d), nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(GPTBlock(d, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab_size, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, input_ids, targets=None):
        x = self.embed(input_ids) + self.pos(torch.arange(input_ids.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten()) if targets is not None else None
        return LMOut(logits, loss)

    def param_groups(self, weight_decay):
        params = {id(p): p for p in self.parameters()}.values()
        return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
                {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


def n_params(m):
    return sum(p.numel() for p in {id(p): p for p in m.parameters()}.values())


def tokens_per_s(model, loop, batch, seq_len, vocab, steps, warmup):
    g = torch.Generator().manual_seed(0)
    opt = build_optimizer(model, loop)
    data = [torch.randint(0, vocab, (batch, seq_len + 1), generator=g) for _ in range(steps + warmup)]
    for i, w in enumerate(data):
        if i == warmup:
            t0 = time.perf_counter()
        r = train_step(model, opt, [(w[:, :-1], w[:, 1:])], max_grad_norm=1.0)
        assert math.isfinite(r.loss)
    return steps * batch * seq_len / (time.perf_counter() - t0)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny", help="Mamba-3 model preset (default: tiny)")
    p.add_argument("--batch", type=int, default=8, help="sequences per step (default: 8)")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per sequence (default: 256)")
    p.add_argument("--steps", type=int, default=10, help="timed training steps (default: 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (default: 2)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    a = p.parse_args(argv)
    torch.set_flush_denormal(True)
    keep_freed_memory_in_heap()  # as the CPU trainer does (both models allocate (b, T, V) logits each step)
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    mamba = Mamba3Transformer(ModelConfig.from_preset(a.preset, ssd_dispatch="pytorch", grad_checkpoint=False))
    cfg = mamba.config
    target = n_params(mamba)
    d = cfg.d_model
    heads = max(1, d // 16)
    depth = min(range(1, 65), key=lambda L: abs(n_params(GPT(cfg.vocab_size, d, L, heads, a.seq_len)) - target))
    gpt = GPT(cfg.vocab_size, d, depth, heads, a.seq_len)
    loop = LoopConfig(lr=1e-3, weight_decay=0.1)
    rows = []
    for name, m in (("mamba3 " + a.preset, mamba), (f"gpt d={d} L={depth} sdpa", gpt)):
        rows.append((name, n_params(m), tokens_per_s(m, loop, a.batch, a.seq_len, cfg.vocab_size, a.steps, a.warmup)))
    print(f"CPU training throughput, batch {a.batch} x seq {a.seq_len}, threads {torch.get_num_threads()}, fp32")
    print(f"{'model':<28}{'params':>12}{'tokens/s':>12}")
    for name, n, tps in rows:
        print(f"{name:<28}{n:>12,}{tps:>12,.0f}")
    print(f"ratio mamba3 / gpt tokens/s: {rows[0][2] / rows[1][2]:.2f}")


if __name__ == "__main__":
    main()
