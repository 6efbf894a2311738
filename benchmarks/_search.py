"""The tuners' search over launch parameters (tune_moe_decode.py)."""

from __future__ import annotations


def descend(cost, start: dict, space: dict, passes: int = 1) -> dict:
    """Coordinate descent: each parameter of ``space`` in turn takes the value with the lowest
    ``cost(params)`` (None: failed, wrong or not run: never chosen), the others held at the best so far;
    ``passes`` times over the parameters. Ties keep the first value listed."""
    best = dict(start)
    for _ in range(passes):
        for name, values in space.items():
            scored = [(c, p) for p in ({**best, name: v} for v in values) if (c := cost(p)) is not None]
            if scored:
                best = min(scored, key=lambda cp: cp[0])[1]
    return best
