"""The command line meets what users type: each input below with the exit code it gets and the one line that
names it; never a traceback. In-process (``cli.main``), against the installed op wheels; the switches come from
the environment as in a shell."""

import json

import pytest

from infera_vllm import cli

# SmolLM2-135M's shape: 9 query heads, 3 KV heads, intermediate 1536 (tensor-parallel sizes vLLM takes: 1, 3)
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 576, "num_hidden_layers": 2,
         "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152,
         "torch_dtype": "bfloat16"}

# (argv, environment, config.json over LLAMA ({} none; a string: the file's text), exit code, a fragment of the
# line that names the input (on stderr for rc 2, on stdout otherwise), a fragment that must not appear)
CASES = {
    "self-check flag on": (["doctor"], {"INFERA_VLLM_SELF_CHECK": "1"}, None, 0, "INFERA_VLLM_SELF_CHECK=first", ""),
    "self-check flag off": (["doctor"], {"INFERA_VLLM_SELF_CHECK": "false"}, None, 0, "INFERA_VLLM_SELF_CHECK=off",
                            ""),
    "self-check 1.0": (["doctor"], {"INFERA_VLLM_SELF_CHECK": "1.0"}, None, 2, "every call: every", ""),
    "op name typo": (["doctor"], {"INFERA_VLLM_OPS": "nrom"}, None, 1, "did you mean 'norm'?", ""),
    "op name in capitals": (["doctor", "--json"], {"INFERA_VLLM_OPS": "NORM", "INFERA_VLLM_OPS_EXCLUDE": "Norm"},
                            None, 0, '"excluded"', "not-installed"),
    "exclude name typo": (["doctor"], {"INFERA_VLLM_OPS_EXCLUDE": "atn-paged"}, None, 1,
                          "INFERA_VLLM_OPS_EXCLUDE names 'atn-paged', which no installed wheel provides (did you mean "
                          "'attn-paged'?)", ""),
    "refused op switch, no op named": (["doctor"], {"INFERA_NORM_EAGER_MIN_TOKENS": "some"}, None, 1,
                                       "INFERA_NORM_EAGER_MIN_TOKENS='some': expected an integer >= 0", ""),
    "zero heads": (["doctor", "--model", "{dir}"], {}, {"num_attention_heads": 0}, 2,
                   "config.json: num_attention_heads is 0, not an integer >= 1", ""),
    "hidden size not a number": (["doctor", "--model", "{dir}"], {}, {"hidden_size": "abc"}, 2,
                                 "config.json: hidden_size is 'abc', not an integer >= 1", ""),
    "truncated config": (["doctor", "--model", "{dir}"], {}, '{"hidden_size": 576, "num_hid', 2, "not valid JSON",
                         ""),
    "tune, no op": (["tune"], {}, None, 2, "installed ops with a tuner: linear-hipblaslt", ""),
    "tune, op typo": (["tune", "lineer"], {}, None, 2, "did you mean 'linear'?", ""),
    "tune, op without a tuner": (["tune", "norm"], {}, None, 2, "op 'norm' has no tuner", ""),
    "tune --tp 0": (["tune", "linear", "--model", "{dir}", "--tp", "0", "--dry-run"], {}, {}, 2,
                    "--tp 0: vLLM shards 9 attention heads, 1536 intermediate size and 3 KV heads evenly", ""),
    "tune --tp 7": (["tune", "linear", "--model", "{dir}", "--tp", "7", "--dry-run"], {}, {}, 2,
                    "sizes that work: 1, 3", "N="),
    "tune --tp abc": (["tune", "linear", "--model", "{dir}", "--tp", "abc", "--dry-run"], {}, {}, 2,
                      "argument --tp: invalid int value: 'abc'", ""),
    "tune --tokens abc": (["tune", "linear", "--model", "{dir}", "--tokens", "abc", "--dry-run"], {}, {}, 2,
                          "argument --tokens: 'abc': expected comma-separated token counts >= 1", ""),
    "tune --margin 0.5": (["tune", "linear", "--model", "{dir}", "--margin", "0.5", "--dry-run"], {}, {}, 2,
                          "argument --margin: '0.5': expected a speedup >= 1", ""),
    "tune, no config": (["tune", "linear", "--model", "{dir}/missing", "--dry-run"], {}, {}, 2, "no config.json", ""),
    "validate, config but no weights": (["validate", "{dir}"], {}, {}, 2,
                                        "holds a config.json but no weights (*.safetensors, *.bin, *.pt, *.gguf) "
                                        "and no tokenizer", ""),
    "validate, truncated config": (["validate", "{dir}", "--dummy"], {}, '{"hidden_size": 5', 2,
                                   "config.json: not valid JSON", ""),
    "validate, zero heads": (["validate", "{dir}", "--dummy"], {}, {"num_attention_heads": 0}, 2,
                             "num_attention_heads is 0, not an integer >= 1", ""),
    "validate --batches a,b": (["validate", "{dir}", "--dummy", "--batches", "a,b"], {}, {}, 2,
                               "--batches 'a,b': expected comma-separated batch sizes", ""),
    "validate --llm-kwargs not JSON": (["validate", "{dir}", "--dummy", "--llm-kwargs", "{max_model_len: 9}"], {}, {},
                                       2, "--llm-kwargs: not JSON", ""),
    "validate --llm-kwargs a list": (["validate", "{dir}", "--dummy", "--llm-kwargs", "[1]"], {}, {}, 2,
                                     "--llm-kwargs: a JSON object of vllm.LLM arguments", ""),
    "validate --prompt-tokens x": (["validate", "{dir}", "--dummy", "--prompt-tokens", "x"], {}, {}, 2,
                                   "--prompt-tokens 'x': expected a length such as 256", ""),
    "validate --cpus 3-1": (["validate", "{dir}", "--dummy", "--cpus", "3-1"], {}, {}, 2, "--cpus '3-1': bad CPU range",
                            ""),
    "validate --repeats abc": (["validate", "{dir}", "--dummy", "--repeats", "abc"], {}, {}, 2,
                               "argument --repeats: invalid int value: 'abc'", ""),
    "validate, no model": (["validate"], {}, None, 2, "--preset NAME (presets: ", ""),
    "validate --preset typo": (["validate", "--preset", "smolm2"], {}, None, 2, "no such preset", ""),
    # --tp 3: each rank holds 3 query heads and 1 KV head (qkv N = 5 x 64), a third of o's K and of the MLP
    "tune --tp 3": (["tune", "linear", "--model", "{dir}", "--tp", "3", "--dry-run"], {}, {}, 0,
                    "N=320    K=576", "Traceback"),
}


