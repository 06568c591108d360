"""The GPU suite's decode section: the fused decode step and generation, checked and timed on one card.

1. check: the fused step (`mamba3_lite.decode.decode_step`) against the block's PyTorch step on the device, at the
   Mamba-3 paper's decode shape (Table 6: batch 128, 64 heads of P = 64, d_state 128, S = 32), a few steps with
   resets: fp32 in_proj rows and cache, nmax <= 1e-4 (output and state); the 434M preset's step runs the fused kernel
   (`decode_dispatch="auto"`); and `generate` with and without CUDA graphs (434M preset, bf16 weights, greedy and
   seeded top-k sampling): the same tokens.
2. kernel: ms per layer step at Table 6's shape, batch 1 and 128, d_state 128 and 64, bf16 in_proj rows: ours with an
   fp32 and with a bf16 cache, and the official `mamba3_siso_step` (https://github.com/state-spaces/mamba,
   mamba_ssm/ops/triton/mamba3/mamba3_siso_step.py, imported as bench/official.py does: the wheel in bench/peers or
   $MAMBA3_LITE_OFFICIAL_SRC; its fp32 state in and out, `official_step_inputs`). Each is timed
   as a loop of launches (graphs off) and as the same launches captured in one CUDA graph and replayed (graphs on),
   in interleaved rounds on the same card, medians; the official kernel's autotune list cut to --peer-configs.
3. generate: the 434M preset (bf16 weights, random), 64-token prompts, greedy, the fused step: decode ms per token and
   tokens/s at batch 1 and 128, graphs on and off. A token's time is the difference of two `generate` lengths over
   the tokens between them (the prefill and the capture cancel).

--out DIR gets decode_gpu.json and decode_gpu.md, rewritten after every row and on SIGINT (the suite's cap).

    python bench/decode_gpu.py --out /tmp/decode            # on a GPU
    python bench/decode_gpu.py --smoke --cpu                 # harness check: the interpreter, tiny shapes, no timings claimed
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

if "--cpu" in sys.argv:                                  # before any kernel module is imported
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from mamba3_lite.block import Mamba3Block, step_constants  # noqa: E402
from mamba3_lite.decode import decode_step  # noqa: E402
from mamba3_lite.files import atomic_write  # noqa: E402
from mamba3_lite.model import Mamba3Transformer, ModelConfig  # noqa: E402
from mamba3_lite.ssd import SSDState, nmax  # noqa: E402
from official import official_or_reason  # noqa: E402

P = 64


class Report:
    "The section's rows, written to OUT/decode_gpu.json and .md after each one."
    def __init__(self, out, meta):
        self.out, self.rec = (Path(out) if out else None), dict(meta=meta, checks=[], kernel=[], generate=[], interrupted=None)
        if self.out: self.out.mkdir(parents=True, exist_ok=True)

    def add(self, part, row):
        self.rec[part].append(row)
        self.save()

    def save(self):
        if not self.out: return
        atomic_write(self.out / "decode_gpu.json", lambda t: t.write_text(json.dumps(self.rec, indent=1)), sync_dir=False)
        atomic_write(self.out / "decode_gpu.md", lambda t: t.write_text(self.markdown()), sync_dir=False)

    def markdown(self):
        m = self.rec["meta"]
        lines = [f"# decode on {m['device']} (torch {m['torch']}, triton {m['triton']})", ""]
        lines += [f"- check {c['name']}: {'ok' if c['ok'] else 'FAILED'} ({c['value']})" for c in self.rec["checks"]]
        if self.rec["kernel"]:
            lines += ["", f"ms per layer step at {P}-wide heads (Table 6: Mamba-3 SISO 0.156 ms at N 128, 0.110 at N 64, "
                      "one H100, batch 128)", "", "| batch | heads | N | kernel | cache | graphs off ms | graphs on ms |",
                      "|---|---|---|---|---|---|---|"]
            lines += [f"| {r['b']} | {r['H']} | {r['N']} | {r['kernel']} | {r['cache']} | {fmt(r.get('ms_graphs_off'))} | "
                      f"{fmt(r.get('ms_graphs_on'))} |" for r in self.rec["kernel"]]
        if self.rec["generate"]:
            lines += ["", "generate, greedy, fused step: decode time per token", "",
                      "| preset | batch | graphs | ms per token | ms per layer step | tokens/s |", "|---|---|---|---|---|---|"]
            lines += [f"| {r['preset']} | {r['b']} | {r['graphs']} | {fmt(r['ms_per_token'])} | {fmt(r['ms_per_layer_step'])} "
                      f"| {r['tokens_per_s']:,.0f} |" for r in self.rec["generate"]]
        if self.rec["interrupted"]: lines += ["", self.rec["interrupted"]]
        return "\n".join(lines) + "\n"


def fmt(x): return "—" if x is None else f"{x:.4f}"


def timer(cuda):
    "A callable running fn `n` times and returning seconds: CUDA events on a GPU, the wall clock elsewhere."
    def run(fn, n):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n): fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        for _ in range(n): fn()
        return time.perf_counter() - t0
    return run


def as_graph(fn, n):
    "n calls of fn captured into one CUDA graph (after a warm-up call on a side stream): its replay."
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n): fn()
    return g.replay


def ours(b, H, N, cache, dev):
    "A launch of `decode_step` at (b, H, P, N) on bf16 in_proj rows, advancing its cache in place."
    torch.manual_seed(0)
    blk = Mamba3Block(H * P // 2, d_state=N, headdim=P, state_dtype=cache).to(device=dev, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        c = step_constants(blk, list(blk.parameters()), blk._make_step_constants)
    proj, state = torch.randn(b, blk.d_in_proj, device=dev).bfloat16(), blk.allocate_state(b)
    return lambda: decode_step(blk, proj, c, state)


def official_step_inputs(b, H, N, device="cpu", seed=0):
    """The official `mamba3_siso_step`'s arguments at (b, H, P, N), S = N/4, as it takes them: Q, K one group (b, 1, N)
    bf16, V and Z (b, H, P) bf16, ADT and DT (b, H) fp32, the trapezoid logit (b, H) bf16, angles (b, H, S) fp32,
    biases and D fp32; its input state fp32 (what it writes) with the v state bf16 (it returns V as the next one)."""
    g = torch.Generator().manual_seed(seed)
    rn = lambda *s, dtype=torch.float32: torch.randn(*s, generator=g).to(device=device, dtype=dtype)
    S = N // 4
    return dict(Q=rn(b, 1, N, dtype=torch.bfloat16), K=rn(b, 1, N, dtype=torch.bfloat16), V=rn(b, H, P, dtype=torch.bfloat16),
                ADT=-rn(b, H).abs(), DT=rn(b, H).abs() * 0.1, Trap=rn(b, H, dtype=torch.bfloat16), Q_bias=rn(H, N),
                K_bias=rn(H, N), Angles=rn(b, H, S), D=rn(H), Z=rn(b, H, P, dtype=torch.bfloat16),
                Input_States=(rn(b, H, S), rn(b, H, P, N), rn(b, H, N), rn(b, H, P, dtype=torch.bfloat16)))


def official(step, b, H, N, dev):
    "A call of the official `mamba3_siso_step` at (b, H, P, N) on `official_step_inputs`."
    kw = official_step_inputs(b, H, N, dev)
    return lambda: step(**kw)


def load_official(cpu, keep):
    "The official `mamba3_siso_step` (interpreter stand-ins with --cpu), its autotune list cut to `keep`; or why not."
    if cpu:
        try:
            from ssd_traffic import official_siso      # the interpreter's stand-ins for the official PTX helpers
            official_siso()
        except ModuleNotFoundError as e:
            return f"official unavailable: {e}"
    step = official_or_reason("ops.triton.mamba3.mamba3_siso_step", "mamba3_siso_step",
                              "not installed (bench/fetch_peers.sh, or $MAMBA3_LITE_OFFICIAL_SRC on PYTHONPATH)")
    if isinstance(step, str): return step
    from ssd_kernel import limit_autotune, peer_modules
    limit_autotune(peer_modules("mamba_ssm.ops.triton.mamba3.mamba3_siso_step"), 1 if cpu else keep)
    if cpu:
        import triton
        triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8))
    return step


def check_step(rep, dev, b, H, N):
    "The fused step against the block's PyTorch step, fp32, 3 steps with resets: nmax of output and state."
    torch.manual_seed(0)
    blk = Mamba3Block(H * P // 2, d_state=N, headdim=P).to(dev).eval()
    c = step_constants(blk, list(blk.parameters()), blk._make_step_constants)
    g = torch.Generator(device=dev).manual_seed(1)
    ref = SSDState(*(torch.randn(t.shape, generator=g, device=dev) for t in blk.allocate_state(b)))
    mine, worst = SSDState(*(t.clone() for t in ref)), 0.
    with torch.no_grad():
        for t in range(3):
            u, reset = torch.randn(b, blk.d_model, generator=g, device=dev), torch.arange(b, device=dev) % 3 == t
            blk.decode_dispatch = "pytorch"
            out, ref = blk.step(u, ref, reset)
            y, mine = decode_step(blk, torch.mm(u, c.w_in), c, mine, reset)
            worst = max([worst, nmax(torch.mm(y, c.w_out), out)] + [nmax(x, r) for x, r in zip(mine, ref)])
    rep.add("checks", dict(name=f"fused step vs PyTorch step, fp32, b{b} H{H} N{N}", value=f"nmax {worst:.1e} <= 1e-4",
                           ok=worst <= 1e-4))
    return worst <= 1e-4


def decode_ms(model, prompt, n1, n2, graphs, sync):
    "Decode seconds per token: the difference of two greedy `generate` lengths over the tokens between them."
    def run(n):
        sync(); t0 = time.perf_counter()
        model.generate(prompt, n, temperature=0, cuda_graph=graphs)
        sync(); return time.perf_counter() - t0
    run(n1)                                              # warm-up (kernels compile)
    return (run(n2) - run(n1)) / (n2 - n1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="fewer rounds and rows")
    p.add_argument("--cpu", action="store_true", help="harness check on the CPU: the interpreter, tiny shapes")
    p.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds (default 7; --smoke 3)")
    p.add_argument("--launches", type=int, default=None, help="launches a timing round (default 50; --cpu 1)")
    p.add_argument("--peer-configs", type=int, default=3, help="autotune configs kept for the official kernel")
    p.add_argument("--out", default=None, help="directory for decode_gpu.json and decode_gpu.md")
    a = p.parse_args(argv)
    if not a.cpu and not torch.cuda.is_available():
        print("bench/decode_gpu.py: no CUDA device (use --smoke --cpu for a harness check)", file=sys.stderr)
        return 2
    import triton
    dev = torch.device("cpu" if a.cpu else "cuda")
    cuda, sync = dev.type == "cuda", (torch.cuda.synchronize if dev.type == "cuda" else (lambda: None))
    rounds = a.rounds or (3 if a.smoke else 7)
    launches = a.launches or (1 if a.cpu else 50)
    rep = Report(a.out, dict(device=torch.cuda.get_device_name() if cuda else "CPU (interpreter: no timings claimed)",
                             torch=torch.__version__, triton=triton.__version__, rounds=rounds, launches=launches))
    shapes = [(2, 2, 16)] if a.cpu else [(b, 64, N) for N in (128, 64) for b in (128, 1)]
    if a.smoke and not a.cpu: shapes = shapes[:1] + shapes[2:3]
    try:
        ok = check_step(rep, dev, *((3, 2, 16) if a.cpu else (128, 64, 128)))
        step = load_official(a.cpu, a.peer_configs)
        if isinstance(step, str): rep.rec["meta"]["official"] = step; print(step)
        time_of = timer(cuda)
        for b, H, N in shapes:
            cands = {("decode_step", c): ours(b, H, N, c, dev) for c in ("fp32", "bf16")}
            if not isinstance(step, str): cands[("official mamba3_siso_step", "fp32")] = official(step, b, H, N, dev)
            runs = {k: {"off": (lambda f=f: time_of(f, launches))} for k, f in cands.items()}
            if cuda:
                for k, f in cands.items():
                    replay = as_graph(f, launches)
                    runs[k]["on"] = lambda r=replay: time_of(r, 1)
            times = {(k, m): [] for k, ms in runs.items() for m in ms}
            for k, ms in runs.items():                   # warm-up: compile, autotune
                for m, run in ms.items(): run()
            for _ in range(rounds):                      # interleaved rounds
                for (k, m) in times: times[(k, m)].append(runs[k][m]() / launches)
            for (name, cache) in cands:
                med = lambda m: 1e3 * statistics.median(times[((name, cache), m)]) if ((name, cache), m) in times else None
                rep.add("kernel", dict(b=b, H=H, N=N, kernel=name, cache=cache, ms_graphs_off=med("off"), ms_graphs_on=med("on")))
                print(f"b{b} H{H} N{N} {name} ({cache}): graphs off {fmt(med('off'))} ms, on {fmt(med('on'))} ms", flush=True)
        preset = "tiny" if a.cpu else "a100-400m"
        torch.manual_seed(0)
        model = Mamba3Transformer(ModelConfig.from_preset(preset, decode_dispatch="triton" if a.cpu else "auto")).to(dev)
        if cuda: model = model.to(torch.bfloat16)
        with torch.no_grad():
            fused = model.layers[0].mixer._fused_step(torch.zeros(1, model.config.d_model, device=dev)) is not None
        rep.add("checks", dict(name=f"{preset}: the step runs the fused kernel", value=f"{fused}", ok=fused))
        ok &= fused
        n1, n2 = (1, 3) if a.cpu else (16, 16 + (32 if a.smoke else 96))
        for b in ((1, 2) if a.cpu else (1, 128)):
            prompt = torch.randint(0, model.config.vocab_size, (b, 8 if a.cpu else 64), device=dev)
            if cuda:
                for kw in (dict(temperature=0), dict(seed=3, top_k=50)):
                    same = torch.equal(model.generate(prompt, 24, **kw), model.generate(prompt, 24, cuda_graph=False, **kw))
                    rep.add("checks", dict(name=f"generate {kw}, graphs on vs off, {preset} b{b}", value=f"same tokens: {same}", ok=same))
                    ok &= same
            for graphs in ((True, False) if cuda else (False,)):
                s = decode_ms(model, prompt, n1, n2, graphs, sync)
                rep.add("generate", dict(preset=preset, b=b, graphs="on" if graphs else "off", ms_per_token=1e3 * s,
                                         ms_per_layer_step=1e3 * s / model.config.n_layers, tokens_per_s=b / s))
                print(f"generate {preset} b{b} graphs {'on' if graphs else 'off'}: {1e3 * s:.3f} ms a token", flush=True)
    except KeyboardInterrupt:
        rep.rec["interrupted"] = "interrupted (SIGINT): the rows above are what finished"
        rep.save()
        return 130
    print(rep.markdown())
    return 0 if ok else 1


if __name__ == "__main__":
    import sigint_once
    sigint_once.install()
    sys.exit(main())
