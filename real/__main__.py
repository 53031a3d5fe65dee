"""`python -m real`: the executor's command line (see real.process.cli)."""
import os
import sys

from real.process.cli import main

if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's teardown of torch (seconds on a loaded machine, after the
    # run has ended and said so): every output is written and every child joined by now.
    sys.stdout.flush()
    sys.stderr.flush()
    launcher = sys.modules.get("real.process.launch")  # imported only where a run was launched
    if launcher is not None:
        launcher.remove_server_folder()  # what its exit finalizer would have removed
    os._exit(code)
