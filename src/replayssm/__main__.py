"""Command line: ``python -m replayssm demo``."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="replayssm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="decode random layers both ways and show what replay saves")
    demo.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run_layer_demo

        run_layer_demo(device=args.device)


if __name__ == "__main__":
    main()
