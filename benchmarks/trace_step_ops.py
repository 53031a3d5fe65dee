"""The eager step's op sequence with each op's work, traced on CPU, as the torch-free table
(`facts/step_ops.csv`) the estimate's host/device pipeline reads.

simulator/models/estimate.py prices an eager GPU step as a two-stage pipeline: the host dispatches the
step's ops one after another (HOST_S_PER_OP each), the device runs each once it is dispatched and
the previous one is done. For that it needs the ops in dispatch order and each op's share of the
device's work. This script traces train/step.py's step (transformers' Llama, fused AdamW as
make_optimizer builds it on CUDA; fp16 with its GradScaler) under FakeTensorMode and a
TorchDispatchMode (every aten op of the second of two steps, views and casts included: each costs
the host its dispatch), and writes per op:

- `flops`: torch.utils.flop_counter's formula for the op where its registry has one (matmuls,
  attention; torch's CPU flash attention priced by the CUDA flash kernel's formula), else 0;
- `bytes`: the bytes the op reads (every tensor argument) and writes (its outputs that are not
  views, and the arguments its schema marks as written: in-place ops, fused AdamW's state);
  views move nothing.
Both as polynomials in the model's sizes: the trace runs a small model whose every size is a
distinct number (batch b, seq_len s, hidden h, kv size kv, heads nh, kv heads nkv, head size hd,
ffn f, vocabulary V), each tensor dimension is mapped back to its symbol, and the flop formulas
are evaluated on those symbols (sympy, torch's own dependency). Two traces (1 and 2 decoder
layers) split the sequence into `prefix`, `layer_fwd` (repeated per layer), `middle`,
`layer_bwd` (repeated), `suffix`; ops outside the layers whose work grows with the layer count
(clipping's and AdamW's lists) carry the symbol L. A third trace (3 layers) checks the split.
Every op's work is linear in b (checked). Rows per dtype and attention kind (`mha`, `gqa`:
grouped-query attention adds repeat_kv's ops).

    PYTHONPATH=. python benchmarks/trace_step_ops.py [--out facts/step_ops.csv] [--check]

--check: regenerate into memory and compare with the committed file. Both print the ops per step
of llama-150m and llama-1b per dtype (the host's dispatches; as the fact file gives them).
"""
from __future__ import annotations

import argparse
import csv
import difflib
import io
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import sympy
from tqdm import tqdm

from facts.presets import load_arch
from train.models import build_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# `prim.device` queries and the 0-d reads of AdamW's step counter reach no device: not dispatched.
NOT_DISPATCHED = {"prim.device", "aten._local_scalar_dense"}

OUT_PATH = Path(__file__).resolve().parents[1] / "facts" / "step_ops.csv"
COLUMNS = ("variant", "dtype", "segment", "per_layer", "op", "kind", "phase", "flops", "bytes")
# The traced model's sizes: every one distinct (and distinct from b·s) so a dimension names its symbol.
TRACE = {"mha": {"b": 5, "s": 17, "nh": 3, "nkv": 3, "hd": 22, "f": 47, "V": 101},
         "gqa": {"b": 5, "s": 17, "nh": 6, "nkv": 2, "hd": 22, "f": 47, "V": 101}}
# torch's CPU flash attention has no formula in the registry: the CUDA flash kernel's (same math).
CPU_ATTENTION = {"aten._scaled_dot_product_flash_attention_for_cpu": "aten._scaled_dot_product_flash_attention",
                 "aten._scaled_dot_product_flash_attention_for_cpu_backward":
                     "aten._scaled_dot_product_flash_attention_backward"}


PARAMS_PER_LAYER, PARAMS_FIXED = 9, 3  # a Llama layer's weight tensors; embedding, final norm, head


