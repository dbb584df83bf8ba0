"""`relabel`: run | watch | compare | export | demo | schema | backfill | difficulty (also `python -m rollout_relabel`).

The process edge (at_the_edge), one for every command: exit codes come from ExitCode and the error
types in transforms/lib/errors.py; each failure is one line on stderr, without a traceback.
"""
from __future__ import annotations

import argparse
import gc
import logging
import os
import re
import sys
import threading
from collections.abc import Callable

from rollout_relabel.pipeline.worker_output import TRACEBACK_ENV
from rollout_relabel.transforms.lib.errors import ExitCode, UsageError, printable

MEMORY_POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"  # pyarrow's: the pool a user chose
CAUSE = re.compile(r"^[A-Za-z_.]*(Error|Exception|Interrupt)\b.*: ")

COMMANDS = {
    "run": "relabel stored rollouts into Parquet training rows",
    "watch": "relabel rollout files as they land in a folder",
    "compare": "compare two labelings of the same rollouts: report.json, report.md, plots",
    "export": "write training rows as slime / miles rollout dumps (one <rollout_id>.pt a batch)",
    "demo": "generate a small realistic rollout set and relabel it",
    "schema": "print the input, training-row and dead-letter schemas",
    "backfill": "relabel every run folder under a root, one commit (Delta) or folder per run",
    "difficulty": "pass-rate tables per prompt across runs, for curricula and filters",
}


def entry() -> None:
    """The console command: main(), then a quick exit (pipeline/beam_internals/ says why).

    The cyclic garbage collector is off while the command's modules are imported (settle_heap turns it
    back on): importing Beam allocates objects that live as long as the process and frees almost
    nothing, yet each full collection walks them all, twice before a run's first file group.
    """
    from rollout_relabel.pipeline.beam_internals import quick_exit

    gc.disable()
    choose_memory_pool()
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    quick_exit(code)


