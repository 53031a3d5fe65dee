"""`python -m geodt ...` is the `geodt` command."""
from geodt.cli import main

raise SystemExit(main())