@pytest.mark.parametrize("argv, env, config, rc, names, absent", CASES.values(), ids=CASES.keys())
def test_each_input_gets_its_exit_code_and_one_line(tmp_path, monkeypatch, capsys, argv, env, config, rc, names,
                                                    absent):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if config is not None:
        text = config if isinstance(config, str) else json.dumps({**LLAMA, **config})
        (tmp_path / "config.json").write_text(text)
    try:
        code = cli.main([arg.replace("{dir}", str(tmp_path)) for arg in argv])
    except SystemExit as exc:  # argparse's refusals
        code = exc.code
    out, err = capsys.readouterr()
    assert code == rc, out + err
    where = err if rc == 2 else out
    assert names in where, out + err
    assert "Traceback" not in out + err and (not absent or absent not in out + err)
    if rc == 2:
        said = [line for line in err.splitlines() if line.strip() and not line.startswith(("usage:", " "))]
        assert len(said) == 1, err  # one line (argparse's usage block aside)
    if rc == 1:  # doctor's closing line gives the reason
        assert out.rstrip().splitlines()[-1].startswith("exit 1: ") and names in out.rstrip().splitlines()[-1], out


@pytest.mark.cpu_build  # the ops decline on the CPU build (Triton's interpreter off), so strict mode fails
def test_doctor_under_strict_mode_names_strict_mode_as_the_reason(monkeypatch, capsys):
    monkeypatch.setenv("INFERA_VLLM_STRICT", "1")
    assert cli.main(["doctor"]) == 1
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert "would decline (triton-interpreter-off) and INFERA_VLLM_STRICT=1 makes that an error" in last, last
    assert "named in INFERA_VLLM_OPS" not in last


def test_report_into_a_closed_pipe_ends_quietly(tmp_path):
    """``infera-vllm report DIR --json | head -1``: the reader leaves after a line of a document larger than the
    pipe holds; the command ends without a traceback."""
    import subprocess
    import sys

    from infera_vllm import coverage

    coverage.record_op("norm", distribution="infera-norm", version="0.1.0", seam="ir", decline=None)
    for bucket in range(3000):
        coverage.record("norm", "kernel", "", str(bucket), n=1)
    coverage.write_report(str(tmp_path))
    proc = subprocess.run(f"{sys.executable} -m infera_vllm report {tmp_path} --json | head -1", shell=True,
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout == "{\n" and proc.stderr == "", proc.stderr