def choose_memory_pool() -> None:
    """Arrow's buffers in this process (and the processes it starts) come from jemalloc on Linux, unless the
    user named a pool in pyarrow's ARROW_DEFAULT_MEMORY_POOL. Against pyarrow's default (mimalloc), which
    soon hands freed pages back and faults them in again for the next file, it measured faster on
    `relabel difficulty` and with a lower peak on `relabel run` (docs/performance.md).

    Arrow fixes its pool when pyarrow is first imported, so this runs before that, and by the variable:
    pyarrow's set_memory_pool would reach only the allocations made through pyarrow's Python layer.
    pyarrow's Linux wheels have jemalloc; elsewhere the default stays (macOS and Windows wheels lack it).
    """
    if sys.platform.startswith("linux"):
        os.environ.setdefault(MEMORY_POOL_ENV, "jemalloc")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.ERROR)  # Beam's import-time warnings are not the user's business
    if not os.environ.get(TRACEBACK_ENV):
        # a failing worker's traceback is logged by Beam as it happens; the user gets one line (below)
        logging.getLogger("apache_beam").setLevel(logging.CRITICAL)
    argv = list(sys.argv[1:] if argv is None else argv)
    command, rest = (argv[0], argv[1:]) if argv and argv[0] in COMMANDS else (None, argv)
    if command in ("run", "watch", "compare", "backfill", "difficulty"):
        return pipeline_command(command, rest)
    if command == "export":
        return export_command(rest)
    parser = argparse.ArgumentParser(prog="relabel", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in COMMANDS.items():
        sub.add_parser(name, help=text, add_help=name in ("demo", "schema"))
    demo = sub.choices["demo"]
    demo.add_argument("--workdir", default="demo_run")
    demo.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "schema":
        return at_the_edge("schema", _print_schemas)
    from rollout_relabel.pipeline.demo import run_demo
    return at_the_edge("demo", lambda: run_demo(args.workdir, seed=args.seed))


def at_the_edge(command: str, work: Callable[[], int]) -> int:
    """The process edge every command goes through: work() prints what it made and returns its exit code;
    what it raises becomes one line on stderr (plain text: errors.printable) and the code of its type
    (ExitCode), no traceback:

    - UsageError (bad options or configuration, nothing written): "relabel: error: ...", 2;
    - Ctrl-C: "relabel: interrupted: ...", 130; what is committed stays, and a rerun finishes the rest;
    - anything else (a bug, an environment failure mid-run): "relabel: failed: <the cause>", 1; the
      traceback only with RELABEL_TRACEBACK=1. A run a worker stopped on purpose (RunStopped) is not
      raised this far: the command reads its stop record and returns that type's exit code.
    """
    try:
        return work()
    except UsageError as error:
        print(f"relabel: error: {printable(str(error))}", file=sys.stderr)
        return ExitCode.USAGE
    except KeyboardInterrupt:
        threading.excepthook = _quiet  # worker threads dying of the interrupt have nothing to add
        print(f"relabel: interrupted: committed files are kept; rerun the same `relabel {command}` to finish "
              "what is missing", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except Exception as error:  # noqa: BLE001 - the process edge: one line, the traceback only on request
        if os.environ.get(TRACEBACK_ENV):
            raise
        notes = "; ".join(getattr(error, "__notes__", []))
        print(f"relabel: failed: {printable(_cause(error))} (nothing more is committed; {notes + '; ' if notes else ''}"
              f"{TRACEBACK_ENV}=1 shows the traceback)", file=sys.stderr)
        return ExitCode.INTERNAL


def reported(outcome) -> int:
    """A command's outcome (summary() and exit_code) printed on stdout: its exit code."""
    print(outcome.summary())
    return outcome.exit_code


def pipeline_command(command: str, argv: list[str]) -> int:
    """run, watch and compare: own help, Beam's help, then the work at the process edge.

    Each command imports its module when called: `relabel schema` and the help never import Beam's runners.
    """
    from rollout_relabel.pipeline.flags import PARSERS
    from rollout_relabel.pipeline.parse import print_beam_help

    if "-h" in argv or "--help" in argv:
        PARSERS[command]().print_help()
        return ExitCode.OK
    if "--help-beam" in argv:
        print_beam_help(command)
        return ExitCode.OK
    topics = [arg[len("--help-"):] for arg in argv if arg.startswith("--help-")]
    from rollout_relabel.pipeline.flags import HELP_TOPICS, topic_help
    if topics and topics[0] in HELP_TOPICS:
        topic_help(command, topics[0]).print_help()
        return ExitCode.OK
    if "--help-rescoring" in argv:
        from rollout_relabel.pipeline.flags import rescoring_help
        rescoring_help(command).print_help()
        return ExitCode.OK
    return at_the_edge(command, lambda: _run_pipeline_command(command, argv))


def _run_pipeline_command(command: str, argv: list[str]) -> int:
    from rollout_relabel.pipeline.beam_internals import sample_states_often

    if command == "run":
        from rollout_relabel.pipeline.run import run as run_command
    elif command == "watch":
        from rollout_relabel.pipeline.watch import run_watch as run_command
    elif command == "backfill":
        from rollout_relabel.pipeline.backfill import backfill as run_command
    elif command == "difficulty":
        from rollout_relabel.pipeline.difficulty import difficulty as run_command
    else:
        from rollout_relabel.pipeline.compare import compare as run_command
    settle_heap()
    sample_states_often()  # this process's bundles end without waiting out Beam's sampling period
    return reported(run_command(argv))


def export_command(argv: list[str]) -> int:
    """export: plain Python, no Beam pipeline; its own help, then the work at the same process edge."""
    from rollout_relabel.pipeline.flags import export_parser

    if "-h" in argv or "--help" in argv:
        export_parser().print_help()
        return ExitCode.OK

    def work() -> int:
        from rollout_relabel.pipeline.export import export
        return reported(export(argv))

    return at_the_edge("export", work)


def settle_heap() -> None:
    """Once the modules are imported: what they allocated is kept out of every later collection
    (gc.freeze), and the collector is on again if entry() had turned it off."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def _print_schemas() -> int:
    from rollout_relabel import schemas
    print(schemas.describe())
    return ExitCode.OK


def _quiet(args) -> None:
    """A thread's uncaught exception, after an interrupt: said already, in one line."""


def _cause(error: BaseException) -> str:
    """The line a person needs: runners hand a worker's failure over as text holding its traceback, whose
    last `SomeError: message` line names the cause (for display only; exit codes never come from text)."""
    found = [line.strip() for line in str(error).splitlines() if CAUSE.match(line.strip())]
    cause = found[-1] if found else None
    while cause and CAUSE.match(cause.split(": ", 1)[-1]):  # "RuntimeError: OSError: ...": the inner one
        cause = cause.split(": ", 1)[1]
    return cause if cause else f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
