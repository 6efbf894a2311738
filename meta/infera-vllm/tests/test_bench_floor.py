"""The benchmarks' traffic floor (``benchmarks/_results.py``): its streaming kernel reads exactly the regions it
is given, tails included, under Triton's interpreter on the CPU. A floor that read fewer bytes than the kernel
it is compared with would flatter the kernel; one that read more would hide a loss."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.interpret
ROOT = Path(__file__).resolve().parents[3]
if not (ROOT / "benchmarks" / "_results.py").is_file():
    pytest.skip("benchmarks/ is not here (tests run outside the repository)", allow_module_level=True)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("Triton kernels on the CPU need TRITON_INTERPRET=1 from interpreter start (nox sets it)",
                allow_module_level=True)
pytest.importorskip("triton")
spec = importlib.util.spec_from_file_location("_results", ROOT / "benchmarks" / "_results.py")
results = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = results  # dataclasses look their module up there
spec.loader.exec_module(results)


def _weights(*shape, seed):
    # positive, so that a region read twice or one read that was not asked for moves the sum
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=gen) + 0.5).to(DEVICE, torch.bfloat16)


@pytest.mark.parametrize("programs, block", [(1, 16), (5, 16), (3, 64), (64, 32)])
def test_two_segments_read_their_regions_once(programs, block):
    w13, w2 = _weights(10, 6, 37, seed=0), _weights(10, 37, 3, seed=1)  # regions of 222 and 111: ragged tails
    ids = torch.tensor([7, 2, 9], dtype=torch.int32, device=DEVICE)
    part = results.stream_regions([(w13, ids, 6 * 37), (w2, ids, 37 * 3)], programs, block)
    want = w13[ids.long()].float().sum() + w2[ids.long()].float().sum()
    assert part.shape == (programs,)
    assert part.sum().item() == pytest.approx(want.item(), rel=1e-5)


def test_one_segment_reads_only_its_regions():
    x = _weights(12, 50, seed=2)
    ids = torch.tensor([11, 0, 4, 5], dtype=torch.int32, device=DEVICE)
    part = results.stream_regions([(x, ids, 50)], programs=7, block=16)
    assert part.sum().item() == pytest.approx(x[ids.long()].float().sum().item(), rel=1e-5)


def test_attention_floor_reads_every_page_of_the_case_once():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    bench = pytest.importorskip("bench_attn_paged")
    case = bench.make_case("t", 4, 2, 16, 3, 70, device=torch.device(DEVICE), copies=2, block_size=16)
    calls = case.stream_floor_calls()
    assert len(calls) == 2 and all(len(launches) == 1 for launches in calls)  # one launch per KV copy
    for kv, launches in zip(case.kvs, calls):
        kv.copy_(torch.rand(kv.shape, device=kv.device) + 0.5)  # positive, in place: the views keep their strides
        got = sum(results.stream_regions(launch, programs=4, block=32).sum().item() for launch in launches)
        assert got == pytest.approx(kv.float().sum().item(), rel=1e-5)  # every block is in the table once
    per = calls[0][0][0][2] * case.kvs[0].element_size()
    assert case.block_table.numel() * per == case.kv_bytes * (-(-70 // 16) * 16) / 70  # whole pages of K and V
