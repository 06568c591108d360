"""Reliability of a training run from the command line: SIGTERM/SIGINT stop after a checkpoint (one process and
torchrun), a run whose every checkpoint fails verification is refused, a rewind keeps the metrics of the steps it
abandons, running out of room (disk full, `ulimit -f`) is one line, and two nodes on loopback train, survive the
loss of one node and resume exactly. Tiny model on dummy tokens (vocab 256), a few steps each."""
import json
import os
import re
import resource
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mamba3_lite import cli as CLI
from mamba3_lite import train as T
from mamba3_lite.checkpoint import CheckpointManager
from mamba3_lite.testing import run_captured, run_in_mounts
from test_reliability import ENV, QUIET, ROOT, one_line, tiny_cfg, train_records, write_yaml

TRAIN = [sys.executable, "-m", "mamba3_lite.cli", "train"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
STOPPED = re.compile(r"stopped by (SIG\w+) after step (\d+): checkpoint step (\d+) saved in (\S+); resume with: (.+)$")


def const_lr_cfg(run_dir, **training):
    "The tiny config with a constant lr after warmup, so a resume with another max_steps trains the same steps."
    return tiny_cfg(run_dir, **{"min_lr_ratio": 1.0, "save_every": 1000, "max_steps": 10_000, **training})


def start(cmd, **kw):
    "Popen in its own session (so a kill reaches torchrun's workers too), text pipes."
    return subprocess.Popen(cmd, cwd=kw.pop("cwd", ROOT), env=kw.pop("env", ENV), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)


def wait_for(cond, procs, what, timeout=180):
    "Poll `cond()` until true; fail with the processes' stderr if one exits first or time runs out."
    deadline = time.time() + timeout
    while not cond():
        dead = [p for p in procs if p.poll() is not None]
        if dead or time.time() > deadline:
            for p in procs:
                if p.poll() is None: os.killpg(p.pid, signal.SIGKILL)
            errs = "\n".join(p.communicate()[1][-3000:] for p in procs)
            raise AssertionError(f"{what}: {'a process exited' if dead else 'timed out'}\n{errs}")
        time.sleep(0.05)


def workers(p):
    "The worker pids of the torchrun launcher `p` (torchrun starts each worker in a session of its own)."
    try: return [int(x) for x in Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()]
    except FileNotFoundError: return []                    # it has exited


def records_after(run_dir, step):
    "How many train records past `step` metrics.jsonl holds (0 while it does not exist)."
    try: return sum(1 for r in train_records(run_dir) if r["step"] > step)
    except FileNotFoundError: return 0


def losses(run_dir):
    return {r["step"]: r["loss"] for r in train_records(run_dir)}


def stopped_line(err):
    "The one line a stopped train prints, parsed: (signal name, step, run dir, resume command)."
    lines = [line for line in err.splitlines() if "stopped by" in line]
    assert len(lines) == 1, err[-3000:]
    m = STOPPED.search(lines[0])
    assert m and m[2] == m[3], lines[0]
    return m[1], int(m[2]), m[4], m[5]


# 1 -- SIGTERM / SIGINT: the step in flight finishes, a checkpoint is written, one line says how to resume -------
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_saves_the_step_and_names_the_command_that_resumes(tmp_path, sig):
    run = tmp_path / "run"
    f = write_yaml(tmp_path / "c.yaml", const_lr_cfg(run))
    p = start(TRAIN + ["--config", str(f)])
    wait_for(lambda: records_after(run, 0) >= 3, [p], "training")
    p.send_signal(sig)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 128 + sig, err[-3000:]
    said = [line for line in err.strip().splitlines() if "SEEDED RANDOM TOKENS" not in line]   # (the dummy tokens' warning)
    assert len(said) == 2 and said[0].startswith(f"{sig.name}: stopping after step ") and "Traceback" not in err, err   # at once, then
    name, step, where, command = stopped_line(err)
    assert name == sig.name and where == str(run) and command == f"mamba3-lite train --config {f}", err
    mgr = CheckpointManager(run)
    assert mgr.list_steps() == [step] and not mgr.problems(step) and step >= 3
    # the printed command resumes; the losses are those of a run that was never stopped (resume is exact)
    rc, out, err = run_captured(CLI.train_cli, shlex.split(command)[2:] + ["--max-steps", str(step + 2)])
    assert rc == 0 and f"[resume] from checkpoint step {step}" in out, err
    T.run_training(const_lr_cfg(tmp_path / "straight", max_steps=step + 2), log=QUIET)
    assert losses(run) == losses(tmp_path / "straight")


def test_a_second_signal_exits_at_once_without_a_checkpoint(tmp_path):
    run, mark = tmp_path / "run", tmp_path / "saving"
    f = write_yaml(tmp_path / "c.yaml", const_lr_cfg(run))
    slow_save = (f"import sys, time\nfrom mamba3_lite import checkpoint as C\nsave = C.CheckpointManager.save\n"
                 f"def slow(self, *a, **k):\n    open({str(mark)!r}, 'w').close(); time.sleep(60); return save(self, *a, **k)\n"
                 "C.CheckpointManager.save = slow\nfrom mamba3_lite.cli import train_cli\nsys.exit(train_cli(sys.argv[1:]))")
    p = start([sys.executable, "-c", slow_save, "--config", str(f)])
    wait_for(lambda: records_after(run, 0) >= 2, [p], "training")
    p.send_signal(signal.SIGTERM)
    wait_for(mark.exists, [p], "the save after SIGTERM")
    time.sleep(1.2)                                       # past the second in which a repeat counts as the same request
    t = time.time()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=50)                    # well before the 60 s save would have finished
    assert p.returncode == 143 and "second SIGTERM: exiting now, without a checkpoint" in err, err[-3000:]
    assert time.time() - t < 30 and CheckpointManager(run).list_steps() == []


