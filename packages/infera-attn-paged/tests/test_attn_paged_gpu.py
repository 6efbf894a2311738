"""GPU only: the kernels at real sizes, and CUDA-graph capture and replay the way vLLM drives a full decode
graph: captured once at a batch size with short lengths, replayed after the persistent length, block-table
and query buffers change in place (longer contexts, padded sequences)."""

from dataclasses import replace

import pytest
import torch

from infera_ops.attn_paged import launch
from infera_ops.attn_paged.reference import paged_decode_reference, paged_prefill_reference

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a GPU", allow_module_level=True)


def _cache(nblocks, page, Hkv, D):
    kv = torch.randn(nblocks, page, Hkv, 2 * D, dtype=torch.bfloat16, device="cuda").permute(0, 2, 1, 3)
    return kv.transpose(1, 2).split(D, dim=-1)


@pytest.mark.parametrize("B,ctx,Hq,Hkv,D", [(1, 8192, 32, 8, 128), (16, 2048, 64, 8, 64), (64, 1000, 9, 3, 64)])
def test_decode_real_sizes(B, ctx, Hq, Hkv, D):
    torch.manual_seed(0)
    pages = -(-ctx // 16)
    k, v = _cache(B * pages + 7, 16, Hkv, D)
    bt = torch.randperm(B * pages + 7, device="cuda")[: B * pages].view(B, pages).to(torch.int32)
    lens = torch.randint(ctx // 2, ctx + 1, (B,), dtype=torch.int32, device="cuda")
    q = torch.randn(B, Hq, D, dtype=torch.bfloat16, device="cuda")
    out = torch.full_like(q, float("nan"))
    launch.paged_decode(q, k, v, bt, lens, D ** -0.5, out)
    ref = paged_decode_reference(q, k, v, bt, lens, D ** -0.5)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


def test_prefill_real_sizes():
    torch.manual_seed(0)
    Hq, Hkv, D, qlens, ctxs = 32, 8, 128, [700, 513, 1, 64], [0, 1500, 3000, 90]
    lens = [c + n for c, n in zip(ctxs, qlens)]
    pages = -(-max(lens) // 16)
    k, v = _cache(len(lens) * pages, 16, Hkv, D)
    bt = torch.randperm(len(lens) * pages, device="cuda").view(len(lens), pages).to(torch.int32)
    q = torch.randn(sum(qlens), Hq, D, dtype=torch.bfloat16, device="cuda")
    qsl = torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out = torch.full_like(q, float("nan"))
    launch.paged_prefill(q, k, v, bt, seq_lens, qsl, D ** -0.5, out)
    ref = paged_prefill_reference(q, k, v, bt, seq_lens, qsl, D ** -0.5)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("merge_max_slices,merge_max_registers", [(0, 0), (launch.MAX_SPLITS, 0),
                                                                    (launch.MAX_SPLITS, 128)],
                         ids=["reduce-kernel", "merged-in-kernel", "merged-register-capped"])
@pytest.mark.parametrize("B,Hq,Hkv,D", [(4, 32, 8, 128), (3, 64, 8, 64)])
def test_cuda_graph_replays_with_new_lengths(B, Hq, Hkv, D, merge_max_slices, merge_max_registers):
    """One graph captured at lengths 1 (as vLLM captures) replays lengths from 1 to 40k: each sequence's
    slice count follows its length on the device (one slice at 1 key, the whole cap at 40k), the reduce
    merges exactly those, with programmatic dependent launch where the GPU has it; or the last slice of each
    (sequence, KV head) merges them in the main kernel, its counters back at zero after every replay (also
    compiled to at most 128 registers, ``merge_max_registers``: what spills must not change the result)."""
    torch.manual_seed(0)
    max_ctx = 40_000
    pages = -(-max_ctx // 16)
    k, v = _cache(B * pages, 16, Hkv, D)
    bt = torch.randperm(B * pages, device="cuda").view(B, pages).to(torch.int32)
    lens = torch.ones(B, dtype=torch.int32, device="cuda")  # vLLM captures with seq_lens filled with 1
    q = torch.randn(B, Hq, D, dtype=torch.bfloat16, device="cuda")
    out = torch.empty_like(q)
    cap = launch.split_cap(B, Hkv, q.device, head_size=D)
    policy = replace(launch.decode_defaults(D, q.device)[1], merge_max_slices=merge_max_slices,
                     merge_max_registers=merge_max_registers)
    ws = launch.Workspace(B * cap, Hq, D, "cuda")
    assert cap > 1  # the split path and its reduce are what the graph must hold
    launch.paged_decode(q, k, v, bt, lens, D ** -0.5, out, num_splits=cap, workspace=ws,
                        policy=policy)  # compile outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch.paged_decode(q, k, v, bt, lens, D ** -0.5, out, num_splits=cap, workspace=ws, policy=policy)
    seen = set()
    for new_lens in ([40_000, 17, 1000, 0][:B], [1, 2, 3, 129][:B], [2500, 39_999, 4095, 64][:B],
                     [128, 257, 12_345, 8][:B]):
        lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        q.copy_(torch.randn_like(q))
        bt.copy_(torch.randperm(B * pages, device="cuda").view(B, pages).to(torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        ref = paged_decode_reference(q, k, v, bt, lens, D ** -0.5)
        torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
        assert (ws.count == 0).all(), "in-kernel merge counters left non-zero"
        seen |= set(launch.slices_per_sequence(lens, cap, policy=policy).tolist())
    assert 1 in seen and cap in seen and len(seen) >= 3, seen  # one slice, some, and the whole cap


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability()[0] < 9,
                    reason="programmatic dependent launch needs Hopper or later")
def test_pdl_is_used_on_hopper():
    """On Hopper the GPU machine's Triton (3.6) offers launch_pdl, so the reduce is launched with it."""
    import triton

    assert launch.pdl_supported(torch.device("cuda")), f"Triton {triton.__version__} on sm90 should offer launch_pdl"
