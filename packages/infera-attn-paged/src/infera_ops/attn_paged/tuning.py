"""Per-GPU-family launch settings of the decode and prefill kernels, by head size: tile, warps, stages, split
policy and programmatic dependent launch. One JSON file per family in ``tuning/``: measured on that GPU by
``benchmarks/tune_attn_paged.py`` (sm90), or, for a family no one has measured, the launch sizes that
compile there without spilling (tests/test_attn_paged_compile.py checks every family's);
``INFERA_ATTN_PAGED_TUNING=path.json`` replaces it. A family without a file, or a head size its file does not
cover, uses ops.py's defaults.

File format: ``{"decode": {"64": {...}, "128": {...}}, "prefill": {...}, "measured": {...}}`` where each
decode entry holds ``block_n``, ``num_warps``, ``num_stages``, optionally ``reduce_warps`` (ops.LaunchConfig),
``programs_per_sm``, ``split_keys``, optionally ``max_splits`` (ops.SplitPolicy; default 64) and
``merge_in_kernel`` (default false), ``pdl``, and
optionally ``unsplit`` (``{"block_n", "num_warps", "num_stages"}`` for launches whose slice cap is 1,
ops.LaunchConfig.unsplit) and ``unsplit_by_group`` (``{"3": {...} or null, ...}``: per query heads per KV
head, that group's unsplit launch, null for none; other groups take ``unsplit``), and each prefill entry
(optional section) ``block_m`` (the fewest rows; at least the query heads per KV head), ``block_n``,
``num_warps``, ``num_stages``; a head size takes the entry of the
smallest listed size >= it (80 and 96 take 128's), none above the largest. ``declined_head_sizes`` (optional):
``{"256": "why"}``, head sizes the op does not serve on that family (every launch spills there): such layers stay
on vLLM's attention (``head-size-on-family``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from infera_ops.attn_paged.spec import SPEC
from infera_vllm import tuning_files
from infera_vllm.switches import op_value


class TuningError(ValueError):
    """A tuning file that cannot be used (named, with what is wrong)."""


@dataclass(frozen=True)
class DecodeSettings:
    block_n: int
    num_warps: int
    num_stages: int
    programs_per_sm: int
    split_keys: int
    pdl: bool = True
    reduce_warps: int = 4
    max_splits: int = 64
    unsplit: tuple[int, int, int] | None = None  # (block_n, num_warps, num_stages) where the slice cap is 1
    unsplit_by_group: tuple[tuple[int, tuple[int, int, int] | None], ...] = ()  # (G, launch or None) pairs
    merge_in_kernel: bool = False  # the last slice merges (ops.SplitPolicy.merge_in_kernel)


@dataclass(frozen=True)
class PrefillSettings:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def family_of(device) -> str:
    """sm90, gfx942, ... for a torch device; "cpu" for the CPU."""
    kind = getattr(device, "type", str(device).split(":")[0])
    return "cpu" if kind != "cuda" else _cuda_family(getattr(device, "index", None))


@functools.lru_cache(maxsize=None)
def _cuda_family(index) -> str:
    import torch

    if torch.version.hip:
        return torch.cuda.get_device_properties(index).gcnArchName.split(":")[0]
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm{major}{minor}"


def _unsplit(entry) -> tuple[int, int, int] | None:
    """A decode entry's ``unsplit`` launch: ``{"block_n", "num_warps", "num_stages"}`` (or null)."""
    if entry is None:
        return None
    if not isinstance(entry, dict) or set(entry) != {"block_n", "num_warps", "num_stages"}:
        raise ValueError(f"unsplit must hold exactly block_n, num_warps and num_stages, not {entry!r}")
    return int(entry["block_n"]), int(entry["num_warps"]), int(entry["num_stages"])


def _unsplit_by_group(entry) -> tuple[tuple[int, tuple[int, int, int] | None], ...]:
    """A decode entry's ``unsplit_by_group``: ``{"G": launch or null}``, as sorted (G, launch) pairs."""
    if not isinstance(entry, dict):
        raise ValueError(f"unsplit_by_group must map query heads per KV head to a launch, not {entry!r}")
    return tuple(sorted((int(g), _unsplit(launch)) for g, launch in entry.items()))


_NESTED = {"unsplit": _unsplit, "unsplit_by_group": _unsplit_by_group}


def _parse(text: str, source: str) -> tuple[dict[int, DecodeSettings], dict[int, PrefillSettings], dict[int, str]]:
    doc = tuning_files.document(text, source, TuningError)
    try:
        entries = doc["decode"]
        decode = {int(size): DecodeSettings(**{k: _NESTED[k](v) if k in _NESTED else v
                                               for k, v in entry.items() if k != "measured"})
                  for size, entry in entries.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise TuningError(f"{source}: not a decode tuning file ({exc})") from exc
    try:
        prefill = {int(size): PrefillSettings(**entry) for size, entry in doc.get("prefill", {}).items()}
    except (ValueError, TypeError, AttributeError) as exc:
        raise TuningError(f"{source}: bad prefill section ({exc})") from exc
    try:
        declined = {int(size): str(why) for size, why in doc.get("declined_head_sizes", {}).items()}
    except (ValueError, TypeError, AttributeError) as exc:
        raise TuningError(f"{source}: bad declined_head_sizes ({exc})") from exc
    return decode, prefill, declined


@functools.lru_cache(maxsize=None)
def _table(family: str, override: str) -> tuple[dict[int, DecodeSettings], dict[int, PrefillSettings], dict[int, str]]:
    """(decode, prefill, declined head sizes) by head size, cached per (family, switch value): the hot path
    reads the file once."""
    found = tuning_files.load("infera_ops.attn_paged", family, "INFERA_ATTN_PAGED_TUNING", override, _parse,
                              TuningError)
    return found or ({}, {}, {})


def load(family: str) -> dict[int, DecodeSettings]:
    """The family's decode table by head size (empty: not tuned); TuningError for a file that cannot be used
    (either section), which the op's activation turns into a decline before any call is served."""
    return _tables(family)[0]


def _tables(family: str) -> tuple[dict[int, DecodeSettings], dict[int, PrefillSettings], dict[int, str]]:
    return _table(family, op_value(SPEC, "INFERA_ATTN_PAGED_TUNING") or "")


def _by_head_size(table: dict, head_size: int):
    fits = [size for size in table if size >= head_size]
    return table[min(fits)] if fits else None


def decode_settings(head_size: int, device) -> DecodeSettings | None:
    """The family's settings for this head size, or None (not tuned: ops.py's defaults)."""
    return _by_head_size(load(family_of(device)), head_size)


def prefill_settings(head_size: int, device) -> PrefillSettings | None:
    """The family's prefill settings for this head size, or None (ops.prefill_config's defaults)."""
    return _by_head_size(_tables(family_of(device))[1], head_size)


def declined_head_size(head_size: int, family: str) -> str | None:
    """Why the family's file declines this head size (every launch spills there), or None."""
    return _tables(family)[2].get(head_size)
