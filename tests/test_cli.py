"""The one ``harness`` command: its refusals (one line, exit 2, the closest choice suggested, before
anything runs), its help, and the read-only subcommands on the committed results. Most checks call
:func:`harness.cli.main` in this process; a few run the installed console script end to end."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import cli
from harness.results import OTHER_RECORDS

pytestmark = pytest.mark.pylate
ROOT = Path(__file__).resolve().parent.parent
HARNESS = Path(sys.executable).with_name("harness")  # this environment's console script


def refused(argv: list[str], capsys) -> str:
    """The error line of a command line argparse refuses (exit 2)."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.splitlines()[-1]


def one_line(argv: list[str], capsys, status: int = 2) -> str:
    """The single stderr line of a command the harness refuses itself (exit ``status``)."""
    assert cli.main(argv) == status
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


def test_a_mistyped_choice_is_refused_with_the_closest_one(capsys):
    stack = refused(["cell", "--stack", "colbert"], capsys)
    assert "invalid choice: 'colbert'" in stack and re.search(r"did you mean '(pylate|colpali)'\?$", stack)
    assert refused(["cell", "--device", "gpu"], capsys).endswith("did you mean 'cuda'?")
    assert refused(["cell", "--variant", "lick"], capsys).endswith("did you mean 'lik'?")
    assert refused(["op", "--head", "negative_ce"], capsys).endswith("did you mean 'negative-ce'?")
    assert refused(["cell", "--batch-size", "0"], capsys).endswith("must be at least 1, got 0")


def test_a_mistyped_subcommand_or_flag_is_refused_with_the_closest_one(capsys):
    assert refused(["sweeep", "grids/ours.yaml"], capsys).endswith("did you mean 'sweep'?")
    assert refused(["celing", "grids/ceilings.yaml"], capsys).endswith("did you mean 'ceiling'?")
    assert refused(["sweep", "grids/ours.yaml", "--dryrun"], capsys).endswith("did you mean --dry-run?")


def test_a_sweep_of_an_unknown_stack_is_refused_before_anything_runs(tmp_path, capsys):
    line = refused(["sweep", "grids/ours.yaml", "--stack", "colbert", "--results-dir", str(tmp_path / "results")], capsys)
    assert "invalid choice: 'colbert'" in line and "did you mean" in line
    assert not (tmp_path / "results").exists()


def test_a_cell_that_cannot_be_described_is_refused_in_one_line_before_anything_runs(tmp_path, capsys, monkeypatch):
    import harness.cell

    monkeypatch.setattr(harness.cell, "run_cell", lambda *args, **kwargs: pytest.fail("a refused cell ran"))
    output = tmp_path / "cell.json"
    line = one_line(["cell", "--stack", "pylate", "--warmup-steps", "10", "--steps", "2", "--output", str(output)], capsys)
    assert line == ("harness cell: warmup_steps (10) must be below steps (2): the cell would have no steady step to time.")
    line = one_line(["cell", "--stack", "colpali", "--regime", "grad-checkpoint", "--output", str(output)], capsys)
    assert line.startswith("harness cell: unknown regime for colpali 'grad-checkpoint'")
    assert one_line(["op", "--stack", "op-colpali", "--head", "negative-ce", "--output", str(output)], capsys) == (
        "harness op: the negative-ce head needs negatives (explicit negative documents per query, >= 1).")
    assert not output.exists()


def test_a_fused_variant_on_the_cpu_says_it_needs_cuda_in_one_line(tmp_path, capsys):
    output = tmp_path / "cell.json"
    argv = ["cell", "--device", "cpu", "--stack", "pylate", "--preset", "tiny", "--batch-size", "2", "--steps", "2",
            "--variant", "lik", "--output", str(output)]  # fmt: skip
    line = one_line(argv, capsys)
    assert line.startswith("harness cell: variant 'lik'") and "runs only on CUDA devices, not cpu" in line
    assert not output.exists()


def test_replay_refuses_what_it_cannot_run_in_one_line(tmp_path, capsys):
    shapes = ["--library", "colpali", "--device", "cpu", "--query-shape", "4,5,8"]
    assert one_line(["replay", *shapes, "--doc-shape", "4,6,16"], capsys) == (
        "harness replay: query and document embeddings differ in dimension (8 vs 16)")
    missing = tmp_path / "nowhere" / "replay.json"
    assert one_line(["replay", *shapes, "--doc-shape", "4,6,8", "--output", str(missing)], capsys) == (
        f"harness replay: the output's folder {missing.parent} does not exist")
    assert one_line(["replay", *shapes, "--doc-shape", "4,6,8", "--variant", "flash"], capsys) == (
        "harness replay: variant 'flash' is not available for colpali; choose one of vanilla, lik.")
    rank = one_line(["replay", *shapes, "--doc-shape", "4,6"], capsys)
    assert rank == "harness replay: colpali takes a 3-D query shape and a 3-D doc shape, got 3-D and 2-D"
    assert one_line(["replay", *shapes, "--doc-shape", "4,six,8"], capsys) == (
        "harness replay: shape '4,six,8' is not a comma-separated list of integers")
    assert "invalid choice: 'turbo'" in refused(["replay", *shapes, "--doc-shape", "4,6,8", "--variant", "turbo"], capsys)
    assert not missing.parent.exists()


def subcommands() -> dict[str, tuple[argparse.ArgumentParser, str]]:
    """Every subcommand's parser and its one-line help, as ``harness --help`` lists them."""
    (action,) = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {choice.dest: choice.help for choice in action._choices_actions}
    return {name: (parser, helps[name]) for name, parser in action.choices.items()}


