"""The timing rule: the host registry, CPU pinning, and what a result records about its times."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from harness import host
from harness.cell import timing_context
from harness.orchestrate.pool import split_cpus
from harness.spec import AUTOTUNE_ALLOWANCE, SpecError, TrainSpec
from toy_stack import run_in_a_fresh_process

CORES = sorted(os.sched_getaffinity(0))


def test_cpu_lists_read_and_write_as_ranges():
    assert host.cpu_ranges([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    assert host.parse_cpus("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert host.parse_cpus(host.cpu_ranges(CORES)) == CORES
    for bad in ("", "a-b", "3-1", "-2"):
        with pytest.raises(ValueError, match="CPU list"):
            host.parse_cpus(bad)


def test_each_gpu_gets_its_own_disjoint_share_of_the_cores():
    shares = split_cpus(range(16), 2)
    assert shares == [tuple(range(8)), tuple(range(8, 16))]
    shares = split_cpus(range(10), 3)
    assert [len(share) for share in shares] == [4, 3, 3] and sorted(sum(shares, ())) == list(range(10))
    with pytest.raises(ValueError, match="cannot pin 3 GPUs"):
        split_cpus([0, 1], 3)


def neighbour(tmp_path, cpus):
    """A process that enters the host registry pinned to ``cpus`` and waits to be killed."""
    code = textwrap.dedent(
        """
        import sys, time
        from harness import host
        host.enter("neighbour")
        print("in", flush=True)
        time.sleep(120)
        """
    )
    env = dict(os.environ) | {host.HOST_DIR_VARIABLE: str(tmp_path), host.PINNED_VARIABLE: host.cpu_ranges(cpus)}
    process = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "in"
    return process


@pytest.mark.skipif(len(CORES) < 2, reason="needs two CPU cores to pin two processes apart")
def test_a_neighbour_on_other_cores_keeps_times_comparable_one_on_ours_does_not(tmp_path, monkeypatch):
    monkeypatch.setenv(host.HOST_DIR_VARIABLE, str(tmp_path))
    monkeypatch.setattr(host, "_entry", None)
    monkeypatch.setattr(host, "_tag", None)
    monkeypatch.setattr(host, "own_cpus", lambda: [CORES[0]])
    host.enter("me")
    cuda = torch.device("cuda")  # the rule for a GPU cell; nothing here touches a device
    watch = host.HostWatch()
    watch.look()
    context = timing_context(cuda, watch)
    assert (watch.most_neighbours, context.comparable, context.reason) == (0, True, None)

    apart = neighbour(tmp_path, CORES[1:])
    try:
        watch.look()
        context = timing_context(cuda, watch)
        assert (context.neighbours, context.neighbours_on_own_cpus, context.comparable) == (1, 0, True)
    finally:
        apart.kill()
        apart.wait()
    watch = host.HostWatch()
    watch.look()
    assert watch.most_neighbours == 0  # a process that died no longer counts (its lock went with it)

    beside = neighbour(tmp_path, CORES)
    try:
        watch.look()
    finally:
        beside.kill()
        beside.wait()
    context = timing_context(cuda, watch)
    assert (context.neighbours_on_own_cpus, context.comparable) == (1, False)
    assert context.reason == "1 other cell process(es) could run on its CPU cores while it trained"
    assert timing_context(torch.device("cpu"), host.HostWatch()).reason == "timed on the CPU"


def test_a_timed_cell_trains_until_it_has_its_steady_steps(tmp_path):
    spec = TrainSpec(stack="pylate", batch_size=4, steps=2, min_steady_steps=3, preset="tiny", device="cpu")
    assert spec.max_steps == 1 + 3 + AUTOTUNE_ALLOWANCE and TrainSpec(steps=6).max_steps == 6
    with pytest.raises(SpecError, match="min_steady_steps must be at most 64"):
        TrainSpec(min_steady_steps=65)
    env = dict(os.environ) | {host.HOST_DIR_VARIABLE: str(tmp_path / "host")}
    completed = run_in_a_fresh_process(tmp_path / "cell.json", env, stack="colpali", batch_size=4, steps=2,
                                       min_steady_steps=3, preset="tiny", device="cpu")  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-2000:]
    from harness.results import load_result

    result = load_result(tmp_path / "cell.json")
    # warm-up step 0, then three steady steps (no autotuning on the CPU): it stopped at four, not at max_steps
    assert len(result.step_times_sec) == 4 and result.steady_steps == [1, 2, 3]
    assert len(result.step_peak_alloc_per_step_mib) == 4
    assert result.timing is not None and result.timing.cpus == host.cpu_ranges(CORES)
    assert (result.timing.comparable, result.timing.reason, result.times_comparable) == (False, "timed on the CPU", False)
    assert not (tmp_path / "host").exists() or not os.listdir(tmp_path / "host")  # the cell left the registry


def test_the_hosts_oom_kills_are_read_from_the_cgroup_of_either_version(tmp_path):
    membership = tmp_path / "cgroup"
    # cgroup v2: the unified hierarchy's group, its memory.events
    membership.write_text("0::/cells/one\n")
    group = tmp_path / "fs" / "cells" / "one"
    group.mkdir(parents=True)
    (group / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\noom_group_kill 0\n")
    assert host.oom_kills(tmp_path / "fs", membership) == 2
    # cgroup v1 inside a container: the group /proc names is the mount's root
    membership.write_text("4:memory:/process_api/abc\n3:cpuset:/\n0::/\n")
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    assert host.oom_kills(v1, membership) == 5
    assert host.oom_kills(tmp_path / "nothing", membership) is None  # no memory controller to read
    assert host.oom_kills(v1, tmp_path / "no-such-file") == 5  # no membership: the root's group


def test_a_crash_says_when_the_hosts_oom_killer_killed_while_it_ran():
    assert host.oom_kill_words(0, 1) == (
        "; the host's out-of-memory killer killed 1 process of this cell's control group while it ran "
        "(oom_kill 0 → 1): the host's memory, not the GPU's, ran out")  # fmt: skip
    assert "killed 2 processes" in host.oom_kill_words(3, 5)
    assert host.oom_kill_words(1, 1) == host.oom_kill_words(None, 1) == host.oom_kill_words(0, None) == ""
