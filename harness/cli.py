"""``harness``: one command for every job, each a subcommand with typed, documented flags.

    harness cell --stack pylate --regime grad-checkpoint --batch-size 512 --variant lik --card h100-80gb
    harness op --stack op-colpali --head negative-ce --negatives 8 --batch-size 128 --variant lik
    harness replay --library colpali --variant vanilla lik --query-shape 128,51,128 --doc-shape 128,771,128
    harness sweep grids/ours.yaml --gpus 0,1
    harness ceiling grids/ceilings.yaml --dry-run
    harness results            # what the report would read, and every file it would skip, with why
    harness migrate results    # rewrite schema-1 results as schema 2
    harness predict --stack pylate --backend lik --card a100-80gb   # the memory model's answer

A cell's flags are its spec's fields (:mod:`harness.spec`), so the command line, the grids, the
notebooks and the results describe a cell with the same names. A mistyped subcommand, flag or
choice gets the closest valid one suggested; a cell that cannot run says why in one line before
any GPU work. Exit status: 0 done, 1 something ran but failed or stopped, 2 refused.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import fnmatch
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from harness import spec as registry
from harness.grid import GridError

ROOT = Path(__file__).resolve().parent.parent


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors suggest the closest valid subcommand, choice or flag."""

    def error(self, message: str) -> NoReturn:
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            options = re.findall(r"'([^']*)'", choice[2]) or [part.strip() for part in choice[2].split(",")]
            synonym = registry.SYNONYMS.get(choice[1])
            close = [synonym] if synonym in options else difflib.get_close_matches(choice[1], options, n=1)
            if close:
                message += f"; did you mean {close[0]!r}?"
        unknown = re.search(r"unrecognized arguments: (\S+)", message)
        if unknown:
            flags = _flags(self)
            close = difflib.get_close_matches(unknown[1].split("=")[0], flags, n=1)
            if close:
                message += f"; did you mean {close[0]}?"
        super().error(message)


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string of ``parser`` and of its subcommands."""
    flags: list[str] = []
    for action in parser._actions:
        flags += action.option_strings
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags += _flags(sub)
    return sorted(set(flags))


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def optional_text(text: str) -> str | None:
    return None if text.lower() in ("none", "") else text


SPEC_CHOICES: dict[str, Callable[[str], Sequence[str]]] = {
    "variant": lambda kind: list(registry.BACKENDS),
    "card": lambda kind: list(registry.CARDS),
    "allocator": lambda kind: list(registry.ALLOCATORS),
    "device": lambda kind: list(registry.DEVICES),
    "stack": lambda kind: [name for name, stack in registry.STACKS.items() if stack.kind == kind],
    "regime": lambda kind: sorted({r for s in registry.STACKS.values() if s.kind == kind for r in s.regimes}),
    "head": lambda kind: sorted({r for s in registry.STACKS.values() if s.kind == kind for r in s.regimes}),
    "preset": lambda kind: [registry.PRESET_AUTO, *sorted({p for s in registry.STACKS.values() for p in s.presets})],
}


def add_spec_flags(parser: argparse.ArgumentParser, kind: str) -> None:
    """One flag per field of the ``kind`` spec: its type, its choices from the registries, its help."""
    for field in registry.spec_fields(kind):
        flag = "--" + field.name.replace("_", "-")
        annotation = str(field.type)
        options: dict[str, Any] = {"help": field.metadata.get("help", ""), "dest": field.name}
        if field.name in SPEC_CHOICES:
            options["choices"] = SPEC_CHOICES[field.name](kind)
        if annotation == "bool":
            options["action"] = argparse.BooleanOptionalAction  # --trace / --no-trace
        elif "int" in annotation:
            options["type"] = positive_int if field.name not in ("seed", "warmup_steps") else int
        elif "None" in annotation:
            options["type"] = optional_text
        if field.default is not dataclasses.MISSING:
            options["default"] = field.default
            options["help"] += f" (default: {field.default})"
        parser.add_argument(flag, **options)
    parser.add_argument("--output", type=Path, help="where the result goes (default: runs/<cell id>.json, never results/)")


def build_parser() -> Parser:
    parser = Parser(prog="harness", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)

    cell = commands.add_parser("cell", help="run one training cell in this process", description=registry.TrainSpec.__doc__)
    add_spec_flags(cell, "train")
    op = commands.add_parser("op", help="run one op-level cell (a loss head alone)", description=registry.OpSpec.__doc__)
    add_spec_flags(op, "op")

    replay = commands.add_parser("replay", help="replay one MaxSim shape in isolation, per variant",
                                 description="replay one MaxSim shape in isolation, per variant")
    replay.add_argument("--library", required=True, choices=["colpali", "pylate"], help="whose MaxSim op")
    replay.add_argument("--variant", nargs="+", default=["vanilla"], choices=list(registry.BACKENDS), help="backends to replay")
    replay.add_argument("--query-shape", required=True, help="e.g. 128,51,128")
    replay.add_argument("--doc-shape", required=True, help="e.g. 128,771,128 (colpali) or 512,2,300,128 (pylate)")
    replay.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="embedding dtype")
    replay.add_argument("--no-doc-mask", action="store_true", help="pylate: call without documents_mask")
    replay.add_argument("--device", default="auto", choices=list(registry.DEVICES), help="where to replay (default: auto)")
    replay.add_argument("--output", type=Path, help="write the records as JSON here")

    for name, description in (("sweep", "run every cell of a grid that has no result yet"),
                              ("ceiling", "run or inspect the batch-size ceiling searches of a grid")):  # fmt: skip
        sub = commands.add_parser(name, help=description, description=description)
        sub.add_argument("grid", type=Path, help="a grid file, e.g. grids/ours.yaml")
        sub.add_argument("--gpus", help="'0,1' or 'all': workers bound to these GPUs (default: the one visible)")
        sub.add_argument("--cells-per-gpu", type=positive_int, default=1, metavar="N",
                         help="start N cells per GPU; they measure one at a time unless --share-gpu (default 1)")  # fmt: skip
        sub.add_argument("--pin-cpus", choices=["auto", "on", "off"], default="auto",
                         help="pin each GPU's cells to their own share of the CPU cores (auto: when more than one GPU "
                              "is given), so cells on different GPUs time as if alone (the timing rule)")  # fmt: skip
        sub.add_argument("--match", action="append", default=[], metavar="GLOB",
                         help="only ids matching this pattern (repeatable)")
        sub.add_argument("--dry-run", action="store_true", help="say where each cell or search stands, run nothing")
        sub.add_argument("--rerun-crashed", action="store_true", help="run crashed cells again (once each)")
        sub.add_argument("--results-dir", type=Path, default=ROOT / "results", help="default: results/")
        sub.add_argument("--notebooks-dir", type=Path, default=ROOT / "book" / "cells", help="default: book/cells/")
        sub.add_argument("--share-gpu", nargs="?", const="free", metavar="GIB",
                         help="capped cells measure side by side within GIB of a GPU's memory (default: what nvidia-smi "
                              "reports free less 1 GiB); outcomes and peaks are unchanged, step times are not the card's "
                              "and are never published")  # fmt: skip
    sweep = commands.choices["sweep"]
    sweep.add_argument("--stack", action="append", choices=list(registry.STACKS), help="only this stack's cells (repeatable)")
    sweep.add_argument("--skypilot", type=Path, help="write a SkyPilot task file for this grid and exit")

    results = commands.add_parser("results", help="what the report reads, and every file it skips with why",
                                  description="what the report reads, and every file it skips with why")
    results.add_argument("folder", nargs="?", type=Path, default=ROOT / "results", help="default: results/")
    migrate = commands.add_parser("migrate", help="rewrite schema-1 results as schema 2 (spec, cell id, grid, provenance)",
                                  description="rewrite schema-1 results as schema 2 (spec, cell id, grid, provenance)")
    migrate.add_argument("folder", nargs="?", type=Path, default=ROOT / "results", help="default: results/")
    migrate.add_argument("--dry-run", action="store_true", help="say what would be rewritten")
    commands.add_parser("schema", help="print the JSON schema of a cell result",
                        description="print the JSON schema of a cell result")
    cellbook = commands.add_parser("cellbook", help="render the book's executed cell notebooks' tables from their results",
                                   description="render the book's executed cell notebooks' tables from their results")
    _cellbook_arguments(cellbook)
    predict = commands.add_parser("predict", help="predicted step peak and largest batch on a card (the memory model)",
                                  description="predicted step peak and largest batch on a card, from the memory model "
                                              "fitted to the committed results (harness.memmodel)")  # fmt: skip
    _predict_arguments(predict)
    return parser


def _predict_arguments(parser: argparse.ArgumentParser) -> None:
    from harness.memmodel import add_arguments

    add_arguments(parser)


def _predict(args: argparse.Namespace) -> int:
    from harness.memmodel import command

    return command(args)


def _cellbook_arguments(parser: argparse.ArgumentParser) -> None:
    from harness.cellbook import add_arguments

    add_arguments(parser)


def _cellbook(args: argparse.Namespace) -> int:
    from harness.cellbook import command

    return command(args)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except (registry.SpecError, GridError) as error:
        print(f"harness {args.command}: {error}", file=sys.stderr)
        return 2


def _spec_from(args: argparse.Namespace, kind: str) -> registry.CellSpec:
    return registry.make_spec({"kind": kind} | {field.name: getattr(args, field.name) for field in registry.spec_fields(kind)})


def _run_cell(args: argparse.Namespace) -> int:
    from harness.backends import BackendUnavailable
    from harness.cell import CellError, run_cell
    from harness.notebook import default_output
    from harness.opbench import run_op_cell
    from harness.stacks import StackUnavailable

    spec = _spec_from(args, "train" if args.command == "cell" else "op")
    output = args.output or default_output(spec.cell_id)
    try:
        result = run_cell(spec, output) if isinstance(spec, registry.TrainSpec) else run_op_cell(spec, output)
    except (CellError, BackendUnavailable, StackUnavailable) as error:
        print(f"harness {args.command}: {error}", file=sys.stderr)
        return 2
    detail = f" ({result.oom_message})" if result.oom_message else ""
    peaks = "" if result.step_peak_alloc_mib is None else (
        f"; peak {result.step_peak_alloc_mib:.0f} MiB allocated / {result.step_peak_reserved_mib:.0f} MiB reserved")
    print(f"{result.cell_id}: {result.outcome}{detail}{peaks}; result in {output}")
    return 0


def _replay(args: argparse.Namespace) -> int:
    from harness.replay import ReplayError, replay_command, shape_argument

    try:
        query, doc = shape_argument(args.query_shape), shape_argument(args.doc_shape)
        replay_command(args.library, args.variant, query, doc, args.dtype, not args.no_doc_mask, args.device, args.output)
    except (ReplayError, argparse.ArgumentTypeError) as error:
        print(f"harness replay: {error}", file=sys.stderr)
        return 2
    return 0


def _matching(ids: Sequence[str], patterns: Sequence[str]) -> list[bool]:
    return [not patterns or any(fnmatch.fnmatchcase(i, p) for p in patterns) for i in ids]


def _sweep(args: argparse.Namespace) -> int:
    import yaml

    from harness.grid import load_grid
    from harness.orchestrate.ceiling import share_budgets
    from harness.orchestrate.launcher import Layout, state
    from harness.orchestrate.pool import visible_gpus
    from harness.orchestrate.sweep import run_sweep, skypilot_task

    cells = load_grid(args.grid, args.stack)
    cells = [cell for cell, keep in zip(cells, _matching([c.cell_id for c in cells], args.match), strict=True) if keep]
    if not cells:
        print(f"harness sweep: no cell of {args.grid} matches {' or '.join(args.match) or 'the stacks asked'}", file=sys.stderr)
        return 2
    layout = Layout(args.results_dir, args.notebooks_dir)
    if args.skypilot:
        args.skypilot.parent.mkdir(parents=True, exist_ok=True)
        args.skypilot.write_text(yaml.safe_dump(skypilot_task(args.grid, cells), sort_keys=False))
        print(f"wrote {args.skypilot}")
        return 0
    if args.dry_run:
        for cell in cells:
            print(f"{state(cell, layout):8s} {cell.cell_id}")
        print(f"{len(cells)} cells")
        return 0
    try:
        gpus = visible_gpus(args.gpus) if args.gpus else None
        share = None if args.share_gpu is None else share_budgets(args.share_gpu, gpus)
    except ValueError as error:
        print(f"harness sweep: {error}", file=sys.stderr)
        return 2
    _say_share(share)
    runs = run_sweep(cells, layout, gpus, args.rerun_crashed, cells_per_gpu=args.cells_per_gpu,
                     pin_cpus=_pin(args.pin_cpus, gpus), share_gib=share)  # fmt: skip
    return 1 if any(run.outcome == "crashed" for run in runs) else 0


def _say_share(share: dict[str | None, float] | None) -> None:
    """``--share-gpu``'s budget per GPU, said before anything runs (sweep and ceiling alike)."""
    if share:
        print("sharing GPUs: " + ", ".join(f"{gpu or 'default'} {gib:.1f} GiB" for gpu, gib in share.items()))


