"""Training data for the executor: a seeded synthetic Markov-chain corpus, real text, or a file.

Synthetic: a first-order Markov chain over `states` tokens of the vocabulary, each state with
`branching` successors (one of them the next state, so the chain is irreducible). Every
sequence starts from the stationary distribution, so each next-token prediction has the
chain's entropy rate H = Σ_s π(s)·H(P(s,·)) as its best achievable loss (nats/token): the
executor prints it, and a learning model approaches it. Samples are generated in blocks of
`BLOCK` sequences from a generator seeded by (seed, shard, block), so a shard is a
deterministic function of its position (resumable) and shards never share a stream.

Real text (`--data python-stdlib`): the Python standard library's own sources, which every
machine that runs geodt has, as bytes (tokens 0..255: a byte-level tokenizer). The files in
name order, cut into CORPUS_BLOCK-byte blocks put in a seeded order, so that every node's shard
holds code of every kind (in name order one node would read only `_pydecimal.py`).
`corpus_digest` names the exact bytes (Python versions ship different sources).

File: `.npy` (an integer token array) or anything else as raw bytes (tokens 0..255). The
array is cut into one contiguous slice per shard; a shard yields consecutive windows of
seq_len tokens and wraps around at its end (another epoch).

Either way, `batch(position, n)` returns an (n, seq_len) int64 tensor of the samples
position .. position+n-1 of the shard; the caller keeps the position (checkpointed).
"""
from __future__ import annotations

import hashlib
import io
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.lib import format as npy

from formats.files import read_regular_file

BLOCK = 256  # sequences generated together (vectorised over rows, looped over positions)
STDLIB_CORPUS = "python-stdlib"  # --data's name for the standard library's sources
CORPUS_BLOCK = 512  # bytes kept together when the stdlib corpus is put in its seeded order
# A --data file is read whole into every node's memory: past 4 GiB, a corpus for a run on one machine
# is not what was meant (or a disk image); numpy's own default bound for a .npy header.
MAX_CORPUS_BYTES = 4 << 30
NPY_MAX_HEADER_BYTES = 10_000


class DataError(ValueError):
    """An unreadable or unsuitable --data file; str() names the file and the problem."""


@dataclass(frozen=True)
class MarkovChain:
    successors: np.ndarray    # (states, branching) int64 token ids
    cum_probs: np.ndarray     # (states, branching) cumulative transition probabilities
    stationary: np.ndarray    # (states,) stationary distribution

    @property
    def states(self) -> int:
        return self.successors.shape[0]

    def entropy_rate(self) -> float:
        """H = Σ_s π(s) H(P(s,·)) in nats per token: the best achievable mean loss."""
        probs = np.diff(self.cum_probs, prepend=0.0, axis=1)
        row_h = -(probs * np.log(np.where(probs > 0, probs, 1.0))).sum(axis=1)
        return float((self.stationary * row_h).sum())


def make_chain(seed: int, vocab_size: int, states: int = 256, branching: int = 4) -> MarkovChain:
    states = min(states, vocab_size)
    branching = min(branching, states)
    rng = np.random.default_rng([seed, 0x6D61726B])  # "mark": a stream of its own
    successors = np.empty((states, branching), dtype=np.int64)
    for s in range(states):
        others = rng.choice(np.delete(np.arange(states), (s + 1) % states), branching - 1, replace=False)
        successors[s] = np.concatenate([[(s + 1) % states], others])
    probs = rng.dirichlet(np.ones(branching), size=states)
    cum = np.cumsum(probs, axis=1)
    cum[:, -1] = 1.0
    dense = np.zeros((states, states))
    np.add.at(dense, (np.repeat(np.arange(states), branching), successors.ravel()), probs.ravel())
    # The lazy chain (P + I) / 2 has the same stationary distribution and is aperiodic.
    lazy = 0.5 * (dense + np.eye(states))
    pi = np.full(states, 1.0 / states)
    for _ in range(10_000):
        nxt = pi @ lazy
        if np.abs(nxt - pi).sum() < 1e-13:
            pi = nxt
            break
        pi = nxt
    return MarkovChain(successors, cum, pi / pi.sum())


