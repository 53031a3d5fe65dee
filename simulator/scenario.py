"""Scenarios: the TOML file docs/DESIGN.md specifies, as frozen dataclasses, plus `--set` overrides.

`load_scenario(source, overrides)` takes a path or a built-in name (`paper`, `hetero-cpu`),
applies `key=value` overrides, validates everything and returns a `Scenario`. Any problem is
an InputError whose message names the file (or `--set`), the dotted key and what was wanted.
The sections both stages read are defined in formats/ ([model], [diloco]: formats/scenario.py;
[training], [network], [simulation]: formats/sections.py); this module adds [[nodes]], the
scenario itself and the loader.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import tomli_w

from facts.catalog import CatalogError, get_gpu
from facts.presets import ModelArch, PresetError, load_arch
from formats.config import as_table, build, coerce, require_choice
from formats.errors import FieldError, InputError, did_you_mean
from formats.files import read_regular_file
from formats.files import short as _short
from formats.limits import (
    MAX_GPUS_PER_TYPE,
    MAX_NODES,
    MAX_SCENARIO_BYTES,
    SEED_MAX,
    check_node_name,
    check_scenario_name,
)
from formats.scenario import DilocoConfig, ModelSection

# [training], [network] and [simulation]: one definition, shared with the executor (formats/sections.py).
from formats.sections import (
    REQUIRED,
    SCENARIO_TOP_KEYS,
    NetworkConfig,
    SimulationConfig,
    TrainingConfig,
    check_keys,
    choices_of,
    key,
    positive,
)
from formats.toml import tomllib
from simulator.models.drift import DriftEvent
from simulator.models.outage import Outage

BUILTIN_DIR = Path(__file__).with_name("scenarios")


@dataclass(frozen=True)
class ModelConfig(ModelSection):
    """[model] (formats/scenario.py) plus the architecture its preset resolves to."""

    arch: ModelArch | None = field(default=None, init=False, compare=False, repr=False)

    def resolve(self, base_dir: Path | None) -> None:
        if self.preset is not None:
            try:
                object.__setattr__(self, "arch", load_arch(self.preset, base_dir))
            except PresetError as exc:
                raise FieldError("preset", str(exc)) from None

    @property
    def param_count(self) -> float:
        return float(self.params) if self.params is not None else float(self.arch.params)

    @property
    def train_flops_per_token(self) -> float:
        """Given `flops_per_token`, else the preset's, else the 6·N rule of thumb."""
        if self.flops_per_token is not None:
            return self.flops_per_token
        if self.arch is not None:
            return self.arch.train_flops_per_token(self.seq_len)
        return 6.0 * self.param_count


def _node_name(node: Any, name: str) -> None:
    problem = check_node_name(getattr(node, name))
    if problem:
        raise FieldError(name, problem)


def _gpus(node: Any, name: str) -> None:
    if not node.gpus:
        raise FieldError(name, 'expected at least one GPU, like { "a30" = 4 }')
    for gpu, count in node.gpus.items():
        try:
            get_gpu(gpu)
        except CatalogError as exc:
            raise FieldError(f"{name}.{gpu}", str(exc)) from None
        if not 1 <= count <= MAX_GPUS_PER_TYPE:
            raise FieldError(f"{name}.{gpu}", f"expected a positive GPU count (at most {MAX_GPUS_PER_TYPE}), "
                             f"got {count!r}")


def _quota(node: Any, name: str) -> None:
    quota = getattr(node, name)
    if quota is not None and not 0.01 <= quota <= 1024:
        raise FieldError(name, f"expected a share of a core in [0.01, 1024], got {quota!r}")


def _cores(node: Any, name: str) -> None:
    cores = getattr(node, name)
    if cores is not None and (not cores or any(c < 0 or c > 4095 for c in cores)):
        raise FieldError(name, f"expected a non-empty list of core indices, got {list(cores)!r}")


def _training_choice(node: Any, name: str) -> None:
    """[training]'s values, for this node alone."""
    if getattr(node, name) is not None:
        require_choice(node, name, choices_of(TrainingConfig, name))


