"""Mamba-2 launch table: (head_dim, state_size) -> configuration, fp32 state.

Tuned shapes: 80 x 128 (Nemotron-H nano, 96 heads) and 64 x 128 (128 heads).
One line per entry says why it won; docs/kernels.md has the figures and the
forms that lost.
"""

from __future__ import annotations

from ..launch import LaunchConfig, pick, weights_config

# Decode (T = 1) main launch: 8-row tiles on 1-warp programs, each looping over a few tiles so the per-row
# prologue is paid once (6-7% faster than one tile per program).
DECODE = {
    (80, 128): LaunchConfig(block=8, split=4, num_warps=1),
    (64, 128): LaunchConfig(block=8, split=3, num_warps=1),
}
# Decode main launch reading a 16-bit read copy: half the bytes per tile, so 16-row tiles keep enough loads in
# flight (11-13% faster than the fp32 entry).
DECODE_READ_COPY = {
    (80, 128): LaunchConfig(block=16, split=5, num_warps=1),
    (64, 128): LaunchConfig(block=16, split=4, num_warps=1),
}
# Decoding folds full rings inside the main launch's tile programs (no flush launch): 1-5% faster; not with a
# read copy (the flush launch writes both copies; folding both in the main launch lost by 12-15%).
FOLD_IN_MAIN = {
    (80, 128): True,
    (64, 128): True,
}
# Flush launch (decode with a read copy, and verification): one program per head, tile loop pipelined over
# 3 stages (12-15% faster than one tile per program; stages 1% more).
FLUSH = {
    (80, 128): LaunchConfig(block=16, split=1, num_warps=4, num_stages=3),
    (64, 128): LaunchConfig(block=16, split=1, num_warps=4, num_stages=3),
}
# Verification (T > 1) main launch: the T tokens as one block over N chunks whose loads go 3 chunks ahead
# ("tokens_prefetched"): 10% faster than the unprefetched chunks, 23% faster than per-token programs.
VERIFY = {
    (80, 128): LaunchConfig(block=8, split=10, num_warps=1, num_stages=4, form="tokens_prefetched"),
    (64, 128): LaunchConfig(block=8, split=8, num_warps=1, num_stages=4, form="tokens_prefetched"),
}
# Weights launch, verification: 1 warp (within 1% of 2 and 4; decoding: a tie, so 4 off the table).
WEIGHTS_VERIFY = {
    (80, 128): LaunchConfig(block=1, split=1, num_warps=1),
    (64, 128): LaunchConfig(block=1, split=1, num_warps=1),
}
# Conventional baseline (and the snapshot baseline of speculation): one 8-row tile per 1-warp program.
CONVENTIONAL = {
    (80, 128): LaunchConfig(block=8, split=10, num_warps=1),
    (64, 128): LaunchConfig(block=8, split=8, num_warps=1),
}


def main_config(head_dim: int, state_size: int, num_tokens: int, read_copy: bool = False) -> LaunchConfig:
    """The main launch: ``DECODE`` (``DECODE_READ_COPY`` reading a copy) for T = 1, ``VERIFY`` for T > 1."""
    if num_tokens > 1:
        return pick(VERIFY, head_dim, state_size, loop=False)
    return pick(DECODE_READ_COPY if read_copy else DECODE, head_dim, state_size, loop=False)


def flush_config(head_dim: int, state_size: int) -> LaunchConfig:
    return pick(FLUSH, head_dim, state_size, loop=True)


def weights_launch_config(head_dim: int, state_size: int, num_tokens: int) -> LaunchConfig:
    return weights_config(WEIGHTS_VERIFY if num_tokens > 1 else {}, head_dim, state_size)


def fold_in_main(head_dim: int, state_size: int, num_tokens: int) -> bool:
    """Whether a decode step folds in its main launch (verification always runs the flush launch)."""
    return num_tokens == 1 and FOLD_IN_MAIN.get((head_dim, state_size), False)


def conventional_config(head_dim: int, state_size: int) -> LaunchConfig:
    return pick(CONVENTIONAL, head_dim, state_size, loop=False)
