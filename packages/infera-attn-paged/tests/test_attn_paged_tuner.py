"""benchmarks/tune_attn_paged.py's file-writing rules on the CPU (the sweep itself needs a CUDA GPU): the
per-group unsplit launches it derives from pass 5's times, and the decode entry it writes, read back by the
op's tuning loader as the same launches, and the sections a run did not tune kept with their own records."""

import importlib.util
import json
import os
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
if not (ROOT / "benchmarks" / "tune_attn_paged.py").is_file():
    pytest.skip("benchmarks/ is not here (tests run outside the repository)", allow_module_level=True)
sys.path.insert(0, str(ROOT / "benchmarks"))
spec = importlib.util.spec_from_file_location("tune_attn_paged", ROOT / "benchmarks" / "tune_attn_paged.py")
tune = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = tune  # dataclasses look their module up there
spec.loader.exec_module(tune)

from infera_ops.attn_paged import launch, policy  # noqa: E402

SMALL, LARGE = launch.LaunchConfig(64, 4, 2), launch.LaunchConfig(128, 4, 3)


def _entry(*us):
    return {"ok": True, "us": list(us)}


def test_each_group_takes_the_launch_fastest_on_its_own_rows():
    groups = [3, 3, 8, 8]  # the cap-1 rows' query heads per KV head, in row order
    measured = [(None, _entry(70, 60, 140, 255)),  # the split sizes
                (SMALL, _entry(53, 50, 150, 260)),  # fastest on the G = 3 rows
                (LARGE, _entry(62, 58, 132, 248))]  # the shared winner; fastest on the G = 8 rows
    assert tune.unsplit_by_group(LARGE, measured, groups) == ((3, SMALL),)
    measured[0] = (None, _entry(70, 60, 120, 240))  # the split sizes now fastest on G = 8
    assert tune.unsplit_by_group(LARGE, measured, groups) == ((3, SMALL), (8, None))
    assert tune.unsplit_by_group(LARGE, measured, [3, 3, 3, 3]) == ()  # one group: the shared launch is its own
    measured[1] = (SMALL, {"ok": False, "us": [1, 1, 1, 1]})  # a wrong candidate is never chosen
    assert dict(tune.unsplit_by_group(LARGE, measured, groups)).get(3) != SMALL


def test_written_entry_reads_back_as_the_same_launches():
    cfg = launch.LaunchConfig(64, 4, 3, 4, unsplit=LARGE, unsplit_by_group=((3, SMALL), (8, None)))
    entry = tune.table_entry(cfg, launch.SplitPolicy(4, 64, merge_max_slices=8, merge_max_registers=128), False)
    assert entry["unsplit_by_group"] == {"3": {"block_n": 64, "num_warps": 4, "num_stages": 2}, "8": None}
    decode, _, _ = policy._parse(json.dumps({"decode": {"128": entry}}), "test")
    settings = decode[128]
    assert settings.unsplit == (128, 4, 3) and settings.unsplit_by_group == ((3, (64, 4, 2)), (8, None))
    assert (settings.programs_per_sm, settings.split_keys, settings.merge_max_slices) == (4, 64, 8)
    assert settings.merge_max_registers == 128
    with mock.patch.object(policy, "decode_settings", lambda size, device: settings):
        assert launch.decode_defaults(128, torch.device("cpu"))[1] == launch.SplitPolicy(4, 64, 64, 8, 128)


def test_a_section_not_tuned_keeps_the_packaged_entry_and_its_record():
    packaged = {"decode": {"64": {"block_n": 64}}, "prefill": {"128": {"block_m": 64}},
                "measured": {"commit": "old", "prefill": {"commit": "older", "head_sizes": ["128"]}}}
    tuned = {"decode": {"64": {"block_n": 128}}, "measured": {"commit": "new"}}
    kept = tune.keep_untuned(tuned, packaged, no_decode=False)  # a decode-only run (--prefill-budget-s 0)
    assert kept["decode"] == {"64": {"block_n": 128}} and kept["prefill"] == {"128": {"block_m": 64}}
    assert kept["measured"] == {"commit": "new", "prefill": {"commit": "older", "head_sizes": ["128"]}}
    kept = tune.keep_untuned(tuned, packaged, no_decode=True)  # a prefill-only run starts from the packaged file
    assert kept["decode"] == packaged["decode"] and kept["measured"] == packaged["measured"]
    assert tune.keep_untuned(tuned, {"decode": {}}, no_decode=False)["measured"] == {"commit": "new"}


class _Compiled:
    def __init__(self, ptx):
        self.asm = {"ptx": ptx}


class _Resources:
    def __init__(self, problems):
        self._problems = problems

    def problems(self):
        return self._problems


def test_prefill_candidates_drop_spilling_launches_and_repeated_code(monkeypatch):
    # the compiler's answers stand in: 128 rows on 4 warps spill, and a fourth stage compiles to the third's code
    from infera_vllm import aot

    def compile_kernel(kernel, family, *, constexprs, num_warps, num_stages, **kwargs):
        assert family == "sm90" and constexprs["BLOCK_Q"] == constexprs["BLOCK_M"] // 4 and constexprs["D"] == 128
        stages = min(num_stages, 3)
        return _Compiled(f"// stages {num_stages}\nm{constexprs['BLOCK_M']} n{constexprs['BLOCK_N']} "
                         f"w{num_warps} s{stages}")

    def resources(compiled):
        spills = "m128" in compiled.asm["ptx"] and " w4 " in compiled.asm["ptx"]
        return _Resources(["spills"] if spills else [])

    monkeypatch.setattr(aot, "compile_kernel", compile_kernel)
    monkeypatch.setattr(aot, "resources", resources)
    monkeypatch.setattr(tune, "PREFILL_SPACE", dict(block_m=(2, 64, 128), block_n=(64,), num_warps=(4, 8),
                                                    num_stages=(2, 3, 4)))
    first = dict(block_m=64, block_n=64, num_warps=4, num_stages=3)
    kept, dropped = tune.prefill_candidates(launch, 128, 4, "sm90", first, threads=2)
    assert kept[0] == first  # the op's launch leads: the baseline the winner is compared with
    assert kept[1] == dict(block_m=128, block_n=64, num_warps=8, num_stages=2)  # then the largest tiles
    assert all(not (p["block_m"] == 128 and p["num_warps"] == 4) for p in kept)
    assert dropped["block_m=128 block_n=64 num_warps=4 num_stages=2"] == "spills"
    assert dropped["block_m=64 block_n=64 num_warps=4 num_stages=4"] == (
        "same compiled code as block_m=64 block_n=64 num_warps=4 num_stages=3")
    assert not any("block_m=2 " in key for key in dropped) and all(p["block_m"] >= 4 for p in kept)
    assert len(kept) + len(dropped) == 2 * 2 * 3  # every launch with at least G rows: timed or said why not


@pytest.mark.aot_compile
def test_prefill_candidates_compile_for_the_family(monkeypatch):
    # the real compiler on a few launches: each either kept (and then fits) or dropped with a reason
    from infera_vllm import aot

    if "sm90" not in aot.selected_families() or os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("compiles real kernels for sm90: runs in the session without Triton's interpreter")
    monkeypatch.setattr(tune, "PREFILL_SPACE", dict(block_m=(64, 128), block_n=(64,), num_warps=(4, 8),
                                                    num_stages=(2,)))
    first = dict(block_m=64, block_n=64, num_warps=4, num_stages=2)
    kept, dropped = tune.prefill_candidates(launch, 128, 4, "sm90", first, threads=2)
    assert kept[0] == first and len(kept) + len(dropped) == 4
    assert all(why for why in dropped.values())
