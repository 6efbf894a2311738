"""tune_moe_decode.py's rules that need no GPU: a launch fastest on one expert shape alone is kept for that
shape only when it beats the forms' best there by the margin, an earlier run's recorded sweep answers for
the candidates it timed (and only those), and a baseline file's launches, per shape too, are candidates."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
if not (ROOT / "benchmarks" / "tune_moe_decode.py").is_file():
    pytest.skip("benchmarks/ is not here (tests run outside the repository)", allow_module_level=True)
pytest.importorskip("torch")
sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    spec = importlib.util.spec_from_file_location("tune_moe_decode", ROOT / "benchmarks" / "tune_moe_decode.py")
    tune = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = tune  # dataclasses look their module up there
    spec.loader.exec_module(tune)
finally:
    sys.path.remove(str(ROOT / "benchmarks"))

DIMS = list(tune.DIMS)
INF = float("inf")


def _times(first: float, rest: float = 50.0) -> list[float]:
    return [first] + [rest] * (len(DIMS) - 1)


def _record() -> dict:
    """Three candidates at one M: the split form (best geometric mean), a split_sum launch fastest on the
    first dims only, and one that failed there."""
    return {"dims": DIMS, "vllm_us": [40.0] * len(DIMS), "candidates": [
        {"params": {"form": "split", "block_n": 64}, "geomean_speedup": 1.10, "us": _times(30.0, 40.0)},
        {"params": {"form": "split_sum", "block_n": 32}, "geomean_speedup": 0.95, "us": _times(28.0, 45.0)},
        {"params": {"form": "split_sum", "block_n": 16}, "geomean_speedup": 0.90, "us": _times(INF, 44.0)},
    ]}


def test_a_recorded_sweep_answers_for_what_it_timed():
    scorer = tune.RecordedScorer(_record())
    assert scorer({"block_n": 64, "form": "split"}) == (1.10, _times(30.0, 40.0))  # key order does not matter
    assert scorer({"form": "split", "block_n": 128}) == (0.0, [INF] * len(DIMS))  # not timed: failed
    assert scorer.best_of("split_sum") == {"form": "split_sum", "block_n": 32}
    assert scorer.best_of("fused") is None
    assert scorer.vllm_us == [40.0] * len(DIMS)
    with pytest.raises(ValueError, match="dims"):
        tune.RecordedScorer({**_record(), "dims": DIMS[::-1] + ["other"]})


def test_a_specialist_replaces_the_forms_best_only_beyond_the_margin():
    seen = tune.RecordedScorer(_record()).seen
    assert tune.specialist(seen, 0, 30.0) == {"form": "split_sum", "block_n": 32}  # 28 < 30 x 0.99
    assert tune.specialist(seen, 0, 28.2) is None  # 28 is within 1% of 28.2: a lucky timing is not enough
    assert tune.specialist(seen, 1, 40.0) is None  # on the other dims the forms' best is the fastest
    assert tune.specialist({(("form", "x"),): (1.0, [INF] * len(DIMS))}, 0, 30.0) is None  # nothing ran there


def test_a_baseline_files_launches_per_shape_are_candidates_too():
    from infera_ops.moe_decode import policy
    from infera_ops.moe_decode.launch import LaunchConfig

    qwen3, mixtral = (policy.shape_key(*tune.DIMS[d]) for d in ("qwen3-30b-a3b", "mixtral"))
    common, special = LaunchConfig(form="split"), LaunchConfig(form="split_sum", block_n=32)
    base = policy.Tuning(max_tokens=4, by_tokens=((1, common), (4, LaunchConfig(form="persistent"))),
                         by_shape={qwen3: ((1, special),), mixtral: ((1, special), (2, common))})
    kept, shapes = tune.baseline_candidates(base, 1)
    assert kept == common.as_dict() and shapes == [special.as_dict()]  # the specialist once, for both shapes
    assert tune.baseline_candidates(base, 2) == (LaunchConfig(form="persistent").as_dict(), [common.as_dict()])
    # a recorded run answers only for what it timed
    recorded = {tuple(sorted(special.as_dict().items())): (1.0, [])}
    assert tune.baseline_candidates(base, 1, recorded) == (None, [special.as_dict()])
    assert tune.baseline_candidates(None, 1) == (None, [])
