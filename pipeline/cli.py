"""`relabel`: run | compare | watch | demo | schema (also `python -m pipeline`)."""
from __future__ import annotations

import argparse
import atexit
import os
import sys

EXIT_OK, EXIT_INTERNAL, EXIT_USAGE, EXIT_DEAD = 0, 1, 2, 3


def entry() -> None:
    """The console command: main(), then a quick exit.

    Tearing the interpreter down after a run (Beam's, gRPC's and pyarrow's objects) took 0.4-0.5 s
    and does nothing for the user: every output is committed by then. Exit handlers still run and
    streams are flushed; an exception escaping main() exits the usual way, with its traceback.
    """
    code = main()
    atexit._run_exitfuncs()  # noqa: SLF001 - what interpreter shutdown would run first
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    import logging
    logging.basicConfig(level=logging.ERROR)  # Beam's import-time warnings are not the user's business
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="relabel", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="relabel stored rollouts into Parquet training rows", add_help=False)
    sub.add_parser("watch", help="relabel rollout files as they land in a folder", add_help=False)
    demo = sub.add_parser("demo", help="generate a small realistic rollout set and relabel it")
    demo.add_argument("--workdir", default="demo_run")
    demo.add_argument("--seed", type=int, default=0)
    sub.add_parser("compare", help="compare two labelings of the same rollouts: report.json, report.md, plots",
                   add_help=False)
    sub.add_parser("schema", help="print the input, training-row and dead-letter schemas")
    if argv[:1] in (["run"], ["watch"]):
        return run_command(argv[1:], watch=argv[0] == "watch")
    if argv[:1] == ["compare"]:
        return compare_command(argv[1:])
    args = parser.parse_args(argv)
    if args.command == "schema":
        import schemas
        print(schemas.describe())
        return EXIT_OK
    from pipeline.demo import run_demo
    return run_demo(args.workdir, seed=args.seed)


def run_command(argv: list[str], watch: bool = False) -> int:
    if "-h" in argv or "--help" in argv:
        from pipeline.options import full_parser
        full_parser("watch" if watch else "run").print_help()
        return EXIT_OK
    from pipeline.runner import RunOutcome, run
    from pipeline.options import UsageError
    try:
        if watch:
            from pipeline.watch import run_watch
            outcome: RunOutcome = run_watch(argv)
        else:
            outcome = run(argv)
    except UsageError as error:
        print(f"relabel: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    print(outcome.summary())
    return outcome.exit_code


def compare_command(argv: list[str]) -> int:
    if "-h" in argv or "--help" in argv:
        from pipeline.options import full_parser
        full_parser("compare").print_help()
        return EXIT_OK
    from pipeline.compare import CompareOutcome, compare
    from pipeline.options import UsageError
    try:
        outcome: CompareOutcome = compare(argv)
    except UsageError as error:
        print(f"relabel: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    print(outcome.summary())
    return outcome.exit_code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