def test_torchrun_ranks_stop_after_the_same_step_on_sigint_and_sigterm(tmp_path):
    run = tmp_path / "run"
    f = write_yaml(tmp_path / "c.yaml", const_lr_cfg(run))
    cmd = TORCHRUN + ["--standalone", "--nproc_per_node=2", "-m", "mamba3_lite.cli", "train", "--config", str(f)]
    last = 0
    def everyone(p, sig):                                        # a scheduler that signals every process of the job:
        for pid in [p.pid, *workers(p)]: os.kill(pid, sig)       # each worker gets it twice (torchrun forwards it too)
    for send in (lambda p: everyone(p, signal.SIGINT),
                 lambda p: p.send_signal(signal.SIGTERM)):       # Ctrl-C, docker stop: the launcher forwards it
        p = start(cmd)
        wait_for(lambda: records_after(run, last) >= 2, [p], "torchrun training")
        send(p)
        out, err = p.communicate(timeout=120)
        assert p.returncode != 0 and "second SIG" not in err, err[-3000:]    # torchrun's forwarded copy is no second signal
        name, step, where, command = stopped_line(err)                        # rank 0 alone prints it
        assert where == str(run) and command.startswith("torchrun <the same launcher flags> -m mamba3_lite.cli train --config")
        meta = CheckpointManager(run).read_meta(step)
        assert [d["rank"] for d in meta["data_position"]] == [0, 1] and step > last
        assert last == 0 or f"[resume] from checkpoint step {last}" in out
        last = step


# 2 -- a run whose every checkpoint fails verification is refused; nothing on disk changes ----------------------
def snapshot(run_dir):
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file() and p.name != ".lock"}


