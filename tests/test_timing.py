import torch

from harness.timing import AutotuneWatch, StepTimer, steady_state


def test_steady_state_excludes_warmup_and_autotuned_steps():
    times = [9.0, 1.0, 30.0, 1.2, 1.1]
    steady, median = steady_state(times, autotune_steps=[2], warmup_steps=1)
    assert steady == [1, 3, 4] and median == 1.1


def test_steady_state_is_empty_when_no_step_qualifies():
    assert steady_state([5.0], autotune_steps=[], warmup_steps=1) == ([], None)


def test_step_timer_marks_the_steps_in_which_a_kernel_autotuned():
    watch = AutotuneWatch()
    seen = []
    timer = StepTimer(torch.device("cpu"), watch, on_step=seen.append)
    for step in range(3):
        timer.on_step_begin(None, None, None)
        if step == 1:
            watch.events += 1  # what the Triton autotuner hook does when its cache grows
        timer.on_step_end(None, None, None)
    assert seen == [0, 1, 2]
    assert timer.autotune_steps == [1] and len(timer.step_times_sec) == 3
    assert all(t >= 0 for t in timer.step_times_sec)
