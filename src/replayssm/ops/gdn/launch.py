"""Gated DeltaNet launch table: (value_dim, key_dim) -> configuration, fp32 state.

Tuned shape: 128 x 128 (Qwen3-Next / Qwen3.5, 16 key heads, 32 or 64 value
heads). One line per entry says why it won; docs/kernels.md has the figures
and the forms that lost.
"""

from __future__ import annotations

from ..launch import LaunchConfig, pick, weights_config

# Decoding (T = 1) runs verification's three launches (fold, weights, main) where this says 3: 23-28% faster
# than the single decode kernel at 128 x 128. Off the table the single kernel (decode.py) runs.
DECODE_LAUNCHES = {
    (128, 128): 3,
}
# Decode main launch: one 16-row tile per 1-warp program (3% faster than 8-row tiles; looping programs tie).
DECODE = {
    (128, 128): LaunchConfig(block=16, split=8, num_warps=1),
}
# Decode main launch reading a 16-bit read copy: 32-row tiles, four programs per head (3-4% faster than 16 rows).
DECODE_READ_COPY = {
    (128, 128): LaunchConfig(block=32, split=4, num_warps=1),
}
# Fold launch, decoding with or without a read copy, and verification: whole heads on 2-warp work-list programs,
# 4 per multiprocessor; most rows do not fold, so a few programs find the rows that do (2-5% faster than the grid).
FOLD = {
    (128, 128): LaunchConfig(block=16, split=1, num_warps=2, form="worklist", programs_per_sm=4),
}
# Verification main launch for drafts up to VERIFY_SHORT_MAX_T tokens: per-token products on 8-row 1-warp tiles
# (the tensor-core form pads 2 tokens to 16 rows and loses by 12%).
VERIFY_SHORT_MAX_T = 2
VERIFY_SHORT = {
    (128, 128): LaunchConfig(block=8, split=16, num_warps=1),
}
# Verification main launch for longer drafts: tensor-core dots (tf32x3) over pipelined 32-column key chunks on
# 32-row tiles, 4 stages ("mma"): 10-26% faster than the per-token form from T = 3 on.
VERIFY = {
    (128, 128): LaunchConfig(block=32, split=4, num_warps=1, num_stages=4, form="mma"),
}
# Weights launch: 1 warp (1-2% over 4). From WEIGHTS_SHORT_MAX_T + 1 tokens the ring products as one tl.dot
# ("dot"): 6% faster at T = 8, a tie at T = 4, slower below (its registers).
WEIGHTS_SHORT_MAX_T = 3
WEIGHTS_SHORT = {
    (128, 128): LaunchConfig(block=1, split=1, num_warps=1),
}
WEIGHTS = {
    (128, 128): LaunchConfig(block=1, split=1, num_warps=1, form="dot"),
}
# Conventional baseline (and the snapshot baseline of speculation): one 8-row tile per 1-warp program (98-99% of
# its floor in decoding, 96.5% with snapshots).
CONVENTIONAL = {
    (128, 128): LaunchConfig(block=8, split=16, num_warps=1),
}


def decode_launches(value_dim: int, key_dim: int) -> int:
    """How a decode step (T = 1) runs: 1 = the single kernel (decode.py), 3 = the three launches."""
    return DECODE_LAUNCHES.get((value_dim, key_dim), 1)


def single_kernel_config(value_dim: int, key_dim: int) -> LaunchConfig:
    """The single decode kernel: one program per (row, value head) walking its tiles (the fold is a tl.dot)."""
    return pick({}, value_dim, key_dim, loop=True)


def main_config(value_dim: int, key_dim: int, num_tokens: int, read_copy: bool = False) -> LaunchConfig:
    """The three-launch step's main launch (verification with a copy keeps the fp32 tables: it reads the checkpoint)."""
    if num_tokens == 1:
        table = DECODE_READ_COPY if read_copy else DECODE
    else:
        table = VERIFY_SHORT if num_tokens <= VERIFY_SHORT_MAX_T else VERIFY
    return pick(table, value_dim, key_dim, loop=False)


def fold_config(value_dim: int, key_dim: int) -> LaunchConfig:
    return pick(FOLD, value_dim, key_dim, loop=True)


def weights_launch_config(value_dim: int, key_dim: int, num_tokens: int) -> LaunchConfig:
    return weights_config(WEIGHTS_SHORT if num_tokens <= WEIGHTS_SHORT_MAX_T else WEIGHTS, value_dim, key_dim)


def conventional_config(value_dim: int, key_dim: int) -> LaunchConfig:
    return pick(CONVENTIONAL, value_dim, key_dim, loop=False)