@dataclass(frozen=True)
class NodeConfig:
    """[[nodes]]: one site's devices; its step time in order of precedence: step_time_s, profile,
    the GPU catalog's estimate."""

    name: str = key(REQUIRED, "unique; names the node's rows, files and processes", _node_name, example="node1")
    gpus: dict[str, int] = key(REQUIRED, "GPU type (`geodt catalog`) = count", _gpus,
                               example={"rtx-2080-ti": 4})
    step_time_s: float | None = key(None, "the time at the baseline batch (what-ifs, inferring from papers)",
                                    positive, bounds=(1e-7, 1e6), example=0.0296)
    profile: tuple[str, ...] | None = key(None, "a calibration profile (path relative to this file), or a list, "
                                          "one per GPU type", example="profiles/n1.csv")
    uplink_gbps: float | None = key(None, "this node's own WAN link, if slower than [network]", positive,
                                    bounds=(1e-6, 1e6), example=0.5)
    intra_node_gbps: float | None = key(None, "the link between the node's own GPUs (default: the catalog's, "
                                        "NVLink for SXM parts, 100 for PCIe cards)", positive,
                                        bounds=(1e-3, 1e6), example=100)
    # Real limits for CPU devices (the executor applies them to each of the node's processes;
    # profiles for such a node must be measured under the same limits).
    cpu_quota: float | None = key(None, "CPU devices: each device process limited to this share of a core "
                                  "(cgroup); on a shared machine the quota sets its speed", _quota, example=0.6)
    cpu_cores: tuple[int, ...] | None = key(None, "CPU devices: cores for the node's processes (device j: "
                                            "cores[j::G])", _cores, example=[0, 1])
    sharding: str | None = key(None, "this node's own sharding ([training]'s otherwise); auto: the least that "
                               "holds the baseline batch", _training_choice, example="fsdp")
    activation_checkpointing: str | None = key(None, "this node's own activation_checkpointing ([training]'s "
                                               "otherwise)", _training_choice, example="full")
    drift: tuple[DriftEvent, ...] | None = key(None, "how the node's speed changes over the run: step-time "
                                               "multipliers per round (\"Drift\" below)",
                                               example=[{"kind": "step", "round": 10, "factor": 1.2}])
    outage: Outage | None = key(None, "lost at round 5's start for 3 rounds ([simulation] on_node_loss)",
                                example={"round": 5, "rounds": 3})

    def __post_init__(self) -> None:
        check_keys(self)

    @property
    def gpu_count(self) -> int:
        return sum(self.gpus.values())


