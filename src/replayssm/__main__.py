"""Command line: ``python -m replayssm demo``."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="replayssm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo",
        help="patch a small hybrid model, generate with and without replay, then decode random layers both ways",
    )
    demo.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    demo.add_argument("--part", choices=("all", "model", "layers"), default="all", help="which part of the demo to run")
    demo.add_argument("--tokens", type=int, default=64, help="tokens the model demo generates per run")
    args = parser.parse_args(argv)
    if args.command == "demo":
        if args.part in ("all", "model"):
            from .integrations.hf.demo import run_demo

            run_demo(device=args.device, new_tokens=args.tokens)
        if args.part in ("all", "layers"):
            from .demo import run_layer_demo

            if args.part == "all":
                print()
            run_layer_demo(device=args.device)


if __name__ == "__main__":
    main()