def _pin(choice: str, gpus: list[str] | None) -> bool:
    """``--pin-cpus``: on, off, or (auto) on when cells run on more than one GPU at once."""
    return choice == "on" or (choice == "auto" and gpus is not None and len(gpus) > 1)


def _ceiling(args: argparse.Namespace) -> int:
    from harness.orchestrate.ceiling import run_searches, share_budgets
    from harness.orchestrate.launcher import Layout
    from harness.orchestrate.pool import visible_gpus
    from harness.search import Ceiling, ProbeMismatch, describe, load_searches, read_probes, search_state

    searches = load_searches(args.grid, args.match)
    if not searches:
        print(f"harness ceiling: no search of {args.grid} matches {' or '.join(args.match)}", file=sys.stderr)
        return 2
    if args.dry_run:
        from harness.report import data, longrun, tables

        refused, pending, minutes, unknown = 0, 0, 0.0, 0
        timed = tables.timed(data.load(args.results_dir)[0])  # what costs each next probe
        for search, probes in zip(searches, read_probes(searches, args.results_dir), strict=True):
            try:
                ceiling, probe = search_state(search, probes)
            except ProbeMismatch as error:
                refused += 1
                print(describe(search, Ceiling(stopped=str(error))), file=sys.stderr)
                continue
            cost, pending = "", pending + (not ceiling.done)
            if probe is not None:
                estimate = longrun.minutes_alone(probe, timed)
                cost = " · no timed cell to cost it" if estimate is None else f" · ≈ {estimate:.1f} GPU-min alone"
                unknown += estimate is None
                minutes += estimate or 0.0
            print(describe(search, ceiling) + cost)
        summary = f"{len(searches)} searches, {pending} unfinished" + (f", {refused} refused" if refused else "")
        if pending:
            summary += f"; their next probes ≈ {minutes:.0f} GPU-minutes alone"
            summary += f" (and {unknown} with no timed cell to cost them)" if unknown else ""
        print(summary)
        return 1 if refused else 0
    try:
        gpus = visible_gpus(args.gpus) if args.gpus else None
        share = None if args.share_gpu is None else share_budgets(args.share_gpu, gpus)
    except ValueError as error:
        print(f"harness ceiling: {error}", file=sys.stderr)
        return 2
    _say_share(share)
    layout = Layout(args.results_dir, args.notebooks_dir)
    ceilings = run_searches(searches, layout, gpus, args.cells_per_gpu, rerun_crashed=args.rerun_crashed, share_gib=share,
                            pin_cpus=_pin(args.pin_cpus, gpus))  # fmt: skip
    stopped = [describe(search, c) for search, c in zip(searches, ceilings, strict=True) if c.stopped]
    for line in stopped:
        print(line, file=sys.stderr)
    return 1 if stopped else 0


def _results(args: argparse.Namespace) -> int:
    from collections import Counter

    from harness.report import data

    read = data.read(args.folder)
    results, skipped = read.found, read.skipped
    counts = Counter(result.grid for _, result in results)
    print(f"{len(results)} results of the report's grids under {args.folder}: "
          + ", ".join(f"{grid} {n}" for grid, n in sorted(counts.items())))  # fmt: skip
    for item in skipped:
        print(f"skipped {item.path}: {item.reason}")
    return 0


def _migrate(args: argparse.Namespace) -> int:
    from harness.migrate import migrate

    rewritten, problems = migrate(args.folder, dry_run=args.dry_run)
    print(f"{'would rewrite' if args.dry_run else 'rewrote'} {len(rewritten)} schema-1 results under {args.folder}")
    for problem in problems:
        print(f"not migrated: {problem}", file=sys.stderr)
    return 1 if problems else 0


def _schema(args: argparse.Namespace) -> int:
    from harness.results import dumps_schema

    print(dumps_schema())
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "cell": _run_cell, "op": _run_cell, "replay": _replay, "sweep": _sweep, "ceiling": _ceiling,
    "results": _results, "migrate": _migrate, "schema": _schema, "cellbook": _cellbook, "predict": _predict,
}  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