@dataclass(frozen=True)
class Scenario:
    name: str
    nodes: tuple[NodeConfig, ...]
    seed: int = 0
    model: ModelConfig = field(default_factory=lambda: ModelConfig(preset="llama-150m"))
    training: TrainingConfig = field(default_factory=TrainingConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    diloco: DilocoConfig = field(default_factory=DilocoConfig)
    simulation: SimulationConfig = field(default_factory=SimulationConfig)
    source: str = field(default="", compare=False)
    # The loaded network profile (NetworkModel); an init field so that dataclasses.replace keeps it.
    network_model: Any = field(default=None, compare=False, repr=False)

    @property
    def base_dir(self) -> Path | None:
        return Path(self.source).parent if self.source else None

    def to_table(self) -> dict:
        table = {"name": self.name, "seed": self.seed}
        for section in ("model", "training", "network", "diloco", "simulation"):
            table[section] = as_table(getattr(self, section))
        table["nodes"] = []
        for node in self.nodes:
            row = as_table(node)
            if node.profile is not None:  # absolute, so the resolved file works from anywhere
                row["profile"] = [str(self.resolve_path(p)) for p in node.profile]
            table["nodes"].append(row)
        if self.network.profile is not None:
            table["network"]["profile"] = str(self.resolve_path(self.network.profile))
        if self.training.convergence_profile is not None:
            table["training"]["convergence_profile"] = str(self.resolve_path(self.training.convergence_profile))
        if self.model.preset is not None and self.model.preset.endswith(".json"):
            table["model"]["preset"] = str(self.resolve_path(self.model.preset))
        return table

    def to_toml(self) -> str:
        """The fully resolved scenario: every key written, so it reproduces this run alone."""
        return f"# resolved from {self.source}\n" + tomli_w.dumps(self.to_table())

    def resolve_path(self, path: str) -> Path:
        p = Path(path)
        return p if p.is_absolute() or self.base_dir is None else (self.base_dir / p).resolve()

    def node(self, name: str) -> NodeConfig:
        return next(n for n in self.nodes if n.name == name)


def builtin_names() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.toml"))


def path_is_file(path: Path) -> bool:
    """Path.is_file without the OSError a too-long name raises."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def _read_source(source: str) -> tuple[dict, str]:
    path = Path(source)
    try:
        exists = os.path.lexists(path)
    except ValueError:  # an embedded NUL
        exists = False
    if not exists and path.suffix != ".toml" and "/" not in source:
        if source not in builtin_names():
            raise InputError(f"{_short(source)}: no such scenario file or built-in scenario; "
                             f"expected a path or one of {', '.join(builtin_names())}")
        path = BUILTIN_DIR / f"{source}.toml"
    try:
        data = read_regular_file(path, "a scenario TOML file", MAX_SCENARIO_BYTES, InputError, "scenario file")
    except InputError as exc:
        raise InputError(str(exc).replace(_short(path), _short(source), 1)) from None
    try:
        text = data.decode("utf-8-sig")  # an editor's byte-order mark is not a TOML statement
    except UnicodeDecodeError as exc:
        raise InputError(f"{_short(source)}: cannot read scenario file "
                         f"(not UTF-8: {exc.reason} at byte {exc.start})") from None
    try:
        return tomllib.loads(text), str(path.resolve())
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{_short(source)}: (TOML syntax): expected valid TOML, {exc}") from None
    except RecursionError:
        raise InputError(f"{_short(source)}: (TOML syntax): nested too deeply; expected a scenario TOML") from None


def _parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise InputError(f"--set {text}: expected key=value, like training.rounds=20")
    key, raw = text.split("=", 1)
    path = key.strip().split(".")
    if not all(path):
        raise InputError(f"--set {text}: expected a dotted key like network.bandwidth_gbps")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word such as fp16 or ring
    return path, value


def _is_path_key(path: list[str], value: Any) -> bool:
    """The keys whose value names a file (the ones to_table writes absolute)."""
    if path[0] == "nodes":
        return path[-1] == "profile"
    key = ".".join(path)
    return key in {"network.profile", "training.convergence_profile"} or (
        key == "model.preset" and isinstance(value, str) and value.endswith(".json"))


def _from_current_folder(path: list[str], value: Any) -> Any:
    """A path given by `--set` is the user's, typed in the current folder: made absolute here, so that
    it does not resolve against the scenario file's folder as a path written inside the file does
    (docs/DESIGN.md, "Scenario file")."""
    if not _is_path_key(path, value):
        return value
    if isinstance(value, str) and value and not os.path.isabs(value):
        return os.path.abspath(value)
    if isinstance(value, list):
        return [os.path.abspath(v) if isinstance(v, str) and v and not os.path.isabs(v) else v for v in value]
    return value


def apply_override(table: dict, path: list[str], value: Any, text: str) -> str:
    """Set table[path] = value and return the key as errors name it.

    Nodes are addressed by name (nodes.<name>.<key>); errors name them nodes[<index>].<key>."""
    where = table
    for i, part in enumerate(path[:-1]):
        if part == "nodes" and i == 0:
            nodes = table.get("nodes", [])
            if len(path) < 3:
                raise InputError(f"--set {text}: expected nodes.<node name>.<key>")
            name = path[1]
            match = [n for n in nodes if isinstance(n, dict) and n.get("name") == name]
            if not match:
                names = ", ".join(str(n.get("name")) for n in nodes if isinstance(n, dict))
                raise InputError(f"--set {text}: nodes.{name}: no such node; expected one of {names}")
            where = match[0]
            rest = path[2:]
            for j, sub in enumerate(rest[:-1]):
                where = where.setdefault(sub, {})
                if not isinstance(where, dict):
                    raise InputError(f"--set {text}: nodes.{name}.{'.'.join(rest[:j + 1])} is not a table")
            where[rest[-1]] = value
            return ".".join([f"nodes[{nodes.index(match[0])}]", *rest])
        where = where.setdefault(part, {})
        if not isinstance(where, dict):
            raise InputError(f"--set {text}: {'.'.join(path[:i + 1])} is not a table")
    where[path[-1]] = value
    return ".".join(path)


def load_scenario(source: str, overrides: list[str] | tuple[str, ...] = (), without_profiles: bool = False,
                  without_network_profile: bool = False) -> Scenario:
    """A validated Scenario from a file or built-in name, with `key=value` overrides applied.

    without_profiles: the nodes' profiles left out (`geodt calibrate scenario --scenario` makes them);
    without_network_profile: [network] profile left out too (calibrate scenario does not sync, and
    `geodt calibrate network` may not have written it yet)."""
    table, resolved = _read_source(source)
    if without_profiles and isinstance(table.get("nodes"), list):
        table["nodes"] = [{k: v for k, v in node.items() if k != "profile"} if isinstance(node, dict) else node
                          for node in table["nodes"]]
    if without_network_profile and isinstance(table.get("network"), dict):
        table["network"] = {k: v for k, v in table["network"].items() if k != "profile"}
    overridden = set()
    for text in overrides:
        path, value = _parse_override(text)
        overridden.add(apply_override(table, path, _from_current_folder(path, value), text))
    try:
        return _build_scenario(table, resolved)
    except FieldError as exc:
        key = exc.key
        origin = "--set" if any(key == k or key.startswith((k + ".", k + "[")) for k in overridden) else source
        raise InputError(f"{origin}: {key}: {exc.expected}") from None


def _build_scenario(table: dict, source: str) -> Scenario:
    table = dict(table)
    raw_nodes = table.pop("nodes", None)
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise FieldError("nodes", "expected at least one [[nodes]] table")
    if len(raw_nodes) > MAX_NODES:
        raise FieldError("nodes", f"{len(raw_nodes)} nodes; expected at most {MAX_NODES}")
    nodes = []
    for i, raw in enumerate(raw_nodes):
        if isinstance(raw, dict) and isinstance(raw.get("profile"), str):
            raw = {**raw, "profile": [raw["profile"]]}
        nodes.append(build(NodeConfig, raw, f"nodes[{i}]"))
    first: dict[str, int] = {}
    for i, node in enumerate(nodes):
        if first.setdefault(node.name, i) != i:
            raise FieldError(f"nodes[{i}].name", f"duplicate node name {node.name!r}; expected unique names")
    sections = {"model": ModelConfig, "training": TrainingConfig, "network": NetworkConfig,
                "diloco": DilocoConfig, "simulation": SimulationConfig}
    kwargs: dict[str, Any] = {}
    for name, value in table.items():
        if name in sections:
            kwargs[name] = build(sections[name], value, name)
        elif name in ("name", "seed"):
            kwargs[name] = coerce(value, str if name == "name" else int, name)
        else:
            raise FieldError(name, f"unknown key; expected one of {', '.join(SCENARIO_TOP_KEYS)}"
                             f"{did_you_mean(name, SCENARIO_TOP_KEYS)}")
    if "name" not in kwargs:
        raise FieldError("name", "missing; expected a scenario name")
    problem = check_scenario_name(kwargs["name"])
    if problem:
        raise FieldError("name", problem)
    if not 0 <= kwargs.get("seed", 0) <= SEED_MAX:
        raise FieldError("seed", f"expected an integer from 0 to {SEED_MAX}, got {kwargs['seed']!r}")
    kwargs.setdefault("model", ModelConfig(preset="llama-150m"))
    scenario = Scenario(nodes=tuple(nodes), source=source, **kwargs)
    _resolve_model(scenario)
    _check_fragments(scenario)
    _check_outages(scenario)
    _check_profiles(scenario)
    return _with_network_profile(scenario)


def _check_outages(scenario: Scenario) -> None:
    """Under on_node_loss = "continue" some node trains in every round: a round with every node away has
    nobody to average with (nothing would train, and every ratio against it would divide by zero)."""
    away = [n.outage for n in scenario.nodes]
    if scenario.simulation.on_node_loss != "continue" or any(o is None for o in away):
        return
    first = max(o.round for o in away)
    if first < min(o.round + o.rounds for o in away) and first < scenario.training.rounds:
        raise FieldError("nodes", f"every node's outage covers round {first}; expected at least one node "
                         "training in every round (shorten or move an outage)")


def _resolve_model(scenario: Scenario) -> None:
    try:
        scenario.model.resolve(scenario.base_dir)
    except FieldError as exc:
        raise FieldError(f"model.{exc.key}", exc.expected) from None


def _check_fragments(scenario: Scenario) -> None:
    """The [diloco] fragment keys against the baseline H and the model's layers (fragments group layers)."""
    d, steps = scenario.diloco, scenario.training.local_steps
    if d.fragments > steps:
        raise FieldError("diloco.fragments", f"expected at most training.local_steps ({steps}) fragments, "
                         f"got {d.fragments}")
    layers = scenario.model.arch.num_layers if scenario.model.arch is not None else None
    if layers is not None and d.fragments > layers:
        raise FieldError("diloco.fragments", f"expected at most the model's {layers} layers (a fragment is a "
                         f"group of layers), got {d.fragments}")
    if d.sync_delay_steps >= steps // d.fragments:
        raise FieldError("diloco.sync_delay_steps", f"expected 0 <= sync_delay_steps < training.local_steps // "
                         f"fragments = {steps // d.fragments}, got {d.sync_delay_steps}")


def _check_profiles(scenario: Scenario) -> None:
    for i, node in enumerate(scenario.nodes):
        for path in node.profile or ():
            if not path_is_file(scenario.resolve_path(path)):
                raise FieldError(f"nodes[{i}].profile", f"profile file {_short(path)!r} not found or not a regular "
                                 "file; expected a CSV from geodt calibrate")


def _with_network_profile(scenario: Scenario) -> Scenario:
    """The profile's ring fit replaces bandwidth_gbps and latency_ms; the model rides along."""
    if scenario.network.profile is None:
        return scenario
    # deferred: a network profile's fit (pandas) only when the scenario names one
    from formats.netprofile import NetProfileError  # noqa: PLC0415
    from simulator.models.netfit import read_network_profile  # noqa: PLC0415

    try:
        model = read_network_profile(scenario.resolve_path(scenario.network.profile))
    except NetProfileError as exc:
        raise FieldError("network.profile", str(exc)) from None
    if model.ring is not None:
        network = replace(scenario.network, bandwidth_gbps=model.ring.bandwidth_gbps, latency_ms=model.ring.latency_ms)
        scenario = replace(scenario, network=network)
        _resolve_model(scenario)
    object.__setattr__(scenario, "network_model", model)
    return scenario
