"""The contracts between geodt's stages: file schemas, wire constants and shared config sections.

calibrate -> profile file -> simulator -> plan file -> real: the stages meet only in files, and
this package holds what both sides of each file must agree on, once:

- plan: plan.csv's columns, Plan/NodePlan, load_plan (the simulator writes plans, the executor runs them)
- wire: collectives, payload dtypes and their encoded sizes, averaging modes, model dtypes,
  the partitioned all-reduce's shares and the ring all-reduce formula
- scenario: the [model] and [diloco] sections both stages read, validated once
- sections: the [training], [network] and [simulation] sections, each key's default, doc and
  checks beside it; scenario_doc renders docs/DESIGN.md's lines for them
- config, errors, limits: building frozen dataclasses from TOML tables, FieldError / InputError,
  the limits on a scenario's sizes and names
- profile, netprofile: the calibration and network profile columns and their checked readers
- timeline: the columns of timeline.csv, summary.csv, trace.csv and validation.csv
- files (regular-file reader, file lock), toml (tomllib on every Python), cli (OneLineParser)

It imports none of calibrate, simulator, real or geodt, and never torch (tests/test_imports.py).
"""
