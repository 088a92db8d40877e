"""The GPU gate: cells measure alone by default, side by side within a share budget, in the order they asked.

Every gate here is a lock file in the test's own folder: no test takes (or waits on) the host's real
gates in the temporary directory, which a sweep running beside the tests holds.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from harness import gpu_gate
from harness.gpu_gate import CONTEXT_MARGIN_GIB as MARGIN
from harness.orchestrate import pool

pytestmark = pytest.mark.usefixtures("own_gates")  # every gate of these tests is the test's own (tests/conftest.py)

ENTER = """
import sys, time
from harness import gpu_gate
cap = None if sys.argv[1] == "native" else float(sys.argv[1])
waited = gpu_gate.hold(cap)
print(f"{time.time():.3f} {waited:.3f} {gpu_gate.share_gib()}", flush=True)
time.sleep(float(sys.argv[2]))
"""


def enter(env, cap, stay_sec):
    """A process that enters the gate with card cap ``cap`` and stays ``stay_sec`` seconds."""
    return subprocess.Popen([sys.executable, "-c", ENTER, str(cap), str(stay_sec)], env=env, stdout=subprocess.PIPE, text=True)


def entered(process, timeout_sec=60):
    """(time it entered, seconds it waited, GiB it was given) as the process printed them."""
    ready, _, _ = select.select([process.stdout], [], [], timeout_sec)
    if not ready:
        process.kill()
        pytest.fail(f"a process did not enter the gate within {timeout_sec} s")
    when, waited, share = process.stdout.readline().split()
    return float(when), float(waited), None if share == "None" else float(share)


def wait_for_ticket(lock, timeout_sec=60):
    """Until some process waits in the gate (its ``wait-`` entry exists)."""
    deadline = time.time() + timeout_sec
    while not list(lock.with_name(lock.name + ".d").glob("wait-*")):
        assert time.time() < deadline, "no process started waiting"
        time.sleep(0.05)



@pytest.fixture
def gate_env(own_gates):
    return {**os.environ, gpu_gate.LOCK_VARIABLE: str(pool.gate_path("0"))}


def test_a_gpus_gate_is_in_the_gate_folder_the_sweep_was_given(own_gates, monkeypatch):
    assert pool.gate_path("7") == own_gates / "maxsim-gpu-7.gate"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert pool.gate_path(None) == own_gates / "maxsim-gpu-3.gate"  # the GPU a cell without one is pinned to
    monkeypatch.delenv(pool.GATE_DIR_VARIABLE)
    assert pool.gate_path("7") == Path(tempfile.gettempdir()) / "maxsim-gpu-7.gate"  # the host's, shared by its sweeps
    assert not list(own_gates.iterdir())  # naming a gate takes nothing


def test_what_a_cell_takes_from_a_shared_gpu():
    assert gpu_gate.share_needed(22.96, 139.0) == pytest.approx(22.96 + MARGIN)
    assert gpu_gate.share_needed(22.96, None) is None  # no budget: the GPU alone
    assert gpu_gate.share_needed(None, 139.0) is None  # uncapped: the GPU alone
    assert gpu_gate.share_needed(138.0, 139.0) is None  # cap + context beyond the budget: alone


def test_who_fits_beside_whom():
    assert gpu_gate.fits(None, [], 139.0)
    assert not gpu_gate.fits(None, ["24.96"], 139.0)  # alone means nobody else inside
    assert gpu_gate.fits(24.96, ["24.96"] * 4, 139.0)  # five 24 GB cards on a 139 GiB budget
    assert not gpu_gate.fits(24.96, ["24.96"] * 5, 139.0)
    assert not gpu_gate.fits(24.96, [gpu_gate.EXCLUSIVE], 139.0)  # nobody joins a cell that is alone
    assert not gpu_gate.fits(24.96, [], None)


def test_an_unreadable_budget_is_refused(monkeypatch):
    monkeypatch.setenv(gpu_gate.SHARE_VARIABLE, "lots")
    with pytest.raises(ValueError, match="GPU's memory in GiB"):
        gpu_gate.share_budget()
    monkeypatch.setenv(gpu_gate.SHARE_VARIABLE, "-3")
    with pytest.raises(ValueError, match="positive"):
        gpu_gate.share_budget()


def test_without_a_budget_cells_enter_one_at_a_time(gate_env):
    first = enter(gate_env, 4.0, 1.5)
    first_in = entered(first)
    second_in = entered(enter(gate_env, 4.0, 0))
    assert first_in[2] is None and second_in[2] is None  # each had the GPU alone
    assert second_in[0] >= first_in[0] + 1.4  # it entered only once the first process had ended
    first.wait()


def test_capped_cells_share_a_budget_and_the_next_waits_for_room(gate_env):
    env = {**gate_env, gpu_gate.SHARE_VARIABLE: str(2 * (4.0 + MARGIN))}  # room for exactly two 4 GiB caps
    a = enter(env, 4.0, 4.0)
    a_in = entered(a)
    b = enter(env, 4.0, 4.0)
    b_in = entered(b)
    assert b_in[0] < a_in[0] + 4.0  # in beside a, while a was still inside
    assert a_in[2] == b_in[2] == pytest.approx(4.0 + MARGIN)
    c_in = entered(enter(env, 4.0, 0))
    assert c_in[0] >= a_in[0] + 3.9  # the third waited until one of them left
    a.wait(), b.wait()


def test_an_uncapped_cell_waits_for_the_gpu_alone_and_keeps_its_place(gate_env):
    env = {**gate_env, gpu_gate.SHARE_VARIABLE: "100"}
    small = enter(env, 4.0, 3.0)
    small_in = entered(small)
    native = enter(env, "native", 1.5)
    wait_for_ticket(Path(env[gpu_gate.LOCK_VARIABLE]))  # the native cell asks before the late one
    late = enter(env, 4.0, 0)
    native_in, late_in = entered(native), entered(late)
    assert native_in[2] is None and native_in[0] >= small_in[0] + 2.9  # alone: after the small one left
    assert late_in[0] >= native_in[0] + 1.4  # it fitted beside the small one, but came after the native cell
    small.wait(), native.wait()


def test_a_killed_cell_leaves_no_claim_behind(gate_env):
    holder = enter(gate_env, 4.0, 60)
    entered(holder)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    began = time.perf_counter()
    assert entered(enter(gate_env, 4.0, 0))[1] < 1.0  # the kernel dropped the dead process's lock
    assert time.perf_counter() - began < 30


def test_outside_a_gated_sweep_there_is_no_gate(monkeypatch):
    monkeypatch.delenv(gpu_gate.LOCK_VARIABLE, raising=False)
    assert gpu_gate.hold(22.96) == 0.0
    assert gpu_gate.share_gib() is None


def test_a_cell_interrupted_while_waiting_leaves_the_queue(gate_env, monkeypatch):
    holder = enter(gate_env, "native", 5)
    entered(holder)
    monkeypatch.setenv(gpu_gate.LOCK_VARIABLE, gate_env[gpu_gate.LOCK_VARIABLE])

    def interrupted(seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr(gpu_gate.time, "sleep", interrupted)
    with pytest.raises(KeyboardInterrupt):
        gpu_gate.hold(4.0)
    entries = Path(gate_env[gpu_gate.LOCK_VARIABLE] + ".d")
    assert not list(entries.glob("wait-*"))  # its ticket is gone: it holds nobody up
    assert gpu_gate.share_gib() is None
    holder.kill()
    holder.wait()
