"""The full CPU case grid for `ssd_triton` (Triton interpreter via conftest, fp32, ieee dots): outputs
and final states vs `ssd_chunked` (nmax <= 1e-4) and every input gradient vs autograd through `ssd_chunked`
(nmax <= 1e-3), for T in {1, 15, 16, 17, 50, 130}, chunk sizes 16 and 32, with and without an initial state and
theta; other block dims; bad dims raise. bf16 runs only on a GPU."""
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import triton

from mamba3_lite.ssd import SSDState, angle_err, nmax, ssd_chunked, ssd_random_inputs, ssd_random_state
from mamba3_lite.ssd_triton import KERNELS, autotune_configs, check_block_dims, default_config, ssd_triton
from mamba3_lite.testing import assert_grads_close, ssd_case, ssd_grads, ssd_run_with_grads


@pytest.fixture
def chunks_as_given(monkeypatch):
    """fp32 runs the kernels at the chunk size the test gives (not at most `FP32_CHUNK`), so the interpreter checks
    the kernels at every chunk size a bf16 launch may use."""
    import mamba3_lite.ssd_triton as st
    monkeypatch.setattr(st, "FP32_CHUNK", 256)


CASES = [(T, L, init, S) for T in (1, 15, 16, 17, 50, 130) for L in (16, 32) for init in (False, True) for S in (0, 4)]


@pytest.mark.parametrize("T,L,init,S", CASES)
def test_outputs_states_and_every_gradient_match_ssd_chunked(chunks_as_given, T, L, init, S):
    kw, state = ssd_case(T, S, init, seed=1000 * T + 10 * L + 2 * init + S)
    y, st, g_tri = ssd_run_with_grads(ssd_triton, kw, state, chunk_size=L)
    y_ref, st_ref, g_ref = ssd_run_with_grads(ssd_chunked, kw, state, chunk_size=L)
    assert y.shape == y_ref.shape and y.dtype == y_ref.dtype
    assert nmax(y, y_ref) <= 1e-4
    for name, a, r in zip(SSDState._fields, st, st_ref):
        assert a.shape == r.shape, name
        if r.numel():
            assert nmax(a, r) <= 1e-4, (name, nmax(a, r))
    assert_grads_close(g_tri, g_ref, 1e-3)


def test_fp32_runs_the_kernels_at_chunks_of_16():
    """fp32 inputs given chunk_size=64 run the kernels at chunks of 16 (`kernel_chunk`, where their dots fit in
    registers): the same launches as chunk_size=16, so y, the final states and every gradient are identical."""
    kw, state = ssd_case(40, 4, True, seed=8)
    (y64, st64, g64), (y16, st16, g16) = (ssd_run_with_grads(ssd_triton, kw, state, chunk_size=L) for L in (64, 16))
    # exact: the same kernels on the same values
    assert torch.equal(y64, y16) and all(torch.equal(a, r) for a, r in zip(st64, st16))
    assert sorted(g64) == sorted(g16) and all(torch.equal(g64[k], g16[k]) for k in g16)   # exact: as above


def test_per_head_theta_and_per_head_A():
    kw, state = ssd_case(45, 8, True, seed=3, per_head_theta=True)
    kw["A"] = kw["A"][0, 0].clone()   # (H,)
    assert_grads_close(ssd_grads(ssd_triton, kw, state, chunk_size=16), ssd_grads(ssd_chunked, kw, state, chunk_size=16), 1e-3)


def test_angle_kernel_pair_blocks():
    """N = 128 has 64 pairs: the rotation and its backward split them into two programs of 32 a chunk, each summing
    its share of dΔ and of what its chunk's first document reads of the angle carry. 40 angles put rotated pairs in
    both blocks."""
    kw, state = ssd_case(37, 40, True, seed=77, P=16, N=128)
    assert_grads_close(ssd_grads(ssd_triton, kw, state, chunk_size=16), ssd_grads(ssd_chunked, kw, state, chunk_size=16),
                       1e-3)


