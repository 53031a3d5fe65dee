"""`python -m calibrate ...` is `geodt calibrate device ...`."""
from calibrate.cli import calibrate_main

if __name__ == "__main__":
    raise SystemExit(calibrate_main())
