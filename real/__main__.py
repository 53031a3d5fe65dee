"""`python -m real`: the executor's command line (see real.cli)."""
from real.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
