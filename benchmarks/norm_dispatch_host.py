"""Host time of one call through a torch custom op, by how it is registered: vLLM's
``direct_register_custom_op`` (a schema and one kernel for every device: how infera-norm and vLLM register
their ops) against ``torch.library.custom_op`` (a Python wrapper around the same), each around a function that
does nothing, so only the dispatch is timed. It is what a compiled graph run outside CUDA graphs pays per norm
call on top of the kernel. CPU only: the time is Python's and the dispatcher's, on this machine's host.

    python benchmarks/norm_dispatch_host.py [--calls N] [--out DIR]
"""

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _results import arguments, describe_machine, results_dir, write_json  # noqa: E402


def _noop(x: torch.Tensor, weight: torch.Tensor, epsilon: float) -> None:
    """The in-place op's signature (``fused_add_rms_norm_`` writes into its inputs), doing nothing."""


def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from vllm.utils.torch_utils import direct_register_custom_op

    lib = torch.library.Library("infera_dispatch_probe", "FRAGMENT")
    direct_register_custom_op("direct", _noop, mutates_args=["x"], fake_impl=_noop, target_lib=lib,
                              dispatch_key="CompositeExplicitAutograd")
    wrapped = torch.library.custom_op("infera_dispatch_probe::wrapped", _noop, mutates_args=("x",))
    wrapped.register_fake(_noop)
    x, w = torch.randn(1, 4096, dtype=torch.bfloat16), torch.randn(4096, dtype=torch.bfloat16)
    calls = {"python function": _noop, "direct_register_custom_op": torch.ops.infera_dispatch_probe.direct,
             "torch.library.custom_op": torch.ops.infera_dispatch_probe.wrapped}
    us = {name: [] for name in calls}
    for _ in range(args.rounds):  # alternated rounds: the median of each
        for name, fn in calls.items():
            fn(x, w, 1e-6)
            start = time.perf_counter()
            for _ in range(args.calls):
                fn(x, w, 1e-6)
            us[name].append((time.perf_counter() - start) / args.calls * 1e6)
    rows = [{"registration": name, "us_per_call": statistics.median(v), "us_min": min(v), "us_max": max(v)}
            for name, v in us.items()]
    for r in rows:
        print(f"{r['registration']:28s} {r['us_per_call']:7.2f} us per call (rounds {r['us_min']:.2f}-"
              f"{r['us_max']:.2f})")
    machine = describe_machine()
    path = write_json(args.out or results_dir(machine), "norm_dispatch_host",
                      {"benchmark": "norm_dispatch_host", "machine": machine, "calls": args.calls,
                       "rounds": args.rounds, "rows": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
