"""python -m simulator SCENARIO ... is `geodt simulate`; python -m simulator plan ... is `geodt plan`."""
import sys

from simulator.cli import plan_main, simulate_main

argv = sys.argv[1:]
raise SystemExit(plan_main(argv[1:]) if argv[:1] == ["plan"] else simulate_main(argv))
