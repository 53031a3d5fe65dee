"""geodt: the command line that composes calibrate/, simulator/ and real/."""
