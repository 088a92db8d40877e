import pytest
import torch

from harness.bracket import PeakLedger, bracket
from harness.memory import MIB, CpuMemoryProbe, probe_for, to_mib


def test_cpu_probe_counts_live_tensor_bytes_exactly():
    probe = CpuMemoryProbe()
    with probe:
        before = probe.allocated_bytes()
        tensor = torch.empty(1000, 3, dtype=torch.float32)
        assert probe.allocated_bytes() - before == 12_000
        del tensor
        assert probe.allocated_bytes() == before


def test_reset_peak_starts_a_new_window_and_the_ledger_keeps_the_run_peak():
    probe = CpuMemoryProbe()
    ledger = PeakLedger(probe)
    with probe:
        big = torch.empty(4096, dtype=torch.float64)  # 32 KiB
        del big
        assert probe.peak_allocated_bytes() - probe.allocated_bytes() >= 32_768
        ledger.reset_window()
        assert probe.peak_allocated_bytes() == probe.allocated_bytes()
        small = torch.empty(16, dtype=torch.float64)
        ledger.fold()
        del small
    assert ledger.peak_allocated_bytes >= 32_768  # folded before the reset, not lost


def test_bracket_reports_transient_and_retained_bytes():
    probe = CpuMemoryProbe()
    ledger = PeakLedger(probe)
    with probe:
        with bracket(ledger) as reading:
            temporary = torch.empty(256, dtype=torch.float32)  # 1 KiB, freed inside
            del temporary
            kept = torch.empty(64, dtype=torch.float32)  # 256 B, kept
        assert reading.transient_peak_bytes == 1024
        assert reading.retained_bytes == 256
        del kept


def test_bracket_keeps_its_reading_when_the_work_raises():
    probe = CpuMemoryProbe()
    ledger = PeakLedger(probe)
    with probe:
        with pytest.raises(RuntimeError), bracket(ledger) as reading:
            held = torch.empty(512, dtype=torch.float32)
            raise RuntimeError("boom")
        assert reading.closed and reading.transient_peak_bytes == 2048
        del held


def test_cpu_probe_refuses_to_read_outside_its_context():
    with pytest.raises(RuntimeError, match="inside `with probe:`"):
        CpuMemoryProbe().allocated_bytes()


def test_probe_for_picks_the_exact_probe_and_mib_is_binary():
    assert isinstance(probe_for("cpu"), CpuMemoryProbe)
    with pytest.raises(ValueError, match="no memory probe"):
        probe_for("meta")
    assert MIB == 1_048_576 and to_mib(3 * MIB) == 3.0