def test_the_help_lists_every_subcommand_and_every_flag_with_a_description(capsys):
    commands = subcommands()
    assert set(commands) == {"cell", "op", "replay", "sweep", "ceiling", "results", "migrate", "schema", "cellbook", "predict"}
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    top = " ".join(capsys.readouterr().out.split())
    for name, (_, summary) in commands.items():
        assert summary and f"{name} {' '.join(summary.split())}" in top
    for name, (parser, _) in commands.items():
        with pytest.raises(SystemExit) as exit_:
            cli.main([name, "--help"])
        assert exit_.value.code == 0
        page = " ".join(capsys.readouterr().out.split())
        assert parser.description, f"`harness {name} --help` has no description"
        assert " ".join(parser.description.split())[:60] in page
        for flag in parser._actions:
            assert flag.help, f"harness {name}: {flag.option_strings or flag.dest} has no description"


def test_results_reads_every_committed_result_and_skips_nothing(capsys):
    assert cli.main(["results"]) == 0
    out = capsys.readouterr().out
    first, *rest = out.splitlines()
    assert rest == []  # no "skipped" line
    total, folder, counts = re.fullmatch(r"(\d+) results of the report's grids under (.+): (.+)", first).groups()
    assert Path(folder) == ROOT / "results"
    committed = [p for p in (ROOT / "results").rglob("*.json") if not p.name.startswith(".")
                 and p.relative_to(ROOT / "results").parts[0] not in OTHER_RECORDS]  # read by their own modules
    assert int(total) == len(committed) == sum(int(part.split()[1]) for part in counts.split(", "))
    assert {part.split()[0] for part in counts.split(", ")} >= {"ceilings", "op", "ours", "published"}


def test_results_names_every_file_it_skips(tmp_path, capsys):
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "old.json").write_text(json.dumps({"schema_version": 1}))
    assert cli.main(["results", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"0 results of the report's grids under {tmp_path}")
    assert out[1].startswith(f"skipped {tmp_path / 'broken.json'}: not JSON")
    assert out[2] == f"skipped {tmp_path / 'old.json'}: schema 1, this harness reads 2; run `harness migrate` to rewrite it"


def test_the_ceiling_dry_run_reads_every_committed_search_as_the_search_module_does(capsys):
    from harness.search import describe, load_searches, read_probes, search_state

    grid = ROOT / "grids" / "ceilings.yaml"
    assert cli.main(["ceiling", str(grid), "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert err == ""  # no search refused: every committed probe lies on its search's walk
    searches = load_searches(grid)
    probes = read_probes(searches, ROOT / "results")  # every grid read once
    states = [search_state(search, mine) for search, mine in zip(searches, probes, strict=True)]
    assert [state[0] for state in states[:3]] == [search_state(search, ROOT / "results")[0] for search in searches[:3]]
    expected = [describe(search, ceiling) for search, (ceiling, _) in zip(searches, states, strict=True)]
    lines = out.splitlines()
    assert len(lines) == len(searches) + 1
    costed = []
    for line, said, (_, probe) in zip(lines[:-1], expected, states, strict=True):
        assert line.startswith(said)
        if probe is None:  # a finished search costs nothing more
            assert line == said
        else:  # the next probe is costed from the cells timed alone
            assert re.fullmatch(r" · ≈ \d+\.\d GPU-min alone", line[len(said):]), line
            costed.append(float(line.split("≈ ")[1].split()[0]))
    unfinished = sum(not ceiling.done for ceiling, _ in states)
    assert costed and unfinished >= len(costed)
    total = re.fullmatch(rf"{len(searches)} searches, {unfinished} unfinished; their next probes ≈ (\d+) GPU-minutes alone",
                         lines[-1])  # fmt: skip
    assert total and abs(int(total[1]) - sum(costed)) <= 0.5 + 0.05 * len(costed)  # the sum of the lines, rounded
    # (when the refactor landed, this output equalled, byte for byte, that of the old code, which found
    # probes by their file names: the embedded specs find the same probes)
    assert all(line.startswith(f"{search.search_id}: ") for search, line in zip(searches, expected, strict=True))


def test_migrate_and_schema_on_the_committed_results(capsys):
    assert cli.main(["migrate", "--dry-run"]) == 0
    assert capsys.readouterr().out == f"would rewrite 0 schema-1 results under {ROOT / 'results'}\n"
    assert cli.main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert {"grid", "cell_id", "spec", "provenance", "failure", "outcome"} <= set(schema["properties"])


def run_harness(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(HARNESS), *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_the_installed_command_end_to_end():
    help_ = run_harness("--help")
    assert help_.returncode == 0 and "ceiling" in help_.stdout and help_.stderr == "", help_.stderr
    typo = run_harness("celing", "grids/ceilings.yaml", "--dry-run")
    assert typo.returncode == 2 and "Traceback" not in typo.stderr
    assert typo.stderr.splitlines()[-1].endswith("did you mean 'ceiling'?")
    replay = run_harness("replay", "--library", "pylate", "--device", "cpu", "--query-shape", "2,4,8", "--doc-shape", "3,2,5,8")
    assert (replay.returncode, replay.stdout) == (2, ""), replay.stderr
    assert replay.stderr == "harness replay: pylate scores each query against its own documents: batch 2 vs 3\n"
    results = run_harness("results")
    assert results.returncode == 0 and results.stdout.count("\n") == 1 and "skipped" not in results.stdout


