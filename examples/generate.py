"""Generate with a transformers SSM hybrid, decoding through replay state.

    python examples/generate.py                      # a random small hybrid, built offline
    python examples/generate.py --model PATH_OR_ID   # any supported checkpoint (needs its weights locally)
    python examples/generate.py --compile            # the static-shape path: static cache + torch.compile
    python examples/generate.py --read-dtype bf16    # outputs read a bf16 copy of the fp32 checkpoint

`replayssm.patch(model)` is the only change to a normal transformers script:
generate() then decodes every Mamba-2 / Gated DeltaNet layer from a
checkpoint plus a ring of recent inputs, writing the recurrent state once per
window instead of once per token. The output is the same as unpatched.
With ``--compile`` (``patch(model, compile=True)``) each decode step runs
through torch.compile in a static cache (CUDA graphs on CUDA; on the CPU the
first steps take a while to compile).
With ``--read-dtype`` (``ReplayConfig(read_dtype=...)``, docs/spec.md §4) every step's outputs read a
16-bit copy of the checkpoint, written at each fold: half the bytes a decode step reads. The
recurrence stays fp32, but the outputs carry the copy's rounding, so tokens may differ from unpatched.
"""

import argparse

import torch

import replayssm


def load(model_name, device):
    if model_name is None:
        from replayssm.integrations.hf.demo import build_demo_model

        return build_demo_model("small", device), None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_name, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)
    return model.to(device).eval(), AutoTokenizer.from_pretrained(model_name)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="checkpoint path or hub id (default: random small hybrid)")
    parser.add_argument("--prompt", default="The state of a recurrent layer")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--window", type=int, default=16, help="replay ring window L")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--compile", action="store_true", help="patch(model, compile=True): captured decode steps")
    parser.add_argument("--read-dtype", choices=["bf16", "fp16"], default=None, help="a 16-bit read copy of the checkpoint")
    args = parser.parse_args()
    device = torch.device(args.device)

    model, tokenizer = load(args.model, device)
    if tokenizer is not None:
        inputs = tokenizer(args.prompt, return_tensors="pt").to(device)
    else:
        ids = torch.arange(5, 17, device=device).unsqueeze(0)
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    kwargs = dict(max_new_tokens=args.new_tokens, do_sample=False)
    reference = model.generate(**inputs, **kwargs)

    read_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, None: None}[args.read_dtype]
    replayssm.patch(model, replayssm.ReplayConfig(window=args.window, read_dtype=read_dtype), compile=args.compile)
    replayed = model.generate(**inputs, **kwargs)

    print("patched:", model._replayssm)
    if tokenizer is not None:
        print(tokenizer.decode(replayed[0], skip_special_tokens=True))
    else:
        print("tokens:", replayed[0, inputs["input_ids"].shape[1]:].tolist())
    new = replayed.shape[1] - inputs["input_ids"].shape[1]
    same = (replayed[:, -new:] == reference[:, -new:]).float().mean().item() if replayed.shape == reference.shape else 0.0
    print("identical to unpatched:", torch.equal(reference, replayed), f"({same:.0%} of new tokens the same)")

    replayssm.unpatch(model)  # back to stock transformers


if __name__ == "__main__":
    main()
