"""Host time the moe-decode experts wrapper adds to a call it hands over to vLLM's experts: ``apply`` of the
wrapped class against the parent's own ``apply`` (a no-op stand-in, so only the wrapper's checks and counting are
timed), on a 32-token Qwen3-30B-A3B-shaped call that the policy hands over (above the served token counts).
CPU only: the time is Python's, on this machine's host.

    python benchmarks/moe_wrapper_host.py [--calls N] [--out DIR]
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _results import arguments, describe_machine, results_dir, write_json  # noqa: E402


def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    from infera_ops.moe_decode import policy, seam
    from infera_vllm import coverage, self_check

    class Parent:
        def apply(self, *args):
            return None

    tuned = policy.load("sm90")
    wrapped = seam._experts_class(Parent, tuned, coverage.CallCounts("moe-decode", policy.HANDOVERS),
                                  self_check.Checker("moe-decode", 3e-2), False, False)()
    M, E, H, I, K = 32, 128, 2048, 768, 8
    x = torch.randn(M, H, dtype=torch.bfloat16)
    w1 = torch.empty(E, 2 * I, H, dtype=torch.bfloat16, device="meta")
    w2 = torch.empty(E, H, I, dtype=torch.bfloat16, device="meta")
    call = (torch.empty_like(x), x, w1, w2, torch.rand(M, K), torch.zeros(M, K, dtype=torch.int32), "silu", E,
            None, None, None, None, None, None, False)
    us = {}
    for name, fn in (("parent", Parent().apply), ("wrapped", wrapped.apply)):
        for _ in range(1000):
            fn(*call)
        start = time.perf_counter()
        for _ in range(args.calls):
            fn(*call)
        us[name] = (time.perf_counter() - start) / args.calls * 1e6
    added = us["wrapped"] - us["parent"]
    print(f"parent apply {us['parent']:.2f} us, wrapped {us['wrapped']:.2f} us: the wrapper adds {added:.2f} us "
          f"per handed-over call ({added * 48 / 1e3:.3f} ms per 48-layer forward)")
    machine = describe_machine()
    path = write_json(args.out or results_dir(machine), "moe_wrapper_host",
                      {"benchmark": "moe_wrapper_host", "machine": machine, "calls": args.calls,
                       "call": {"tokens": M, "experts": E, "hidden": H, "inter": I, "topk": K},
                       "parent_us": us["parent"], "wrapped_us": us["wrapped"], "added_us": added})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
