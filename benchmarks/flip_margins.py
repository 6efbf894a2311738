"""Are a run's top-1 disagreements near-ties? For each position where a run of an ``infera-vllm validate``
result on SmolLM2 (real weights) has a teacher-forced top-1 that differs from plugin off's, the gap between
the two best logits of the same model in fp32 (transformers, CPU), beside that gap's distribution over every
position: flips that sit where fp32 itself barely separates two tokens are rounding, flips at wide gaps
would be a wrong answer (validate keeps each run's first 50 disagreements).

    python benchmarks/flip_margins.py benchmarks/results/cpu/attn-paged/validate_smollm2.json [--model DIR]

Prints a table and writes ``<result>.margins.json`` beside the result.
"""

from __future__ import annotations

import argparse
import json


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("result", help="an infera-vllm validate JSON of SmolLM2")
    parser.add_argument("--model", help="checkpoint dir (default: the converted SmolLM2)")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from infera_vllm import harness, smollm2

    with open(args.result) as f:
        doc = json.load(f)
    (entry,) = [e for e in doc["models"] if e["weights"] == "real"]
    runs = {label: run["agreement"] for label, run in entry["runs"].items() if run.get("agreement")}
    prompts_n, length = entry["options"]["agreement_prompts"], entry["options"]["agreement_tokens"]
    path = args.model or smollm2.prepare()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    margins = []
    with torch.no_grad():
        for prompt in harness.corpus_prompts(tokenizer, prompts_n, length):
            top2 = model(torch.tensor([prompt])).logits[0].topk(2, dim=-1).values
            margins.append((top2[:, 0] - top2[:, 1]).tolist())
    every = sorted(m for row in margins for m in row[:-1])  # the last position predicts nothing compared
    out = {"result": args.result, "fp32_margin_median": every[len(every) // 2],
           "fp32_margin_fraction_below_0.2": sum(m < 0.2 for m in every) / len(every), "runs": {}}
    print(f"fp32 top-2 logit gap over {len(every)} positions: median {out['fp32_margin_median']:.3f}, "
          f"{out['fp32_margin_fraction_below_0.2']:.1%} below 0.2")
    for label, cmp in runs.items():
        # a disagreement (i, j) is the prediction of token j of prompt i: the logits at position j - 1
        gaps = [margins[i][j - 1] for i, j in cmp["disagreements"]]
        out["runs"][label] = {"agreement": cmp["agreement"], "disagreements": cmp["disagreements"],
                              "fp32_margins": gaps}
        print(f"{label:<14} agreement {cmp['agreement']:.4f}, {len(gaps)} flips shown, fp32 gaps: "
              + ", ".join(f"{g:.3f}" for g in gaps))
    target = args.result.replace(".json", ".margins.json")
    with open(target, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
