"""real.wan: the shaped WAN (`--wan shaped`): network namespaces, shaped links, the liveness knock.

Imports nothing else of real/; only process/ (the launcher and each process) imports it.
"""
