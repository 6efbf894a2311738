"""``infera-vllm`` command line: ``doctor`` and ``report`` (``harness`` for validation runs)."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="infera-vllm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    doc = sub.add_parser("doctor", help="versions, GPU family, every installed op's verdict, the switches")
    doc.add_argument("--model", metavar="PATH_OR_CONFIG", help="also say which layers of this model each op would take")
    doc.add_argument("--json", action="store_true")
    rep = sub.add_parser("report", help="merge the per-process coverage reports in DIR")
    rep.add_argument("dir")
    rep.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    if args.command == "doctor":
        from infera_vllm import doctor

        try:
            return doctor.main(args.model, args.json)
        except (FileNotFoundError, ValueError) as exc:  # a bad --model path or config
            print(f"infera-vllm doctor: {exc}", file=sys.stderr)
            return 2
    from infera_vllm import report

    try:
        merged = report.merge(report.load(args.dir))
    except (FileNotFoundError, ValueError) as exc:
        print(f"infera-vllm report: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(merged, indent=1) if args.json else report.render(merged))
    return 0
