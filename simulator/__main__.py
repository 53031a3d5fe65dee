"""python -m simulator SCENARIO ... is `geodt simulate`; python -m simulator plan ... is `geodt plan`."""
import sys

from formats.stdout import closed_stdout_status
from simulator.cli import plan_main, simulate_main

argv = sys.argv[1:]
try:
    status = plan_main(argv[1:]) if argv[:1] == ["plan"] else simulate_main(argv)
    sys.stdout.flush()  # a reader gone shows here, not in the interpreter's flush at exit
except BrokenPipeError as exc:  # stdout's reader went away (| head): quiet, exit 141, as geodt's
    status = closed_stdout_status(exc)
raise SystemExit(status)