def symbols_of(sizes: dict, layers: int):
    """size → sympy expression for every dimension the traced step's tensors have (clipping stacks
    one norm per weight tensor: PARAMS_PER_LAYER·L + PARAMS_FIXED)."""
    b, s, nh, nkv, hd, f, V = sympy.symbols("b s nh nkv hd f V", positive=True)
    h, kv = sympy.Symbol("h", positive=True), sympy.Symbol("kv", positive=True)
    pairs = [(sizes["b"], b), (sizes["s"], s), (sizes["hd"], hd), (sizes["f"], f), (sizes["V"], V),
             (sizes["hd"] // 2, hd / 2), (sizes["nh"], nh), (sizes["nh"] * sizes["hd"], h),
             (sizes["b"] * sizes["s"], b * s), (sizes["s"] + 1, s + 1), (sizes["s"] - 1, s - 1), (1, sympy.Integer(1)),
             (PARAMS_PER_LAYER * layers + PARAMS_FIXED, PARAMS_PER_LAYER * sympy.Symbol("L", positive=True) + PARAMS_FIXED)]
    if sizes["nkv"] != sizes["nh"]:
        pairs += [(sizes["nkv"], nkv), (sizes["nkv"] * sizes["hd"], kv), (sizes["nh"] // sizes["nkv"], nh / nkv)]
    table = dict(pairs)
    if len(table) != len(pairs):
        raise SystemExit(f"trace_step_ops: two model sizes share a number in {sizes} ({layers} layers)")
    return table


def op_work(func, name: str, args, kwargs, out, shape, registry):
    """(op, kind, "", flops, bytes) of one dispatched op: views move nothing; bytes are the tensors
    read, the arguments written in place and the new outputs; FLOPs from torch's flop registry."""
    import torch
    from torch.utils._pytree import tree_flatten

    def numel(t):
        return sympy.Mul(*shape(t)) * t.element_size()

    tensors = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
    outputs = [x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor)]
    if func.is_view:
        return name, "", "", sympy.Integer(0), sympy.Integer(0)
    moved = sum((numel(t) for t in tensors), sympy.Integer(0))
    written = [a.name for a in func._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    for arg_name, value in zip((a.name for a in func._schema.arguments), args):
        if arg_name in written:
            moved += sum((numel(t) for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)), sympy.Integer(0))
    input_ids = {id(t) for t in tensors}
    moved += sum((numel(t) for t in outputs if id(t) not in input_ids), sympy.Integer(0))
    formula = registry.get(CPU_ATTENTION.get(name, name))
    flops = sympy.Integer(0)
    if formula is not None:
        shaped = [shape(x) if isinstance(x, torch.Tensor) else x for x in args]
        flops = sympy.expand(formula.__wrapped__(*shaped, out_shape=shape(tree_flatten(out)[0][0])))
    kind = "attention" if "attention" in name else ("matmul" if formula is not None else "")
    return name, kind, "", flops, sympy.expand(moved)


def traced_step(sizes: dict, layers: int, dtype: str, tracer) -> None:
    """Two train_steps of a model of `sizes` under FakeTensorMode, the second inside `tracer`."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.nn.utils import clip_grad

    from train.step import DEFAULT_BETAS, DEFAULT_LR, DEFAULT_WEIGHT_DECAY, make_scaler, train_step

    base = load_arch("llama-150m")
    arch = replace(base, hidden_size=sizes["nh"] * sizes["hd"], num_layers=layers, num_heads=sizes["nh"],
                   num_kv_heads=sizes["nkv"], ffn_size=sizes["f"], vocab_size=sizes["V"])
    # clip_grad_norm_ takes its foreach path on CUDA only: the step's ops as a GPU dispatches them
    clip_grad._has_foreach_support = lambda tensors, device: True
    with FakeTensorMode():
        model = build_model(arch, sizes["s"])
        model.train()
        if len(list(model.parameters())) != PARAMS_PER_LAYER * layers + PARAMS_FIXED:
            raise SystemExit("trace_step_ops: the model's weight tensors are not PARAMS_PER_LAYER·L + PARAMS_FIXED")
        optimizer = torch.optim.AdamW(model.parameters(), lr=DEFAULT_LR, weight_decay=DEFAULT_WEIGHT_DECAY,
                                      betas=DEFAULT_BETAS, fused=True)  # make_optimizer's on CUDA
        ids = torch.randint(0, arch.vocab_size, (sizes["b"], sizes["s"]))
        scaler = make_scaler("cpu", dtype)
        train_step(model, optimizer, ids, dtype, scaler)
        with tracer:
            train_step(model, optimizer, ids, dtype, scaler)


def trace(sizes: dict, layers: int, dtype: str) -> list[tuple[str, str, str, object, object]]:
    """(op, kind, phase, flops, bytes) per dispatched op of the second of two steps, work as sympy
    expressions; phase: forward, backward (the autograd engine's ops, from the first to the last),
    optimizer (everything after backward: clipping, unscaling, AdamW, zero_grad)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry

    table = symbols_of(sizes, layers)
    registry = {str(k): v for k, v in flop_registry.items()}

    def shape(t):
        for n in t.shape:
            if int(n) not in table:
                raise SystemExit(f"trace_step_ops: a dimension of size {int(n)} names no model size; extend symbols_of")
        return tuple(table[int(n)] for n in t.shape)

    class Tracer(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops, self.backward = [], []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            name = str(func.overloadpacket)
            if name in NOT_DISPATCHED:
                return out
            self.ops.append(op_work(func, name, args, kwargs, out, shape, registry))
            self.backward.append(torch._C._current_autograd_node() is not None)
            return out

    tracer = Tracer()
    traced_step(sizes, layers, dtype, tracer)
    first = tracer.backward.index(True)
    last = len(tracer.backward) - 1 - tracer.backward[::-1].index(True)
    phases = ["forward"] * first + ["backward"] * (last + 1 - first) + ["optimizer"] * (len(tracer.ops) - last - 1)
    return [(op[0], op[1], phase) + op[3:] for op, phase in zip(tracer.ops, phases)]


def key(op) -> tuple:
    return op[0], op[2], poly_text(op[3]), poly_text(op[4])


def split(one: list, two: list) -> list[tuple[bool, list]]:
    """The step as segments (per_layer, ops) from the traces of 1 and 2 layers: each block the
    2-layer trace inserts repeats an equal block of the 1-layer trace (a layer's forward, backward,
    its weights' norms...): that block is a per-layer segment, repeated L times; the other ops run
    once, their work in L from the two traces, w1 + (L − 1)(w2 − w1) (clipping's and AdamW's lists)."""
    keys1, keys2 = [key(o) for o in one], [key(o) for o in two]
    names1, names2 = [k[0] for k in keys1], [k[0] for k in keys2]
    layer_ranges, counterpart = [], {}
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, names1, names2, autojunk=False).get_opcodes():
        if tag == "insert":
            n = j2 - j1
            if keys1[i1 - n:i1] == keys2[j1:j2]:
                layer_ranges.append((i1 - n, i1))
            elif keys1[i1:i1 + n] == keys2[j1:j2]:
                layer_ranges.append((i1, i1 + n))
            else:
                raise SystemExit(f"trace_step_ops: the 2-layer step inserts {names2[j1]}... that repeat nothing")
        elif tag in ("equal", "replace") and i2 - i1 == j2 - j1:
            counterpart.update(zip(range(i1, i2), range(j1, j2)))
        else:
            raise SystemExit(f"trace_step_ops: the 1- and 2-layer steps differ beyond a repeated layer ({tag})")
    L = sympy.Symbol("L", positive=True)
    segments, at = [], 0
    for start, stop in sorted(layer_ranges) + [(len(one), len(one))]:
        once = [one[i][:3] + tuple(sympy.expand(a + (L - 1) * (c - a))
                                   for a, c in zip(one[i][3:], two[counterpart[i]][3:]))
                for i in range(at, start)]
        segments += [(False, once), (True, one[start:stop])]
        at = stop
    return [s for s in segments if s[1]]


def compose(segments: list, layers: int) -> list:
    """The op sequence of `layers` layers from the segments (L substituted)."""
    L = sympy.Symbol("L", positive=True)
    ops = [o for per_layer, seg in segments for o in seg * (layers if per_layer else 1)]
    return [o[:3] + tuple(sympy.expand(w.subs(L, layers)) for w in o[3:]) for o in ops]


def poly_text(expr) -> str:
    """An expanded polynomial as "coef*sym*sym + ..." (powers written out): what facts/step_ops.py parses."""
    expr = sympy.expand(expr)
    if expr == 0:
        return "0"
    terms = []
    for term in sympy.Add.make_args(expr):
        coef, rest = term.as_coeff_Mul()
        factors = []
        for factor in sympy.Mul.make_args(rest) if rest != 1 else ():
            base, power = factor.as_base_exp()
            if not (base.is_Symbol and power.is_Integer and power > 0):
                raise SystemExit(f"trace_step_ops: {expr} is not a polynomial in the model's sizes")
            factors += [str(base)] * int(power)
        if sympy.degree(term, sympy.Symbol("b", positive=True)) > 1:
            raise SystemExit(f"trace_step_ops: {expr} is not linear in the batch")
        terms.append("*".join([repr(float(coef)) if not coef.is_Integer else str(int(coef))] + sorted(factors)))
    return " + ".join(sorted(terms))


def table_rows() -> list[dict]:
    """Every row of facts/step_ops.csv (checks the split on a 3-layer trace)."""
    rows = []
    jobs = [(v, d) for v in TRACE for d in ("bf16", "fp16", "fp32")]
    for variant, dtype in tqdm(jobs, desc="trace_step_ops", unit="step"):
        sizes = TRACE[variant]
        segments = split(trace(sizes, 1, dtype), trace(sizes, 2, dtype))
        if [key(o) for o in compose(segments, 3)] != [key(o) for o in compose([(False, trace(sizes, 3, dtype))], 3)]:
            raise SystemExit(f"trace_step_ops: {variant} {dtype}: the segments do not rebuild the 3-layer step")
        for segment, (per_layer, ops) in enumerate(segments):
            for op, kind, phase, flops, moved in ops:
                rows.append({"variant": variant, "dtype": dtype, "segment": segment, "per_layer": int(per_layer),
                             "op": op, "kind": kind, "phase": phase, "flops": poly_text(flops), "bytes": poly_text(moved)})
    return rows


def print_counts() -> None:
    """Ops per step (and of them the optimizer's) of the presets, from facts/step_ops.csv as loaded."""
    from facts.step_ops import step_ops  # first loaded here: after the write
    print("dtype  llama-150m (optimizer)  llama-1b (optimizer)")
    for dtype in ("bf16", "fp16", "fp32"):
        counts = []
        for name in ("llama-150m", "llama-1b"):
            a = load_arch(name)
            ops = step_ops(a.hidden_size, a.num_layers, a.num_heads, a.num_kv_heads, a.ffn_size, a.vocab_size, 1024, dtype)
            counts.append(f"{ops.flops.shape[1]:10d} ({ops.optimizer_ops:3d})")
        print(f"{dtype:5s} {counts[0]:>23s} {counts[1]:>21s}")


def render(rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=OUT_PATH)
    p.add_argument("--check", action="store_true", help="compare with the committed file instead of writing")
    args = p.parse_args(argv)
    text = render(table_rows())
    if args.check:
        same = args.out.read_text(encoding="utf-8") == text
        print_counts()
        print(f"{args.out}: {'regenerates exactly' if same else 'DIFFERS from a fresh trace'}")
        return 0 if same else 1
    fd, tmp = tempfile.mkstemp(dir=args.out.parent, prefix=".step_ops.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, args.out)
    print(f"wrote {args.out} ({text.count(chr(10)) - 1} ops)")
    if args.out == OUT_PATH:
        print_counts()
    return 0


if __name__ == "__main__":
    sys.exit(main())