class SyntheticShard:
    """Shard `shard` of the Markov corpus: block b of it is seeded by (seed, shard, b)."""

    def __init__(self, chain: MarkovChain, seq_len: int, seed: int, shard: int):
        self.chain, self.seq_len, self.seed, self.shard = chain, seq_len, seed, shard
        self._cum_pi = np.cumsum(chain.stationary)
        self._cache: dict[int, np.ndarray] = {}

    def _block(self, b: int) -> np.ndarray:
        if b not in self._cache:
            rng = np.random.default_rng([self.seed, self.shard, b])
            u = rng.random((self.seq_len, BLOCK))
            out = np.empty((BLOCK, self.seq_len), dtype=np.int64)
            cur = np.minimum(np.searchsorted(self._cum_pi, u[0], side="right"), self.chain.states - 1)
            out[:, 0] = cur
            for t in range(1, self.seq_len):
                pick = (u[t][:, None] > self.chain.cum_probs[cur]).sum(axis=1)
                cur = self.chain.successors[cur, np.minimum(pick, self.chain.successors.shape[1] - 1)]
                out[:, t] = cur
            self._cache = {b: out}  # one block at a time: reads are sequential
        return self._cache[b]

    def batch(self, position: int, n: int):
        # deferred: torch; geodt run's checks and calibrate convergence read the corpus without it
        import torch  # noqa: PLC0415

        rows = [self._block(i // BLOCK)[i % BLOCK] for i in range(position, position + n)]
        return torch.from_numpy(np.stack(rows))


class ArrayShard:
    """Consecutive seq_len windows of one contiguous slice of a token array (wrapping)."""

    def __init__(self, tokens: np.ndarray, seq_len: int, shard: int, shards: int, source: str):
        size = len(tokens) // shards
        self.tokens = tokens[shard * size:(shard + 1) * size]
        self.seq_len = seq_len
        self.windows = len(self.tokens) // seq_len
        if self.windows < 1:
            raise DataError(f"{source}: {len(tokens)} tokens make shards of {size}, fewer than "
                            f"seq_len={seq_len} per node; expected at least {seq_len * shards} tokens")

    def batch(self, position: int, n: int):
        # deferred: torch; geodt run's checks and calibrate convergence read the corpus without it
        import torch  # noqa: PLC0415

        idx = (np.arange(position, position + n) % self.windows)[:, None] * self.seq_len + np.arange(self.seq_len)
        return torch.from_numpy(self.tokens[idx].astype(np.int64))


def stdlib_corpus() -> np.ndarray:
    """The standard library's top-level *.py sources as bytes, in the seeded block order above."""
    root = Path(sysconfig.get_paths()["stdlib"])
    data = b"".join(p.read_bytes() for p in sorted(root.glob("*.py")))
    blocks = len(data) // CORPUS_BLOCK
    tokens = np.frombuffer(data[:blocks * CORPUS_BLOCK], dtype=np.uint8).reshape(blocks, CORPUS_BLOCK)
    order = np.random.default_rng(0x5354444C).permutation(blocks)  # "STDL": a stream of its own
    return np.ascontiguousarray(tokens[order].reshape(-1))


def corpus_digest(data_path: str | None) -> str:
    """What a run trained on, in a few words: `markov`, `python-stdlib:<sha256 prefix>` or the file's."""
    if data_path is None:
        return "markov"
    if data_path == STDLIB_CORPUS and not Path(data_path).exists():
        return f"{STDLIB_CORPUS}:{hashlib.sha256(stdlib_corpus().tobytes()).hexdigest()[:12]}"
    if not Path(data_path).is_file():  # a FIFO or a device would block the read; the executor refuses it
        return f"file:{data_path} (not a regular file)"
    return f"file:{hashlib.sha256(Path(data_path).read_bytes()).hexdigest()[:12]}"


def load_tokens(path: str | Path, vocab_size: int) -> np.ndarray:
    """A .npy integer array, or the file's bytes (python-stdlib: the standard library's sources,
    where no file of that name exists); checked against the model's vocabulary. A FIFO or a device
    (/dev/zero, /dev/urandom) would block or never end the read, a file past MAX_CORPUS_BYTES fill
    memory: both refused from os.stat before the file is opened."""
    if str(path) == STDLIB_CORPUS and not Path(path).exists():
        tokens = stdlib_corpus()
        if vocab_size < 256:
            raise DataError(f"{STDLIB_CORPUS}: bytes need a vocabulary of 256; the model has {vocab_size}")
        return tokens
    path = Path(path)
    what = "a token file (.npy: a 1-D integer array; else bytes)"
    data = read_regular_file(path, what, MAX_CORPUS_BYTES, DataError, "data file")
    tokens = _npy_tokens(path, data) if path.suffix == ".npy" else np.frombuffer(data, dtype=np.uint8)
    if tokens.size == 0:
        raise DataError(f"{path}: empty; expected tokens")
    if tokens.min() < 0 or tokens.max() >= vocab_size:
        raise DataError(f"{path}: token ids span {tokens.min()}..{tokens.max()}; expected 0..{vocab_size - 1} "
                        f"(the model's vocabulary)")
    return tokens


def _npy_tokens(path: Path, data: bytes) -> np.ndarray:
    """The 1-D integer array of a .npy file's bytes: its header read with numpy's own reader, bounded,
    and checked against the bytes that follow it before anything is allocated (a garbled header
    raises tokenize's or ast's errors, a huge shape MemoryError, in numpy's np.load)."""
    handle = io.BytesIO(data)
    try:
        version = npy.read_magic(handle)
        read_header = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
        shape, _, dtype = read_header(handle, max_header_size=NPY_MAX_HEADER_BYTES)
    except Exception as exc:  # numpy's header parser raises ValueError, SyntaxError, TokenError, MemoryError...
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise DataError(f"{path}: not a readable .npy header ({reason}); expected a 1-D integer token array") from None
    if len(shape) != 1 or not np.issubdtype(dtype, np.integer):
        raise DataError(f"{path}: expected a 1-D integer token array, got {dtype} {shape}")
    need, have = shape[0] * dtype.itemsize, len(data) - handle.tell()
    if need > have:
        raise DataError(f"{path}: its header promises {shape[0]} tokens ({need} bytes) but {have} bytes follow; "
                        "expected a complete .npy file")
    return np.frombuffer(data, dtype=dtype, count=shape[0], offset=handle.tell())


def make_shard(data_path: str | None, *, seed: int, vocab_size: int, seq_len: int, shard: int,
               shards: int, tokens: np.ndarray | None = None):
    """The shard a node reads. `tokens` lets a caller pass an already loaded array."""
    if data_path is None:
        return SyntheticShard(make_chain(seed, vocab_size), seq_len, seed, shard)
    if tokens is None:
        tokens = load_tokens(data_path, vocab_size)
    return ArrayShard(tokens, seq_len, shard, shards, str(data_path))