@pytest.mark.parametrize("P,N,L", [(16, 16, 16), (32, 64, 32)])
def test_other_block_dims(chunks_as_given, P, N, L):
    kw, state = ssd_case(40, min(4, N // 2), True, seed=P + N, P=P, N=N)
    y_ref, st_ref = ssd_chunked(**kw, initial_state=state, chunk_size=L)
    y, st = ssd_triton(**kw, initial_state=state, chunk_size=L)
    assert nmax(y, y_ref) <= 1e-4 and nmax(st.h, st_ref.h) <= 1e-4
    assert_grads_close(ssd_grads(ssd_triton, kw, state, chunk_size=L), ssd_grads(ssd_chunked, kw, state, chunk_size=L), 1e-3)


@pytest.mark.parametrize("P,N,L,bad", [(24, 32, 16, "P (headdim)=24"), (16, 512, 16, "N (d_state)=512"),
                                       (16, 32, 8, "chunk_size=8"), (16, 32, 48, "chunk_size=48")])
def test_bad_block_dims_raise(P, N, L, bad):
    with pytest.raises(ValueError, match='ssd_dispatch="pytorch"') as err:
        check_block_dims(P, N, L)
    assert bad in str(err.value)
    kw, _ = ssd_case(5, 0, False, seed=0, P=P, N=N)
    with pytest.raises(ValueError) as err:
        ssd_triton(**kw, chunk_size=L)
    assert bad in str(err.value)


@pytest.mark.parametrize("G,bias", [(1, True), (2, True), (1, False)])
def test_shared_bc_groups_and_bias(G, bias):
    """Extension: B, C (b, T, G, N) shared by H/G heads, plus optional per-head biases, against ssd_chunked on the
    per-head tensors; gradients of the shared B/C and of the biases through autograd."""
    H = 4
    kw, state = ssd_case(37, 4, True, seed=40 + G, H=H)
    g = torch.Generator().manual_seed(G)
    shared = dict(kw, B=torch.randn(2, 37, G, 32, generator=g), C=torch.randn(2, 37, G, 32, generator=g))
    if bias:
        shared.update(B_bias=torch.randn(H, 32, generator=g), C_bias=torch.randn(H, 32, generator=g))

    def reference(B, C, B_bias=None, C_bias=None, **rest):
        Bh, Ch = B.repeat_interleave(H // G, 2), C.repeat_interleave(H // G, 2)
        if B_bias is not None:
            Bh, Ch = Bh + B_bias, Ch + C_bias
        return ssd_chunked(B=Bh, C=Ch, **rest)

    y, st = ssd_triton(**shared, initial_state=state, chunk_size=16)
    y_ref, st_ref = reference(**shared, initial_state=state, chunk_size=16)
    assert nmax(y, y_ref) <= 1e-4 and nmax(st.k, st_ref.k) <= 1e-4 and nmax(st.h, st_ref.h) <= 1e-4
    assert_grads_close(ssd_grads(ssd_triton, shared, state, chunk_size=16), ssd_grads(reference, shared, state, chunk_size=16), 1e-3)


@pytest.mark.parametrize("H,G,N,resets", [(32, 1, 32, False), (8, 2, 64, True)])
def test_rotation_shares_a_program_per_group(monkeypatch, H, G, N, resets):
    """The rotation as bf16 inputs launch it (`_rotate_tiles`): one program for every head of a group, a chunk and a
    block of up to 32 pairs, each chunk's angles from its carry (32 heads of one group at N = 32: one block of 16 pairs;
    two groups of 4 heads at N = 64: one block of 32). Against ssd_chunked on the per-head B, C plus biases; gradients."""
    import mamba3_lite.ssd_triton as st
    real = st._rotate_tiles
    monkeypatch.setattr(st, "_rotate_tiles", lambda N, HG, dtype: real(N, HG, torch.bfloat16))
    assert real(N, H // G, torch.bfloat16) == ((32, 16) if H == 32 else (4, 32))
    kw, state = ssd_case(37, 4, True, seed=H + N, H=H, N=N)
    g = torch.Generator().manual_seed(H)
    shared = dict(kw, B=torch.randn(2, 37, G, N, generator=g), C=torch.randn(2, 37, G, N, generator=g),
                  B_bias=torch.randn(H, N, generator=g), C_bias=torch.randn(H, N, generator=g))
    sid = doc_index(2, 37, [[16, 30], [7, 8]]) if resets else None

    def reference(B, C, B_bias, C_bias, **rest):
        return ssd_chunked(B=B.repeat_interleave(H // G, 2) + B_bias, C=C.repeat_interleave(H // G, 2) + C_bias, **rest)

    (y, st_), (y_ref, st_ref) = (f(**shared, initial_state=state, chunk_size=16, seq_idx=sid) for f in (ssd_triton, reference))
    assert nmax(y, y_ref) <= 1e-4 and nmax(st_.h, st_ref.h) <= 1e-4 and angle_err(st_.angle, st_ref.angle) <= 1e-5
    assert_grads_close(ssd_grads(ssd_triton, shared, state, chunk_size=16, seq_idx=sid),
                       ssd_grads(reference, shared, state, chunk_size=16, seq_idx=sid), 1e-3)


def test_x_as_a_strided_view_gives_the_same_run():
    """x as the block hands it over, a view of its in-projection (batch and token strides of a wider row): the kernels
    read it in place, and y, the final states and dx equal those of the contiguous copy exactly."""
    kw, state = ssd_case(37, 4, True, seed=17)
    b, T, H, P = kw["x"].shape
    wide = torch.randn(b, T, H * P + 24)
    wide[..., 8:8 + H * P] = kw["x"].reshape(b, T, H * P)
    wide.requires_grad_(True)
    x_view, x_copy = wide[..., 8:8 + H * P].view(b, T, H, P), kw["x"].clone().requires_grad_(True)
    assert not x_view.is_contiguous()
    (y, st), (y_c, st_c) = (ssd_triton(**dict(kw, x=x), initial_state=state, chunk_size=16) for x in (x_view, x_copy))
    # exact: the same kernel on the same values; only the strides of x differ
    assert torch.equal(y, y_c) and all(torch.equal(a, r) for a, r in zip(st, st_c))
    dy = torch.randn(y.shape)
    (y * dy).sum().backward()
    (y_c * dy).sum().backward()
    assert torch.equal(wide.grad[..., 8:8 + H * P].view(b, T, H, P), x_copy.grad)   # exact: the same kernels, strides aside


def test_no_grad_inference_matches(chunks_as_given):
    kw, state = ssd_case(70, 4, True, seed=9)
    with torch.no_grad():
        y, st = ssd_triton(**kw, initial_state=state, chunk_size=32)
    y_ref, st_ref = ssd_chunked(**kw, initial_state=state, chunk_size=32)
    assert nmax(y, y_ref) <= 1e-4 and nmax(st.h, st_ref.h) <= 1e-4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_dtype_plumbing(dtype):
    """Half-precision x, B, C load, store and come back in their dtype (y, dx, dB, dC). In the interpreter the dots
    are upcast to fp32, so this checks the plumbing, not bf16 tl.dot accuracy (that is the GPU test below)."""
    kw, state = ssd_case(37, 4, True, seed=31)
    kw16 = {k: v.to(dtype) if k in ("x", "B", "C") else v for k, v in kw.items()}
    kw32 = {k: v.float() for k, v in kw16.items()}
    y16, s16 = ssd_triton(**kw16, initial_state=state, chunk_size=16)
    y32, s32 = ssd_chunked(**kw32, initial_state=state, chunk_size=16)
    assert y16.dtype == dtype and s16.h.dtype == torch.float32
    assert nmax(y16, y32) <= 1e-2 and nmax(s16.h, s32.h) <= 1e-4
    g16, g32 = ssd_grads(ssd_triton, kw16, state, chunk_size=16), ssd_grads(ssd_chunked, kw32, state, chunk_size=16)
    assert all(g16[k].dtype == dtype for k in ("x", "B", "C"))
    assert_grads_close(g16, g32, 1e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 tl.dot is only meaningful on a GPU")
def test_bf16_against_fp32_reference_on_rounded_inputs():
    kw, state = ssd_case(300, 32, True, seed=21, b=2, H=4, P=64, N=128)
    kw = {k: None if v is None else v.cuda() for k, v in kw.items()}
    state = SSDState(*(t.cuda() for t in state))
    kw16 = {k: v.to(torch.bfloat16) if k in ("x", "B", "C") else v for k, v in kw.items()}
    kw32 = {k: v.float() for k, v in kw16.items()}
    y16, s16 = ssd_triton(**kw16, initial_state=state, chunk_size=64)
    y32, s32 = ssd_chunked(**kw32, initial_state=state, chunk_size=64)
    assert nmax(y16, y32) <= 2e-2 and nmax(s16.h, s32.h) <= 2e-2
    assert_grads_close(ssd_grads(ssd_triton, kw16, state, chunk_size=64), ssd_grads(ssd_chunked, kw32, state, chunk_size=64), 2e-2)


ROOT = Path(__file__).resolve().parent.parent


def without_interpreter():
    "The environment for a subprocess that uses the real Triton compiler (no TRITON_INTERPRET) on this checkout."
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


PER_HEAD = ("rotate", "bwd_angle", "bwd_scalars")   # the kernels whose code the per-head interface (one group a head) changes

# The argument lists of `bench/ssd_compile_check.py` that the compile tests read, by name. A launch in more than one
# (every default config is also an autotune config) or whose code a flag does not change compiles once.
COMPILE_GROUPS = dict(
    # every kernel through Triton's NVIDIA backend + ptxas for sm_90a at tiny dims, fp32 and bf16, shared B/C + bias
    # and per-head: a compile-only error fails CI too
    tiny=("--arch", "90", "--chunk", "16", "--P", "16", "--N", "32", "--warps", "4", "--dtype", "fp32", "bf16"),
    # every config `triton.autotune` may pick on sm_80 and sm_90, the default first: bf16, chunk 64, P = 64, N = 128
    # (the 434M model) and N = 64, shared B/C with per-head biases, without and with document restarts (seq_idx)
    **{f"autotune{N}": ("--arch", "80", "90", "--autotune", "--bias", "on", "--resets", "both", "--P", "64", "--N", N)
       for N in ("128", "64")},
    # each launch at its default config for what the autotune rows leave out: fp32 inputs (their own configs, at their
    # `kernel_chunk` of 16), every kernel, shared B/C with biases; the per-head interface (bias off: one group a head)
    # in bf16 and fp32 for the kernels it changes (rotate, bwd_angle, bwd_scalars: the others compile to the same
    # code), at N = 128 and 64; fp32's rotation at N = 64
    **{name: ("--arch", "80", "90", "--default-config", "--resets", "both", "--P", "64", *more) for name, more in dict(
        fp32=("--dtype", "fp32", "--bias", "on", "--N", "128"),
        per_head=("--dtype", "bf16", "fp32", "--bias", "off", "--kernels", *PER_HEAD, "--N", "128"),
        per_head64=("--dtype", "bf16", "--bias", "off", "--kernels", *PER_HEAD, "--N", "64"),
        fp32_rotate64=("--dtype", "fp32", "--bias", "both", "--kernels", "rotate", "--N", "64")).items()},
    # consumer Ampere (sm_86) and Ada (sm_89): 99 KiB of shared memory a block; every launch at its default config
    consumer=("--arch", "86", "89", "--default-config", "--bias", "on", "--resets", "both", "--P", "64", "--N", "128"),
    # the sm_90 chunk backward at its default config held to 224 and 216 registers a thread (ptxas maxnreg)
    headroom=("--arch", "90", "--kernels", "bwd_chunk", "--default-config", "--bias", "on", "--P", "64", "--N", "128",
              "--maxnreg", "224", "216"))


@pytest.fixture(scope="module")
def compiled():
    """{name: rows} of `bench/ssd_compile_check.py` (ahead-of-time compiles, ptxas reports) for `COMPILE_GROUPS`, in
    one run that compiles each kernel once on 2 processes, asserting it exits 0 (no compile error)."""
    with tempfile.TemporaryDirectory() as out:
        groups = Path(out) / "groups.json"
        groups.write_text(json.dumps(list(COMPILE_GROUPS.values())))
        res = subprocess.run([sys.executable, "bench/ssd_compile_check.py", "--groups", str(groups), "--workers", "2",
                              "--out", out], cwd=ROOT, env=without_interpreter(), capture_output=True, text=True,
                             timeout=900)
        assert res.returncode == 0, res.stdout + res.stderr
        return dict(zip(COMPILE_GROUPS, json.loads((Path(out) / "ssd_compile_check.json").read_text())["groups"]))


def test_kernels_compile_for_sm90_without_a_gpu(compiled):
    "The interpreter never compiles the kernels: every kernel lowers for sm_90a at tiny dims (`COMPILE_GROUPS`)."
    rows = compiled["tiny"]
    # a row per launch: fp32 runs the forward as two (its state and chunk passes), bf16 as one
    assert sorted({r["kernel"] for r in rows}) == sorted(KERNELS) and len(rows) == 2 * (2 * len(KERNELS) + 1)
    assert all(r["registers"] for r in rows), rows


@pytest.fixture(scope="module")
def autotune_table(compiled):
    """{(arch, N, kernel, resets): rows} of the autotune configs (`COMPILE_GROUPS`). A kernel launched as two has a row
    per launch."""
    table = {}
    for r in compiled["autotune128"] + compiled["autotune64"]:
        table.setdefault((r["arch"], r["N"], r["kernel"], r["resets"]), []).append(r)
    return table


@pytest.mark.parametrize("arch,N,kernel,resets", [(arch, N, k, rst) for arch in (80, 90) for N in (128, 64)
                                                    for k in KERNELS for rst in (False, True)])
def test_default_and_autotune_configs_do_not_spill(autotune_table, arch, N, kernel, resets):
    rows, default, configs = autotune_table[(arch, N, kernel, resets)], default_config(kernel, arch, N), \
        autotune_configs(kernel, arch, N)
    assert configs[0] == {k: v for k, v in default.items() if k != "split"}
    halves = {"fwd": ["state", "chunk"], "bwd_chunk": ["x", "bc"]}[kernel] if default.get("split") else (
        ["all"] if "split" in default else [None])
    assert [(r["num_warps"], r["num_stages"], r["BN"], r["half"]) for r in rows] == [
        (c["num_warps"], c["num_stages"], c.get("BN"), h) for c in configs for h in halves]
    for r in rows:
        assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, r


def test_the_chunk_backward_needs_more_than_216_registers_on_sm90(compiled):
    """What `01_ssd_triton` says to explain why the backward carries dL/dH in a kernel of its own: the sm_90 chunk
    backward (bf16, N = 128, its default config) compiles without spills when ptxas may give it 224 registers a
    thread and spills at 216, so the 32 a thread that a carried (64, 128) fp32 dH adds at 8 warps do not fit in 255."""
    rows = {r["maxnreg"]: r for r in compiled["headroom"]}
    assert sorted(rows) == [216, 224] and all(r["num_warps"] == 8 and r["registers"] <= r["maxnreg"] for r in rows.values())
    assert rows[224]["spill_store_bytes"] == 0 and rows[224]["spill_load_bytes"] == 0, rows[224]
    assert rows[216]["spill_store_bytes"] > 0, rows[216]
    print(f"sm_90 chunk backward: 0 spill bytes at 224 registers a thread, {rows[216]['spill_store_bytes']} at 216")


@pytest.mark.parametrize("arch", [86, 89])
def test_every_launch_fits_consumer_ampere_and_ada_without_spills(compiled, arch):
    """sm_86 (RTX 30xx, A10, A40) and sm_89 (RTX 40xx, L4, L40) give a block at most 99 KiB of shared memory, less than
    an A100's 163: every launch at its default config (the A100's), with and without document restarts, fits there
    and compiles without spills."""
    rows = [r for r in compiled["consumer"] if r["arch"] == arch]
    assert {r["kernel"] for r in rows} == set(KERNELS) and len(rows) == 2 * (len(KERNELS) + 2)   # fwd, bwd_chunk: 2
    for r in rows:
        assert r["fits"] and r["shared_bytes"] <= 99 * 1024 and r["ctas_per_sm"] >= 1, r
        assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, r
    print(f"sm_{arch}: {len(rows)} launches, most shared memory {max(r['shared_bytes'] for r in rows) / 1024:.0f} KiB ≤ 99")


@pytest.fixture(scope="module")
def default_table(compiled):
    "Rows of every launch at its default config that the autotune table leaves out (`COMPILE_GROUPS`)."
    return compiled["fp32"] + compiled["per_head"] + compiled["per_head64"] + compiled["fp32_rotate64"]


@pytest.mark.parametrize("arch,dtype,bias", [(arch, dt, bias) for arch in (80, 90) for dt, bias in
                                              (("fp32", True), ("fp32", False), ("bf16", False))])
def test_default_configs_do_not_spill_in_fp32_or_without_bias(default_table, arch, dtype, bias):
    rows = [r for r in default_table if (r["arch"], r["dtype"], r["bias"]) == (arch, dtype, bias)]
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    kinds = KERNELS if bias else PER_HEAD
    assert sorted({r["kernel"] for r in rows}) == sorted(kinds), rows
    for r in rows:
        d = default_config(r["kernel"], arch, r["N"], torch_dtype)
        assert r["L"] == (16 if dtype == "fp32" else 64), r
        assert (r["num_warps"], r["num_stages"], r["BN"]) == (d["num_warps"], d["num_stages"], d.get("BN")), r
        assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, r


@pytest.mark.parametrize("arch,N,resets", [(arch, 128, rst) for arch in (80, 90) for rst in (False, True)])
def test_main_loops_of_the_forward_and_chunk_backward_are_pipelined(autotune_table, arch, N, resets):
    """At their default configs and the 434M model's N = 128, the forward's chunk loop (sm_90: the fused scan; sm_80:
    the state pass and the chunk pass) and the chunk backward's loops over state tiles (every launch) load through
    cp.async or TMA: a `for` over `tl.range` at two stages, which the compiler software-pipelines (a `while` loop it
    does not). At N = 64 a state-tile loop of BN = 64 columns runs once, with nothing to overlap. (Under Triton 3.6
    sm_90's fused forward runs at one stage: at two it spills there.)"""
    triton36 = tuple(int(v) for v in triton.__version__.split(".")[:2]) < (3, 7)
    for kernel in ("fwd", "bwd_chunk"):
        stages = default_config(kernel, arch, N)["num_stages"]
        rows = [r for r in autotune_table[(arch, N, kernel, resets)] if r["num_stages"] == stages][:2]
        if triton36 and (kernel, arch) == ("fwd", 90):
            assert stages == 1 and rows, rows
            continue
        assert stages >= 2 and rows, (kernel, stages)
        for r in rows:
            assert r["stages"] == stages and r["cp_async"] + r["tma"] > 0, r


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("resets", [False, True])
def test_each_arch_launch_config_matches_ssd_chunked(monkeypatch, arch, resets):
    """The kernels as each arch launches them in bf16, state tiles and split launches included. sm_80: the forward as a state
    pass over 64-column tiles and a chunk pass, the chunk backward as two launches over 16-column tiles; sm_90: the
    fused forward, the chunk backward in one launch over 64-column tiles (N = 128: several tiles either way). Values
    and final states without autograd, and every gradient, against `ssd_chunked`."""
    import mamba3_lite.ssd_triton as st
    # bf16's configs on these fp32 inputs: fp32's own (every other test here runs sm_90's) split the forward on both
    monkeypatch.setattr(st, "_launch_config", lambda kind, N=128, dtype=None: default_config(kind, arch, N))
    kw, state = ssd_case(37, 8, True, seed=arch + resets, P=16, N=128)
    sid = doc_index(2, 37, [[16, 30], [7, 8]]) if resets else None
    with torch.no_grad():
        (y, st_), (y_ref, st_ref) = (f(**kw, initial_state=state, chunk_size=16, seq_idx=sid)
                                     for f in (ssd_triton, ssd_chunked))
    assert nmax(y, y_ref) <= 1e-4 and nmax(st_.h, st_ref.h) <= 1e-4
    assert_grads_close(ssd_grads(ssd_triton, kw, state, chunk_size=16, seq_idx=sid),
                       ssd_grads(ssd_chunked, kw, state, chunk_size=16, seq_idx=sid), 1e-3)


TRACE = """
import json, logging, os
os.environ["ENABLE_TRITON_KERNELS"] = "1"
import torch
import mamba3_lite.ssd_triton as st
from torch._dynamo.backends.common import aot_autograd
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
from mamba3_lite.block import Mamba3Block
from mamba3_lite.model import ModelConfig, Mamba3Transformer
logging.getLogger("torch._higher_order_ops.triton_kernel_wrap").setLevel(logging.ERROR)   # no driver to analyse with
os.environ["TRITON_INTERPRET"] = "1"    # lets the block hand CPU tensors to ssd_triton; its kernels stay compiled ones
st._require_cuda = lambda x: None       # nothing runs: the backend stops once AOTAutograd has the joint graph

class Traced(Exception):
    pass

def kernels(fn, *args):
    "{kernel name: launches} in the joint forward+backward graph of torch.compile(fn, fullgraph=True)(*args)."
    graphs = []
    def partition(joint, inputs, **kw):
        graphs.append(joint)
        raise Traced
    try:
        torch.compile(fn, fullgraph=True, backend=aot_autograd(fw_compiler=lambda gm, _: gm, partition_fn=partition))(*args)
    except Exception:
        if len(graphs) != 1: raise
    found = [kernel_side_table.get_kernel(n.kwargs["kernel_idx"]) for n in graphs[0].graph.nodes
             if n.op == "call_function" and "triton_kernel_wrapper" in str(n.target)]
    for k in found:   # the autotuned kernel and its configs
        tuned[k.fn.__name__] = [[c.num_warps, c.num_stages, c.kwargs.get("BN")] for c in k.configs]
    names = [k.fn.__name__ for k in found]
    return {k: names.count(k) for k in sorted(set(names))}

tuned = {}

torch.manual_seed(0)
block = Mamba3Block(128, d_state=32, headdim=32, chunk_size=32, ssd_dispatch="triton")
out = {"block": kernels(lambda u: block(u).float().sum(), torch.randn(2, 64, 128, requires_grad=True))}
lm = Mamba3Transformer(ModelConfig(vocab_size=256, d_model=128, n_layers=2, d_ff=256, d_state=32, headdim=32,
                                   chunk_size=32, ssd_dispatch="triton"))
ids = torch.randint(0, 256, (2, 64))
out["lm"] = kernels(lambda i: lm(i, targets=i).loss, ids)
out["tuned"] = tuned
print(json.dumps(out))
"""


def test_block_and_lm_compile_fullgraph_with_the_triton_ssd():
    """torch.compile(fullgraph=True) of a block and of a 2-layer LM with ssd_dispatch="triton" traces forward and
    backward in one graph (a graph break would raise): every SSD kernel appears once per layer in the joint graph,
    under `triton.autotune` with its `autotune_configs` (sm_90's fp32 ones without a GPU, d_state 32). Tracing needs no GPU; it
    runs without TRITON_INTERPRET (the interpreter's kernels cannot be traced)."""
    res = subprocess.run([sys.executable, "-c", TRACE], cwd=ROOT, env=without_interpreter(), capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    found = json.loads(res.stdout.strip().splitlines()[-1])
    # fp32 modules: fp32's sm_90 configs, the forward as its state and chunk passes
    kinds = {"scalars": "scalars", "carry": "carry", "rotate": "rotate", "fwd_state": "fwd", "fwd_chunk": "fwd",
             "bwd_state": "bwd_state", "bwd_chunk": "bwd_chunk", "bwd_angle": "bwd_angle", "bwd_carry": "bwd_carry",
             "bwd_scalars": "bwd_scalars"}
    assert found["block"] == {f"_ssd_{k}_kernel": 1 for k in kinds}, found
    assert found["lm"] == {f"_ssd_{k}_kernel": 2 for k in kinds}, found
    assert found["tuned"] == {f"_ssd_{k}_kernel": [[c["num_warps"], c["num_stages"], c.get("BN")]
                                                   for c in autotune_configs(kind, 90, 32, torch.float32)]
                              for k, kind in kinds.items()}, found


def long_turning_case(T, seed=5):
    """fp32 inputs of one head turning one way all the time (a stress case for the carried angle), and their exact fp64 copy.
    Δ ~ U[0.05, 0.1] (the top of the realistic [1e-3, 1e-1]), θ ~ N(3, 0.3) so ω = π tanh θ ≈ 3.1: ≈ 0.23 rad/token."""
    kw = ssd_random_inputs(b=1, T=T, H=1, P=16, N=16, S=8, dtype=torch.float64, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    kw["dt"] = torch.empty_like(kw["dt"]).uniform_(0.05, 0.1, generator=g)
    kw["theta"] = kw["theta"] * 0.3 + 3.0
    state = ssd_random_state(b=1, H=1, P=16, N=16, S=8, dtype=torch.float64, seed=seed + 2)
    kw32 = {k: v.float() for k, v in kw.items()}
    state32 = SSDState(*(t.float() for t in state))
    kw64 = {k: v.double() for k, v in kw32.items()}               # the same numbers, fp64 maths in ssd_chunked
    return kw32, state32, kw64, SSDState(*(t.double() for t in state32))


def check_angle_carry_matches_fp64(fn):
    """For the kernel: the carried angle over a long fp32 run stays on the fp64 angle, in [0, 2π), and so do
    y and the final states at the end of the sequence.
    What drifts is the carry, by a fixed amount per wrap: a one-part fp32 2π (1.7e-7 too large) loses 2.8e-8 of the
    net turn, and an fp32 π in ω = π tanh θ gains the same 2.8e-8; an fp32 carry adds a rounding walk over the chunks.
    65k tokens at realistic Δ turn by up to ~4k rad (~600 wraps). The interpreter runs ~1k chunks in this budget, so
    this run turns faster instead: 32k tokens, ~7.5k rad, ~1200 wraps of the carry, and asks for 1e-5 rad (10x tighter
    than the 1e-4 rad the notebooks ask of 65k tokens). Measured: fp64 carry 2.0e-6; an fp32 carry 2.9e-5; fp64
    carry with a one-part 2π or with an fp32 π 2.2e-4; two-part 2π with an fp32 carry 6.6e-5."""
    T, L = 32768, 32
    kw32, state32, kw64, state64 = long_turning_case(T)
    with torch.no_grad():
        y, st = fn(**kw32, initial_state=state32, chunk_size=L)
    y64, st64 = ssd_chunked(**kw64, initial_state=state64, chunk_size=L)
    net_turn = (kw64["dt"][..., None] * math.pi * torch.tanh(kw64["theta"][:, :, None, :])).sum(1)
    assert net_turn.min() / (2 * math.pi) > 1000                    # every channel wraps > 1000 times
    assert angle_err(st.angle, st64.angle) <= 1e-5, angle_err(st.angle, st64.angle)
    assert st.angle.min() >= 0 and st.angle.max() < 2 * math.pi
    assert nmax(y[:, -L:], y64[:, -L:]) <= 1e-4 and nmax(st.h, st64.h) <= 1e-4 and nmax(st.k, st64.k) <= 1e-4


def test_angle_carry_matches_fp64_over_many_wraps(chunks_as_given):
    check_angle_carry_matches_fp64(ssd_triton)


@pytest.mark.parametrize("k", [1, 3, -2])
def test_initial_angle_plus_2pi_k_gives_the_same_run(k):
    """Φ₀ + 2πk is the same initial angle; outputs, final states and final angle (in [0, 2π)) agree up to
    the fp32 rounding of Φ₀ + 2πk (≤ 2e-6 rad for |Φ₀ + 2πk| < 32)."""
    kw, state = ssd_case(100, 4, True, seed=60 + k)
    y, st = ssd_triton(**kw, initial_state=state, chunk_size=32)
    shifted = state._replace(angle=(state.angle.double() + 2 * math.pi * k).float())
    y2, st2 = ssd_triton(**kw, initial_state=shifted, chunk_size=32)
    assert nmax(y2, y) <= 1e-5 and nmax(st2.h, st.h) <= 1e-5 and nmax(st2.k, st.k) <= 1e-5
    assert angle_err(st2.angle, st.angle) <= 1e-5
    assert st2.angle.min() >= 0 and st2.angle.max() < 2 * math.pi


def doc_index(b, T, starts):
    "(b, T) int64 document indices: row r starts a new document at each token in starts[r]."
    sid = torch.zeros(b, T, dtype=torch.int64)
    for r, ts in enumerate(starts):
        for t0 in ts:
            sid[r, t0:] += 1
    return sid


# chunk_size 16: starts at chunk edges (16, 32), inside chunks (5, 21, 40), two in one chunk (3 and 9; 33 and 37),
# a document starting at the last token and a row with no start at all
RESET_CASES = [(50, [[16, 32], [5, 21, 40]], 0), (50, [[3, 9, 33, 37], []], 4), (41, [[16, 40], [1, 2, 20]], 8)]


@pytest.mark.parametrize("T,starts,S", RESET_CASES)
@pytest.mark.parametrize("init", [False, True])
def test_document_resets_match_ssd_chunked(T, starts, S, init):
    """seq_idx (document restarts) in the kernels: outputs, final states and every gradient against `ssd_chunked`
    with the same seq_idx; with an initial state the window starts mid-document (only the first document reads it)."""
    kw, state = ssd_case(T, S, init, seed=7 * T + S + init)
    sid = doc_index(2, T, starts)
    y, st, g_tri = ssd_run_with_grads(ssd_triton, kw, state, chunk_size=16, seq_idx=sid)
    y_ref, st_ref, g_ref = ssd_run_with_grads(ssd_chunked, kw, state, chunk_size=16, seq_idx=sid)
    assert nmax(y, y_ref) <= 1e-4
    for name, a, r in zip(SSDState._fields, st, st_ref):
        if r.numel():
            assert nmax(a, r) <= 1e-4, (name, nmax(a, r))
    assert_grads_close(g_tri, g_ref, 1e-3)
    y_nr, _ = ssd_triton(**kw, initial_state=state, chunk_size=16)     # the resets change the result
    assert nmax(y_nr, y_ref) > 1e-2


def test_document_resets_with_shared_bc_and_pair_blocks():
    """Resets with shared B/C + per-head biases (G = 1 group, H = 2 heads) and N = 128 (four angle pair blocks of 16):
    every gradient against `ssd_chunked` on the per-head B + B_bias, C + C_bias with the same seq_idx."""
    kw, state = ssd_case(37, 40, True, seed=91, P=16, N=128)
    g = torch.Generator().manual_seed(91)
    shared = dict(kw, B=torch.randn(2, 37, 1, 128, generator=g), C=torch.randn(2, 37, 1, 128, generator=g),
                  B_bias=torch.randn(2, 128, generator=g), C_bias=torch.randn(2, 128, generator=g))
    sid = doc_index(2, 37, [[16, 30], [7, 8]])

    def reference(B, C, B_bias, C_bias, **rest):
        return ssd_chunked(B=B.expand(-1, -1, 2, -1) + B_bias, C=C.expand(-1, -1, 2, -1) + C_bias, **rest)

    assert_grads_close(ssd_grads(ssd_triton, shared, state, chunk_size=16, seq_idx=sid),
                       ssd_grads(reference, shared, state, chunk_size=16, seq_idx=sid), 1e-3)


@pytest.mark.parametrize("module", ["ssd_triton", "decode"])
def test_every_runtime_loop_bound_is_a_constant_under_the_interpreter(module):
    """Triton 3.6's interpreter hands a `range`/`tl.range` bounded by a runtime kernel argument a 1-element array,
    which numpy >= 2.5 refuses to turn into an int: every kernel argument a loop bound reads is annotated
    (`tl.constexpr`, or the module's `constexpr`, a constant only under the interpreter), and no bound reads an
    assigned local (the interpreter makes it a tensor, even `(NC + CB - 1) // CB` of constants)."""
    import ast
    import importlib
    src = Path(importlib.import_module(f"mamba3_lite.{module}").__file__).read_text()
    bare, kernels = [], 0
    for fn in ast.walk(ast.parse(src)):
        if not (isinstance(fn, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in fn.decorator_list)):
            continue
        kernels += 1
        args = {a.arg: a.annotation for a in fn.args.args}
        made = {t.id: node.value for node in ast.walk(fn) if isinstance(node, ast.Assign)   # an assigned local is a
                for t in node.targets if isinstance(t, ast.Name)}                          # tensor there too
        for call in ast.walk(fn):
            if isinstance(call, ast.Call) and ast.unparse(call.func) in ("range", "tl.range", "tl.static_range"):
                names = {n.id for a in call.args for n in ast.walk(a) if isinstance(n, ast.Name)}
                bare += [f"{fn.name}: {n}" for n in sorted(names) if n in args and args[n] is None]
                bare += [f"{fn.name}: {n} = {ast.unparse(made[n])}" for n in sorted(names) if n in made]
    print(f"{module}: {kernels} jit functions, loop bounds on unannotated arguments: {bare}")
    assert kernels and not bare, bare
