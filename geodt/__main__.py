from geodt.cli import main

raise SystemExit(main())
