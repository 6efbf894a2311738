"""docs/vllm-seams.md lists exactly the vLLM symbols the installed op wheels declare (OpSpec.requires), with
their parameters and the vLLM versions each applies to."""

from pathlib import Path

import pytest

from infera_vllm import discovery

DOC = Path(__file__).resolve().parents[3] / "docs" / "vllm-seams.md"
OPS = {"attn-paged", "linear-hipblaslt", "moe-decode", "norm"}


def declared_rows() -> set[tuple[str, ...]]:
    return {(spec.name, symbol.module, symbol.attr, ", ".join(symbol.params) or "-", symbol.vllm or "all")
            for found in discovery.discover() if (spec := found.spec) is not None and spec.name in OPS
            for symbol in spec.requires}


def doc_rows(text: str) -> set[tuple[str, ...]]:
    rows = set()
    for line in text.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 5:
            rows.add(tuple(cells))
    return rows


def test_seam_doc_lists_every_required_symbol():
    if not DOC.is_file():
        pytest.skip(f"{DOC} is not here (tests run outside the repository)")
    declared = declared_rows()
    assert {row[0] for row in declared} == OPS, "every op wheel is installed in the test environment"
    documented = doc_rows(DOC.read_text())
    assert documented == declared, f"in the doc only: {documented - declared}; declared only: {declared - documented}"
