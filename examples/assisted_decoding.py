"""Exact assisted (speculative) decoding on an SSM hybrid, which stock transformers refuses.

    python examples/assisted_decoding.py
    python examples/assisted_decoding.py --model TARGET --assistant SMALLER_MODEL

Verification runs the drafted tokens through the replay ops without
committing them; `crop()` then rolls the recurrent state back by moving a
cursor (nothing is copied). Both prompt lookup and a draft model (patched
too, if it is an SSM hybrid) give exactly the greedy tokens.
"""

import argparse
import copy

import torch

import replayssm


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="target checkpoint (default: random small hybrid)")
    parser.add_argument("--assistant", default=None, help="draft checkpoint with the same tokenizer")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)

    if args.model is None:
        from replayssm.integrations.hf.demo import build_demo_model

        target = build_demo_model("small", device)
        assistant = copy.deepcopy(target)  # a noisy copy stands in for a smaller draft model
        with torch.no_grad():
            head = assistant.get_output_embeddings().weight
            head.add_(torch.randn_like(head) * head.std() * 0.5)
        phrase = torch.arange(5, 12, device=device)
        input_ids = torch.cat([phrase, phrase, phrase[:3]]).unsqueeze(0)
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.model)
        target = AutoModelForCausalLM.from_pretrained(args.model).to(device).eval()
        assistant = AutoModelForCausalLM.from_pretrained(args.assistant or args.model).to(device).eval()
        input_ids = tokenizer("def fibonacci(n):\n    ", return_tensors="pt").input_ids.to(device)

    greedy = target.generate(input_ids, max_new_tokens=args.new_tokens, do_sample=False)
    try:
        target.generate(input_ids, max_new_tokens=4, prompt_lookup_num_tokens=4)
    except ValueError as err:
        print("stock transformers:", err)

    config = replayssm.ReplayConfig(window=args.window)
    replayssm.patch(target, config)
    try:
        replayssm.patch(assistant, config)
    except ValueError as err:  # an attention-only draft model needs no patch
        print("assistant not patched:", err)
    assistant.generation_config.num_assistant_tokens = 5

    lookup = target.generate(input_ids, max_new_tokens=args.new_tokens, do_sample=False, prompt_lookup_num_tokens=4)
    drafted = target.generate(input_ids, max_new_tokens=args.new_tokens, do_sample=False, assistant_model=assistant)
    print("prompt lookup identical to greedy:", torch.equal(lookup, greedy))
    print("draft model   identical to greedy:", torch.equal(drafted, greedy))


if __name__ == "__main__":
    main()
