"""``infera-vllm`` command line: ``doctor``, ``report``, ``tune`` and ``validate``."""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    except BrokenPipeError:  # `infera-vllm report DIR | head`: the reader is gone, so is the rest of the output
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # and no error at interpreter exit
        return 1


def _main(argv: list[str]) -> int:
    if argv[:1] == ["validate"]:  # its own parser (infera_vllm.validate), options before the models included
        from infera_vllm import validate

        return validate.main(argv[1:])
    parser = argparse.ArgumentParser(prog="infera-vllm", description=__doc__.replace("``", ""))  # no reST markup
    sub = parser.add_subparsers(dest="command", required=True)
    doc = sub.add_parser("doctor", help="versions, GPU family, every installed op's verdict, the switches")
    doc.add_argument("--model", metavar="PATH_OR_CONFIG", help="also say which layers of this model each op would take")
    doc.add_argument("--json", action="store_true")
    rep = sub.add_parser("report", help="merge the per-process coverage reports in DIR")
    rep.add_argument("dir")
    rep.add_argument("--json", action="store_true")
    tun = sub.add_parser("tune", help="run an installed op's offline tuner: tune OP ARGS... (OP's --help says more)")
    tun.add_argument("op", nargs="?", help="the op to tune (none: list the installed ops that have a tuner)")
    tun.add_argument("args", nargs=argparse.REMAINDER)
    sub.add_parser("validate", help="per model: each op's speed and agreement against the plugin off, and a "
                                    "verdict (validate --help says more)")
    args = parser.parse_args(argv)

    if args.command == "tune":
        return _tune(args.op, args.args)

    if args.command == "doctor":
        from infera_vllm import doctor

        try:
            return doctor.main(args.model, args.json)
        except (FileNotFoundError, ValueError) as exc:  # a bad --model path or config
            print(f"infera-vllm doctor: {exc}", file=sys.stderr)
            return 2
    from infera_vllm import report

    problems: list[tuple[str, str]] = []
    try:
        merged = report.merge(report.load(args.dir, problems))
    except (FileNotFoundError, ValueError) as exc:
        print(f"infera-vllm report: {exc}", file=sys.stderr)
        return 2
    for path, why in problems:  # merged without them; each named
        print(f"infera-vllm report: skipped {path}: {why}", file=sys.stderr)
    print(json.dumps(merged, indent=1) if args.json else report.render(merged))
    return 0


def _tune(op: str | None, args: list[str]) -> int:
    """Find the installed op by name and run the tuner its spec names (spec.tune)."""
    from infera_vllm import activation, discovery, switches

    found = {f.name: f for f in discovery.discover()}
    tunable = sorted(name for name, f in found.items() if f.spec is not None and f.spec.tune)
    if op is None:
        print("infera-vllm tune OP ARGS...: name the op to tune; installed ops with a tuner: "
              f"{', '.join(tunable) or 'none'} (infera-vllm tune OP --help says more)", file=sys.stderr)
        return 2
    short = [name for name in found if name.split("-")[0] == op]  # `tune linear` for linear-hipblaslt
    if op not in found and len(short) == 1:
        op = short[0]
    if op not in found or found[op].spec is None:
        names = {*found, *(name.split("-")[0] for name in found)}  # a typo of `linear` too
        problem = found[op].problem if op in found else ("no installed wheel provides it"
                                                          + switches.did_you_mean(op, names))
        print(f"infera-vllm tune: op {op!r}: {problem} (installed: {', '.join(sorted(found)) or 'none'})",
              file=sys.stderr)
        return 2
    spec = found[op].spec
    if not spec.tune:
        print(f"infera-vllm tune: op {op!r} has no tuner (ops with one: {', '.join(tunable) or 'none'})",
              file=sys.stderr)
        return 2
    return int(activation.load_callable(spec.tune)(args) or 0)
