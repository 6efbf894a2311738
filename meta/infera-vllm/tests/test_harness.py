"""The harness's own logic (comparison, accuracy, rounds); the engine runs are in test_e2e_smollm2.py."""

from infera_vllm import harness


def test_compare_counts_positions_and_where_they_differ():
    cmp = harness.compare([[1, 2, 3], [4, 5]], [[1, 9, 3], [4, 5]])
    assert cmp == {"positions": 5, "agreement": 0.8, "disagreements": [(0, 2)]}


def test_accuracy_is_top1_against_the_next_token():
    # prompt 10 11 12 13: predictions for positions 1..3 are compared with 11, 12, 13
    assert harness.accuracy([[11, 0, 13]], [[10, 11, 12, 13]]) == 2 / 3


def test_rounds_alternate_configurations_and_take_the_median(monkeypatch, tmp_path):
    calls = []
    rates = {"off": iter([100.0, 120.0, 110.0]), "on": iter([90.0, 130.0, 125.0])}

    def fake_spawn(cfg, report_dir):  # stands in for one engine process: our own code, not vLLM's
        calls.append(cfg.label)
        rate = next(rates[cfg.label])
        return {"label": cfg.label, "plugin": cfg.plugin, "prompts": [[1, 2, 3]], "top1": [[2, 3]],
                "sample": "s", "generated_tokens": 4, "seconds": [1.0], "tokens_per_s": rate,
                "tokens_per_s_all": [rate]}

    monkeypatch.setattr(harness, "_spawn", fake_spawn)
    configs = [harness.RunConfig("off", False, "m"), harness.RunConfig("on", True, "m")]
    summary = harness.compare_runs(configs, str(tmp_path), rounds=3)
    assert calls == ["off", "on", "off", "on", "off", "on"]
    off, on = summary["runs"]
    assert (off["tokens_per_s"], on["tokens_per_s"]) == (110.0, 125.0)
    assert on["tokens_per_s_rounds"] == [90.0, 130.0, 125.0]
    assert abs(on["throughput_ratio"] - 125 / 110) < 1e-12
    assert on["vs_off"]["agreement"] == 1.0 and summary["model_accuracy"] == 1.0
    assert (tmp_path / "report-on-r2").is_dir()
