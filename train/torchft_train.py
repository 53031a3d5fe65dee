"""One replica group of a geodt plan, trained with torchft's own DiLoCo (torch + torchft + transformers).

`geodt plan SCENARIO --strategy S --export torchft DIR` (geodt plan --export torchft) copies this script into DIR as
train_torchft.py, beside torchft_recorder.py and one replica-<node>.toml per replica group (each
value commented with where it came from); DIR/replica-<node>.sh runs `python train_torchft.py
replica-<node>.toml`. It imports nothing of geodt but the recorder (torch only), which writes
RUN_DIR/traces/<node>.csv for `geodt validate --trace RUN_DIR`.

The model is transformers' LlamaForCausalLM from the config's [model] (geodt's train/models.py builds
the same one), trained on random tokens from the seed (a schedule and a sync, not a corpus), on CPU
with torchft's ProcessGroupGloo (on GPUs, move the model and tokens to the device and use torchft's
ProcessGroupNCCL or ProcessGroupBabyNCCL instead). The
replica group is one process: a plan node of G devices runs its G × batch_size samples per inner
step as G accumulated micro-batches. Every replica starts from the same weights (the same seed), so
the first quorum needs no recovery (init_sync off).
"""
from __future__ import annotations

import argparse
import logging
import sys
from datetime import timedelta
from pathlib import Path

import torch
from torch.distributed import TCPStore
from torchft import Manager, ProcessGroupGloo
from torchft.local_sgd import DiLoCo
from transformers import LlamaConfig, LlamaForCausalLM

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torchft_recorder import RoundRecorder  # the file beside this script


def build_model(m: dict, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=m["vocab_size"], hidden_size=m["hidden_size"], intermediate_size=m["ffn_size"],
        num_hidden_layers=m["num_layers"], num_attention_heads=m["num_heads"],
        num_key_value_heads=m["num_kv_heads"], max_position_embeddings=max(m["seq_len"], 128),
        tie_word_embeddings=m["tie_embeddings"], rope_theta=m["rope_theta"], use_cache=False))


def fragments_of(model: LlamaForCausalLM, count: int) -> list[torch.nn.Module]:
    """Streaming DiLoCo's fragments: consecutive layers, the embedding with the first, norm and head
    with the last (one fragment: the whole model)."""
    if count == 1:
        return [model]
    inner = model.model
    layers = list(inner.layers)
    cuts = [round(len(layers) * p / count) for p in range(count + 1)]
    parts = [torch.nn.ModuleList(layers[cuts[p]:cuts[p + 1]]) for p in range(count)]
    parts[0].insert(0, inner.embed_tokens)
    parts[-1].extend([inner.norm, model.lm_head] if model.lm_head.weight is not inner.embed_tokens.weight
                     else [inner.norm])
    return parts


def make_manager(cfg: dict, pg: ProcessGroupGloo, store: TCPStore, model, inner) -> Manager:
    t, lh = cfg["timeouts"], cfg["lighthouse"]

    def state_dict():
        return {"model": model.state_dict(), "inner": inner.state_dict()}

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["inner"])

    return Manager(pg=pg, load_state_dict=load_state_dict, state_dict=state_dict,
                   min_replica_size=lh["min_replicas"], use_async_quorum=False,
                   timeout=timedelta(seconds=t["timeout_s"]), quorum_timeout=timedelta(seconds=t["quorum_timeout_s"]),
                   connect_timeout=timedelta(seconds=t["connect_timeout_s"]), rank=0, world_size=1,
                   store_addr=cfg["replica"]["host"], store_port=store.port, lighthouse_addr=lh["address"],
                   replica_id=cfg["replica"]["replica_id"], hostname=cfg["replica"]["host"], init_sync=False)


def train(cfg: dict, run_dir: Path) -> Path:
    rep, d, b, m, run = cfg["replica"], cfg["diloco"], cfg["batch"], cfg["model"], cfg["run"]
    torch.set_num_threads(run["threads"])
    model = build_model(m, run["seed"])
    model.train()
    inner = torch.optim.AdamW(model.parameters(), lr=d["inner_lr"], weight_decay=d["weight_decay"],
                              betas=tuple(d["betas"]))
    parts = fragments_of(model, d["num_fragments"])
    outer = [torch.optim.SGD(p.parameters(), lr=d["outer_lr"], momentum=d["outer_momentum"], nesterov=True)
             for p in parts]
    store = TCPStore(rep["host"], 0, is_master=True, wait_for_workers=False)
    pg = ProcessGroupGloo(timeout=timedelta(seconds=cfg["timeouts"]["process_group_timeout_s"]))
    manager = make_manager(cfg, pg, store, model, inner)
    emulate = cfg.get("emulate", {})
    rec = RoundRecorder(run_dir, rep["node"], run["strategy"], d["sync_every"], b["batch_size"], m["seq_len"],
                        devices=b["grad_accum"], fragments=d["num_fragments"], step_s=emulate.get("step_s"),
                        comm_s=emulate.get("comm_s"), time_scale=emulate.get("time_scale", 1.0))
    # every replica started and in one quorum before step 0 (not part of a round)
    manager.start_quorum(timeout=timedelta(seconds=cfg["timeouts"]["startup_timeout_s"]))
    rec.attach(manager, inner)
    rec.start()
    gen = torch.Generator().manual_seed(run["seed"] * 1000 + rep["index"])
    steps = run["rounds"] * d["sync_every"]
    try:
        with DiLoCo(manager, parts, inner, outer, sync_every=d["sync_every"],
                    fragment_sync_delay=d["fragment_sync_delay"], fragment_update_alpha=d["fragment_update_alpha"],
                    should_quantize=d["should_quantize"]):
            for step in range(steps):
                for group in inner.param_groups:  # linear warmup, then constant
                    group["lr"] = d["inner_lr"] * min(1.0, (step + 1) / max(1, d["warmup_steps"]))
                with rec.step():
                    inner.zero_grad()
                    for _ in range(b["grad_accum"]):
                        tokens = torch.randint(m["vocab_size"], (b["batch_size"], m["seq_len"]), generator=gen)
                        loss = model(input_ids=tokens, labels=tokens).loss / b["grad_accum"]
                        loss.backward()
                    rec.loss(loss.item() * b["grad_accum"])
                    inner.step()
                if (step + 1) % d["sync_every"] == 0:  # a round ended: say so (its row is in the recorder)
                    r = rec.rows[-1]
                    print(f"{rep['node']}: round {r['round']} compute {r['compute_s']:.3f} s idle {r['idle_s']:.3f} s "
                          f"comm {r['comm_s']:.3f} s loss {r['loss']:.3f}", flush=True)
    finally:  # the rounds done are written also when torchft raises (a quorum or a collective timed out)
        rec.close()
        manager.shutdown(wait=False)
    return rec.path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="replica-<node>.toml written by geodt plan --export torchft")
    parser.add_argument("--run-dir", help="where traces/<node>.csv goes (default: the config's [run] run_dir)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    path = Path(args.config)
    cfg = tomllib.loads(path.read_text(encoding="utf-8"))
    run_dir = Path(args.run_dir) if args.run_dir else path.parent / cfg["run"]["run_dir"]
    written = train(cfg, run_dir)
    print(f"{cfg['replica']['node']}: wrote {written}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
