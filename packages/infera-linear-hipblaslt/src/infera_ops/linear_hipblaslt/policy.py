"""Which linear calls the skinny-M kernel takes, from the per-GPU-family tuning table: for each linear shape
(N, K, dtype, bias) measured on that GPU, which implementation serves each token-count bucket. Written offline
by ``infera-vllm tune linear`` (tune.py), shipped as ``tuning/<family>.json``; ``INFERA_LINEAR_TUNING=path.json``
replaces it.

Format::

    {"comment": "...", "entries": [
      {"n": 6144, "k": 4096, "dtype": "bfloat16", "bias": false,
       "buckets": [{"max_m": 8, "choice": "triton", "config": {...LaunchConfig...}, "speedup": 1.6},
                   {"max_m": 64, "choice": "default", "speedup": 1.0}]}]}

A call with M tokens takes the first bucket with ``M <= max_m``; past the last bucket, or for a shape not in
the table, vLLM's own GEMM serves (reasons ``above-table``, ``untuned``). ``choice`` is ``triton`` (the
skinny-M kernel with ``config``) or ``default`` (measured: nothing beat vLLM's GEMM there).
"""

from __future__ import annotations

from dataclasses import dataclass

from infera_ops.linear_hipblaslt.launch import LaunchConfig
from infera_ops.linear_hipblaslt.spec import SPEC
from infera_vllm import tuning_files
from infera_vllm.switches import op_value

CHOICES = ("triton", "default")
DTYPES = ("bfloat16", "float16")


class TableError(ValueError):
    """A tuning table or switch that cannot be used (the op declines ``bad-tuning`` with this message)."""


@dataclass(frozen=True)
class Bucket:
    max_m: int
    choice: str
    config: LaunchConfig | None


class Table:
    def __init__(self, entries: dict[tuple, tuple[Bucket, ...]], source: str):
        self.entries, self.source = entries, source

    def buckets(self, n: int, k: int, dtype: str, bias: bool) -> tuple[Bucket, ...] | None:
        return self.entries.get((n, k, dtype, bias))

    @staticmethod
    def choose(buckets: tuple[Bucket, ...], m: int) -> Bucket | None:
        """The bucket serving m tokens; None past the last one."""
        for bucket in buckets:
            if m <= bucket.max_m:
                return bucket
        return None

    def __len__(self) -> int:
        return len(self.entries)

    def digest(self) -> str:
        """A short hash of the entries (not the source name): part of vLLM's compile-cache key."""
        import hashlib

        rows = [(key, [(b.max_m, b.choice, b.config.as_dict() if b.config else None) for b in buckets])
                for key, buckets in sorted(self.entries.items())]
        return hashlib.sha256(repr(rows).encode()).hexdigest()[:12]


def parse(text: str, source: str) -> Table:
    doc = tuning_files.document(text, source, TableError)
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        raise TableError(f"{source}: needs an 'entries' list")
    entries = {}
    for i, e in enumerate(doc["entries"]):
        where = f"{source}: entries[{i}]"
        try:
            key = (int(e["n"]), int(e["k"]), str(e["dtype"]), bool(e["bias"]))
            raw = sorted(e["buckets"], key=lambda b: int(b["max_m"]))
            buckets = tuple(Bucket(int(b["max_m"]), b["choice"],
                                   LaunchConfig(**b["config"]) if b["choice"] == "triton" else None) for b in raw)
        except (KeyError, TypeError, ValueError) as exc:
            raise TableError(f"{where}: {exc!r}") from exc
        if key[2] not in DTYPES:
            raise TableError(f"{where}: dtype {key[2]!r} not in {DTYPES}")
        bad = [b.choice for b in buckets if b.choice not in CHOICES]
        if bad or not buckets:
            raise TableError(f"{where}: choices must be {CHOICES} and at least one bucket (got {bad or 'none'})")
        if key in entries:
            raise TableError(f"{where}: shape {key} listed twice")
        entries[key] = buckets
    return Table(entries, source)


def load(family: str) -> Table | None:
    """The family's table (None: no file, not tuned)."""
    return tuning_files.load("infera_ops.linear_hipblaslt", family, "INFERA_LINEAR_TUNING",
                             op_value(SPEC, "INFERA_LINEAR_TUNING"), parse, TableError)