def test_every_checkpoint_failing_verification_is_refused_in_one_line(tmp_path):
    run = tmp_path / "run"
    T.run_training(tiny_cfg(run, max_steps=4), log=QUIET)
    for s in (2, 4):                                    # edited metas: weights and optimizer still match their digests
        p = run / f"meta_step_{s}.json"
        meta = json.loads(p.read_text()); meta["tokens_seen"] += 1; p.write_text(json.dumps(meta, indent=2))
    before = snapshot(run)
    r = subprocess.run(TRAIN + ["--config", str(write_yaml(tmp_path / "c.yaml", tiny_cfg(run, max_steps=6)))], cwd=ROOT,
                       env=ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and one_line(r.stderr), r.stderr[-3000:]
    assert "meta_step_4.json" in r.stderr and "meta_step_2.json" in r.stderr and "move the broken steps away" in r.stderr
    assert snapshot(run) == before                      # no step overwritten, metrics.jsonl untouched


def test_a_skipped_broken_step_is_moved_away_not_overwritten_and_its_warning_is_one_line(tmp_path):
    run = tmp_path / "run"
    T.run_training(tiny_cfg(run, max_steps=6), log=QUIET)
    p = run / "meta_step_6.json"
    meta = json.loads(p.read_text()); meta["tokens_seen"] += 1; p.write_text(json.dumps(meta, indent=2))
    broken, old = p.read_bytes(), {r["step"]: r for r in train_records(run)}
    r = subprocess.run(TRAIN + ["--config", str(write_yaml(tmp_path / "c.yaml", tiny_cfg(run, max_steps=8)))], cwd=ROOT,
                       env=ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "[resume] from checkpoint step 4" in r.stdout, r.stderr[-3000:]
    warning = [line for line in r.stderr.splitlines() if "SEEDED RANDOM TOKENS" not in line]
    assert len(warning) == 1 and "meta_step_6.json" in warning[0] and "CheckpointWarning" in warning[0], r.stderr
    (moved,) = (run / "abandoned").glob("after_4_*")
    assert (moved / "meta_step_6.json").read_bytes() == broken          # the broken step is kept, byte for byte
    kept = [json.loads(line) for line in (moved / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in kept] == [("train", 5), ("train", 6), ("eval", 6)]    # the final eval too
    assert json.loads((moved / "metrics.jsonl").read_text().splitlines()[0])["loss"] == old[5]["loss"]
    assert CheckpointManager(run).latest_step() == 8 and [r["step"] for r in train_records(run)] == list(range(1, 9))


# 3 -- a rewind killed before its first save leaves metrics.jsonl as it was -------------------------------------
def test_a_rewind_killed_before_its_first_save_keeps_every_metrics_record(tmp_path):
    run = tmp_path / "run"
    T.run_training(tiny_cfg(run, max_steps=8), log=QUIET)
    original = (run / "metrics.jsonl").read_bytes()
    f = write_yaml(tmp_path / "c.yaml", tiny_cfg(run, max_steps=8))
    p = start(TRAIN + ["--config", str(f), "--resume", "2", "--save-every", "8"])   # first save of the branch: step 8
    seen = []
    for line in p.stdout:                                 # step 3 of the rewound branch is trained and logged ...
        seen.append(line)
        if line.startswith("step=      3"): break
    os.killpg(p.pid, signal.SIGKILL)                      # ... and the run dies before it commits anything
    p.communicate()
    assert any(s.startswith("step=      3") for s in seen), seen
    assert (run / "metrics.jsonl").read_bytes() == original
    assert CheckpointManager(run).latest_step() == 8
    # the rewind run to its first commit: old steps 3-8 and their records move to abandoned/, the new ones replace them
    rc, out, err = run_captured(CLI.train_cli, ["--config", str(f), "--resume", "2", "--max-steps", "4"])
    assert rc == 0, err
    (moved,) = (run / "abandoned").glob("after_2_*")
    kept = [json.loads(line) for line in (moved / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in kept] == [("train", s) for s in range(3, 9)] + [("eval", 8)]
    assert [r["step"] for r in train_records(run)] == [1, 2, 3, 4]


# 4 -- out of room: disk full (a small tmpfs) and the file-size limit (ulimit -f) -----------------------------------
def in_small_tmpfs(tmp_path, run, command, free_bytes, size="1m"):
    "Run `command` with `run` on a fresh tmpfs of `size` that a filler file leaves `free_bytes` of (a user+mount namespace)."
    run.mkdir()
    r = run_in_mounts(command, [(run, "tmpfs", size, free_bytes)], cwd=ROOT, env=ENV, timeout=300)
    if r is None: pytest.skip("no unprivileged mount namespace for a small tmpfs")
    return r


def test_disk_full_writing_the_run_lock_is_one_line(tmp_path):
    run = tmp_path / "run"
    f = write_yaml(tmp_path / "c.yaml", tiny_cfg(run, max_steps=2))
    r = in_small_tmpfs(tmp_path, run, TRAIN + ["--config", str(f)], free_bytes=0)
    assert r.returncode == 2 and one_line(r.stderr), r.stderr[-3000:]
    assert f"disk full writing {run / '.lock'} (0 bytes free): the run lock could not be taken" in r.stderr, r.stderr


def test_disk_full_writing_metrics_mid_run_is_one_line_and_leaves_whole_lines(tmp_path):
    run = tmp_path / "run"
    f = write_yaml(tmp_path / "c.yaml", tiny_cfg(run, max_steps=200, save_every=1000))
    script = TRAIN + ["--config", str(f)]
    r = in_small_tmpfs(tmp_path, run, ["sh", "-c", shlex.join(script) + f"; rc=$?; cat {run}/metrics.jsonl > "
                                       f"{tmp_path}/metrics.copy; exit $rc"], free_bytes=8192)   # the lock's page + one
    assert r.returncode == 2 and one_line(r.stderr), r.stderr[-3000:]
    assert f"disk full writing {run / 'metrics.jsonl'} (0 bytes free); the record was not written" in r.stderr, r.stderr
    lines = (tmp_path / "metrics.copy").read_text().splitlines(keepends=True)
    assert len(lines) >= 3 and all(line.endswith("\n") and json.loads(line) for line in lines)   # no torn line
    printed = [line.split("|")[0] for line in r.stdout.splitlines() if line.startswith("step=")]
    assert len(printed) == len(set(printed)), printed[-3:]                                   # each step's line once


def limited(nbytes):
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


@pytest.mark.parametrize("limit", [500_000, 1_500_000])    # the weights file, or the optimizer file, outgrows it
def test_a_file_size_limit_is_one_line_saying_so(tmp_path, limit):
    run = tmp_path / "run"
    f = write_yaml(tmp_path / "c.yaml", tiny_cfg(run, max_steps=2))
    r = subprocess.run(TRAIN + ["--config", str(f)], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300,
                       preexec_fn=limited(limit))
    assert r.returncode == 2 and one_line(r.stderr), r.stderr[-3000:]
    assert f"file-size limit (ulimit -f) of {limit} bytes reached writing {run}" in r.stderr, r.stderr
    assert "no checkpoint before step 2 is on disk" in r.stderr and "disk full" not in r.stderr, r.stderr


# 5 -- past one machine: two nodes on loopback (c10d rendezvous, one process per node, gloo) ----------------------
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(cfg_file, cwds, *extra):
    "Two torchrun launchers, one per 'node', meeting at a c10d rendezvous on 127.0.0.1 (the multi-node command)."
    port = free_port()
    cmd = TORCHRUN + ["--nnodes=2", "--nproc_per_node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                      "-m", "mamba3_lite.cli", "train", "--config", str(cfg_file), *extra]
    return [start(cmd, cwd=c) for c in cwds]


def finish(procs, timeout=600):
    "Wait for every process; their stdout. On a failure or a timeout, all are killed and their stderr reported."
    try:
        done = [p.communicate(timeout=timeout) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            if p.poll() is None:
                for pid in [*workers(p), p.pid]: os.kill(pid, signal.SIGKILL)
        done = [p.communicate() for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(err[-3000:] for _, err in done)
    return [out for out, _ in done]


def test_two_nodes_train_rank_0_alone_writes_and_a_lost_node_resumes_exactly(tmp_path):
    n = 12
    # uninterrupted, each node with its own run directory (relative path, own cwd): only rank 0's gets files
    nodes = [tmp_path / "node_a", tmp_path / "node_b"]
    for d in nodes: d.mkdir()
    cfg = const_lr_cfg("run", max_steps=n, save_every=2)
    outs = finish(two_nodes(write_yaml(tmp_path / "local.yaml", cfg), nodes))
    (rank0,) = [i for i, d in enumerate(nodes) if (d / "run").exists()]
    assert sorted(p.name for p in (nodes[rank0] / "run").glob("meta_step_*.json")) == [
        f"meta_step_{s}.json" for s in sorted(range(2, n + 1, 2), key=str)]
    assert "step=" in outs[rank0] and "step=" not in outs[1 - rank0] and f"done: steps 0->{n}" in outs[rank0]
    reference = losses(nodes[rank0] / "run")
    assert sorted(reference) == list(range(1, n + 1))
    # shared storage: kill one node (launcher and worker) once a checkpoint is committed; the other exits on its own
    shared = tmp_path / "shared"
    f = write_yaml(tmp_path / "shared.yaml", const_lr_cfg(shared, save_every=2))
    procs = two_nodes(f, nodes)
    wait_for(lambda: (shared / "meta_step_2.json").exists(), procs, "two-node training")
    for pid in [*workers(procs[0]), procs[0].pid]: os.kill(pid, signal.SIGKILL)   # the whole node dies at once
    t = time.time()
    procs[1].communicate(timeout=300)
    survivor_s = time.time() - t
    procs[0].communicate()
    assert procs[1].returncode != 0 and survivor_s < 120, survivor_s
    print(f"survivor exited {survivor_s:.1f} s after the other node was killed")
    latest = CheckpointManager(shared).latest_step()
    assert latest is not None and latest < n
    # both nodes again: they resume from the newest committed step, and every loss equals the uninterrupted run's
    outs = finish(two_nodes(f, nodes, "--max-steps", str(n)))
    assert sum(f"[resume] from checkpoint step {latest}" in o for o in outs) == 1
    assert losses(shared) == reference
