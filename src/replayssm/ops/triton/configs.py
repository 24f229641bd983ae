"""Launch configurations, chosen by hand per shape (no autotune: the kernels mutate state).

Each kernel processes one (row, head) state of ``dim x key_dim`` (Mamba-2:
head_dim x state_size; GDN: value_dim x key_dim) in tiles of ``block`` rows of
the full key dimension. ``split`` programs share one head's tiles (a program
loops over every ``split``-th tile; ``split`` = number of tiles gives one tile
per program). Mamba-2 kernels: the replay T = 1 main launch
(``mamba2_replay_config``), its flush launch (``mamba2_flush_config``, block
>= 16: the fold is a ``tl.dot``; shared with verification), the verification
(T > 1) main launch (``mamba2_verify_config``) and the conventional one; the
weights launch has a fixed shape. GDN: the replay kernel for T = 1
(``gdn_replay_config``, block >= 16), the three-launch step's main launch
(``gdn_main_config``: a T = 1 table for decoding through the three launches,
``gdn_decode_launches``, and two T > 1 ones, short and long drafts), its fold launch
(``gdn_flush_config``: T = 1 tables with and without a read copy and a T > 1 one; block >= 16), its weights launch
(``gdn_weights_config``: warps only), and the conventional one.

The figures behind these choices are in docs/kernels.md (tuning log);
``benchmarks/decode_kernels.py --sweep`` (T = 1 main launches) and
``benchmarks/spec_kernels.py --sweep`` (verification main and flush launches)
time alternatives. A shape missing from a table
gets the default rule below it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LaunchConfig:
    block: int  # rows of the state tile (head_dim or value_dim direction), a power of two; >= 16 where a fold is a tl.dot
    split: int  # programs per head (1 = one program loops over all tiles of its head)
    num_warps: int
    num_stages: int = 1
    # How the kernel forms its result, where a kernel has more than one way (e.g. per token or as one
    # block of tokens); "" is the kernel's default form. Each kernel documents the forms it knows.
    form: str = ""
    # Work-list forms (the GDN fold launch's "worklist"): a fixed grid of this many programs per
    # multiprocessor (0: the kernel's default), each looping over the work items found on the device.
    programs_per_sm: int = 0

    def as_dict(self) -> dict:
        out = {"block": self.block, "split": self.split, "num_warps": self.num_warps, "num_stages": self.num_stages}
        if self.form:
            out["form"] = self.form
        if self.programs_per_sm:
            out["programs_per_sm"] = self.programs_per_sm
        return out


# (dim, key_dim) -> config, fp32 state. Keys: head_dim x state_size (Mamba-2), value_dim x key_dim (GDN).
# Replay T = 1 main launch: 8-row tiles on 1-warp programs, each program looping over a few of its head's
# tiles so that its prologue (row position, weights, C, decay) is paid once for them. decode_kernels --sweep,
# 2026-12-01 08:29, fold in the main launch, us per step (96x80 / 128x64 / 64x64): one tile per program
# 320.6 / 343.4 / 176.3; splits 5, 4, 3, 2 of 10 tiles 299.2, 299.0, 299.6, 301.5; splits 5, 4, 3, 2 of 8
# tiles 326.6 / 172.7, 317.8 / 169.8, 315.7 / 169.5, 315.8 / 172.0; one program per head 322.7 / 328.0 / 185.3;
# 16-row tiles split 3 329.0 / 358.3 / 191.3, 2 warps 358.2 / 392.4 / 207.5. 2026-12-03 (run 25): 4-row tiles,
# splits 6 to one tile per program, 311.7-373.1 / 333.0-398.5 / 178.5-203.2 against 296.8 / 313.7 / 169.1.
_MAMBA2_REPLAY = {
    (80, 128): LaunchConfig(block=8, split=4, num_warps=1),
    (64, 128): LaunchConfig(block=8, split=3, num_warps=1),
}
# Flush launch, T = 1 and T > 1 (only rows whose ring is full work; the fold is a tl.dot: block >= 16).
# spec_kernels --sweep, 2026-11-29: one program per head beat one tile per program by 12-15%. 2026-12-02 16:25
# (run 21, T = 4, 2 of 4): the loop over the head's tiles software-pipelined, 3 stages (the next tiles' loads
# by cp.async during this tile's fold) 459.1 / 499.1 us against 463.1 / 502.2 on 1 stage (96x80 / 128x64); the
# flush kernel 3-5% faster in every headline row; 2 stages 468.1 / 508.4, 8 warps 505.4 / 563.5. The "beside"
# form (a work-list fold beside the main launch, run 22): 463.2-464.7 / 501.1-502.8 against 458.9 / 498.1, and
# in decoding 312.3-313.7 / 332.2-333.0 against 297.8 / 315.0 (run 23); removed.
_MAMBA2_FLUSH = {
    (80, 128): LaunchConfig(block=16, split=1, num_warps=4, num_stages=3),
    (64, 128): LaunchConfig(block=16, split=1, num_warps=4, num_stages=3),
}
# Verification (T > 1) main launch: one small tile per 1-warp program, the T tokens as one block with the
# state product summed over N chunks ("tokens_chunked"). spec_kernels --sweep, T = 4, 2026-11-29 17:26:
# 16-row tiles in that form 517.6 / 558.0 us (96x80 / 128x64) against 598.1 / 650.7 for the per-token
# form on 8-row tiles (the table before), 531.7 / 576.4 for "tokens" on 8 rows; 2 warps 597-795.
# 2026-12-02 (docs/kernels.md run 20): each chunk's loads issued ahead of its product ("tokens_prefetched")
# on 8-row tiles, 3 chunks ahead (num_stages 4) 462.3 / 501.4 us, 2 ahead 474.0-474.9 / 512.2-513.2, against
# 511.6-512.5 / 552.6-553.8 for "tokens_chunked" on 16 rows (16 rows prefetched: 479.8-487.6 / 520.7-528.3).
# 2026-12-02 16:25 (run 21): 4 chunks ahead (num_stages 5, the whole 8-row tile before the first product) tied
# with 3 (461.1 / 502.3 against 461.8 / 502.1 us). 2026-12-03 (run 25): 4-row tiles 605.8-610.4 / 656.2-659.4
# against 458.8 / 500.7; 8-row programs looping over 2-3 tiles 477.7-522.8 / 523.1-562.2.
_MAMBA2_VERIFY = {
    (80, 128): LaunchConfig(block=8, split=10, num_warps=1, num_stages=4, form="tokens_prefetched"),
    (64, 128): LaunchConfig(block=8, split=8, num_warps=1, num_stages=4, form="tokens_prefetched"),
}
_MAMBA2_CONVENTIONAL = {
    (80, 128): LaunchConfig(block=8, split=10, num_warps=1),
    (64, 128): LaunchConfig(block=8, split=8, num_warps=1),
}
# GDN replay T = 1: one program per (row, value head) walking its tiles, fold in the same kernel
# (block >= 16). The three-launch form was slower for GDN decoding as configured (tuning log, run 5).
_GDN_REPLAY = {
    (128, 128): LaunchConfig(block=32, split=1, num_warps=4),
}
# GDN decoding (T = 1): the single replay kernel (1) or verification's three launches (3), whose main
# launch then takes `_GDN_DECODE_MAIN`'s shape. decode_kernels --sweep, 2026-11-29 15:00: three launches
# with one 8-row tile per 1-warp program 200.7 / 361.3 us against 260.9 / 504.3 for the best single
# kernel (16/32 / 16/64 heads); with 32-row programs of 8 warps (run 5) they had lost.
_GDN_DECODE_LAUNCHES: dict[tuple[int, int], int] = {
    (128, 128): 3,
}
# Decoding (T = 1) with a bf16 read copy of the checkpoint (SPEC §4): the main launch reads half the bytes
# per tile, and the tables above (tuned for fp32 tiles) leave it short of work in flight. One-off sweep,
# 2026-12-03 08:5x, H200, batch 256, window 16, staggered rows, us per step (docs/kernels.md run 28):
# Mamba-2 (flush launch; 96x80 / 128x64 / 64x64) 8-row tiles split 4 (the fp32 table) 264.2 / 285.5 / 157.1,
# one tile per program 255.4 / 276.2 / 150.0, 16-row tiles one per program 231.0 / 251.3 / 136.9, split 3
# 237.2 / 248.3 / 138.0, split 2 229.8 / 249.2 / 139.9, on 2 warps 281.6 / 306.0 / 165.4, 32 rows on 2 warps
# 251.8 / 253.8 / 140.2. GDN (16/32 / 16/64) 16-row tiles one per program (the fp32 table) 141.6 / 263.7,
# looping over 2 / 4 tiles 153.4 / 283.7 and 150.1 / 278.0; 32-row tiles one per program 138.1 / 252.9, on 2
# warps 160.0 / 297.6, looping over 2 tiles 153.0 / 282.8; 64 rows on 2 warps 176.3 / 328.3.
# With a copy every decoding step runs the flush launch: folding in the main launch (writing both copies there)
# lost by 12-15% at its best shape, 264.3 / 288.0 / 153.9 against 230.0 / 250.7 / 137.2 us (run 29, not merged).
_MAMBA2_REPLAY_READ = {
    (80, 128): LaunchConfig(block=16, split=5, num_warps=1),
    (64, 128): LaunchConfig(block=16, split=4, num_warps=1),
}
_GDN_DECODE_MAIN_READ = {
    (128, 128): LaunchConfig(block=32, split=4, num_warps=1),
}
# GDN decoding through the three launches (T = 1): their main launch. decode_kernels --sweep, 2026-11-29
# 15:30, after the main launch forms all T corrected updates at once: 16-row tiles 203.6 / 367.7 us
# against 210.4 / 381.6 for 8-row tiles (16/32 / 16/64 heads; 8 rows had won, 200.7 / 361.3, before).
# 2026-12-01: programs looping over 2 / 4 tiles tied (200.8 / 201.6 against 200.6, 16/32).
_GDN_DECODE_MAIN = {
    (128, 128): LaunchConfig(block=16, split=8, num_warps=1),
}
# GDN verification (T > 1) main launch, in two tables by draft length: `_GDN_VERIFY_SHORT` up to
# `_GDN_VERIFY_SHORT_MAX_T` tokens, `_GDN_VERIFY` above. The per-token form: one 8-row tile per 1-warp program
# (spec_kernels --sweep, 2026-11-29, T = 4: 537 us against 717-948 for 16- and 32-row tiles with 2-8 warps;
# 17:26: 460.3 us against 516-884 for a "tokens" block form and 1514-1616 for an fp32-FMA "dots" one, both
# removed; run 9; 2026-12-01: 454.2 against 506.1 / 530.9 for programs looping over 4 / 2 tiles). Nsight
# Compute then showed it issue-bound at T = 4 (its K-wide row sums are lane shuffles; docs/kernels.md run
# 13), and the "mma" form (the token products as tensor-core dots in tf32x3) on 16-row 1-warp tiles, each
# program looping over two, won from T = 4 on: spec_kernels --sweep 2026-12-01 17:3x, T = 4, 417.9 us
# against 447.4 (16 / 32 rows on 1-2 warps and 64 rows on 4: 418.6-431.6); benchmarks/experiments/
# gdn_verify_forms.py 17:4x, mma / per-token (16/32 and 16/64 heads): T = 2 1.23 / 1.22, T = 3 1.07 / 1.07,
# T = 4 0.93 / 0.92, T = 6 0.63 / 0.61, T = 8 0.55 / 0.52 (its 16 token rows are mostly padding for short
# drafts). At T = 1 it lost too (344-353 against 186 us per decode step, 16/32 heads). 2026-12-02 (run 17):
# the form's [K; Q] S^T as dots over 32-column key chunks (each chunk loaded for its own dot, 3 stages
# pipelining the loads), one 16-row tile per 1-warp program: T = 4, 2 of 4 accepted, 375-378 / 708 us per
# verify step (16/32 / 16/64 heads) against 411-413 / 777 for whole-tile dots on two tiles per program; 1 or
# 2 stages 460 / 414, 128-row 4-warp programs (2 stages) 380-383, 64-row 4-warp 399-415. By draft length
# (gdn_verify_forms.py, same day), the chunked form / per-token: T = 2 1.12 / 1.12, T = 3 0.97 / 0.98, T = 4
# 0.85 / 0.83, T = 8 0.49 / 0.47, so the per-token form keeps only T = 2. Then 32-row tiles on one warp with
# 4 stages: T = 4 338.1-339.6 / 624.7 us (2 of 4), 375.0 (4 of 4, 16/32) against 377-378 / 708 and 415; T = 3
# 321.8 against 345.2, T = 8 464.2 against 496.3 (16/32); 16 rows on 4 / 5 stages 370-372 / 416-417, 32 rows
# on 2 warps (3 stages) 372, 32 rows on 5 / 6 stages 352 / 377, 64 rows on 1 warp (4 stages) 375.
_GDN_VERIFY_SHORT_MAX_T = 2
_GDN_VERIFY_SHORT = {
    (128, 128): LaunchConfig(block=8, split=16, num_warps=1),
}
_GDN_VERIFY = {
    (128, 128): LaunchConfig(block=32, split=4, num_warps=1, num_stages=4, form="mma"),
}
# GDN fold launch of the three-launch step, decoding and verification (only rows whose ring cannot take T
# more entries work; tl.dot: block >= 16). A form with R rows per program ("rows<R>", docs/kernels.md run 9)
# tied in decoding (201.2 against 204.2 us) and lost in verification (472-495 against 462 us); removed.
# spec_kernels --sweep 2026-12-02 05:50 (T = 4): a whole head per program 343.3 us, half / quarter heads 348.5 /
# 363.1, one tile 390.3. 2026-12-04 20:31 (spec_kernels --sweep, 16/32 heads, 2 of 4): decoding's fold shape since
# run 36 (whole heads on two-warp work-list programs, 4 per multiprocessor) 330.6 us against 338.1 for the grid
# form (2 / 3 stages 339.0 / 333.5, one tile per program 383.0); the 16/64 headline moved 620.0 -> 620.4, a tie.
_GDN_FLUSH = {
    (128, 128): LaunchConfig(block=16, split=1, num_warps=2, form="worklist", programs_per_sm=4),
}
# GDN decoding (T = 1): the fold launch as a work list ("worklist": a fixed grid of programs_per_sm programs
# per multiprocessor, each finding the folding rows with one vector load of the cursors and looping over
# their (row, value head, tile group) items; the grid form has a program per (value head, row), most of
# which read a cursor and exit). decode_kernels --sweep, 2026-12-01, three runs, us per decode step
# (16/32 / 16/64 heads): 2 programs per multiprocessor 193.9 / 362.0, 194.7 / 362.4 against 200.2 /
# 361.2, 198.7 / 359.4 for the grid form; staggered rows +2.8% over in-phase against +5.5% (16/32).
# 3 programs 197.0 / 356.0, pipelined loads (2 stages) 198.0 / 369.4, 32-row 8-warp programs 198.4 / 369.3.
# In verification (T = 4) it tied or lost then (458.3-465.6 against 454.8 us); _GDN_FLUSH took the grid until run 37.
# Headline 08:41: 193.0 / 366.3 us (grid form at 08:33: 202.0 / 359.7, same 16/64 fold-kernel time). A step
# on which every row folds costs more with it (637 / 1232 against 508 / 974 us): the few programs then
# work through every item. 2026-12-01 14:13 (with overlapping launches): items of half a head (split 2: 4 of
# its 8 fold tiles each, twice the items in flight) on 3 programs per multiprocessor 186.9 / 352.2 against
# 189.9 / 356.7 for whole heads on 2 (4 programs: 193.0 / 368.0; grid form 192.8 / 354.8). 2026-12-02 (run 18):
# no fold launch, the fold as the main launch's first programs (a work list on 1-warp programs, finishing the
# folded rows' tokens) lost in decoding, 261-269 / 502-520 us against 201-202 / 387-389, and in verification
# (T = 4, 2 of 4) 398-433 / 743-803 against 336-337 / 627-630: the fold's registers ride along in every tile
# program of the launch. Not merged (benchmarks/data/h200/gdn-merged-fold-attempt-2026-12-02.diff). Run 19:
# the fold launch after the weights launch and beside the main launch, finishing its rows ("alongside"), on
# 2 programs per multiprocessor: 183.6-184.4 / 344.2-344.5 against 187.0-187.2 / 350.9-351.3 in one run; not
# in the table until the CUDA and HF tests have run with it (verification, T = 4: 386-471 / 728-891 against
# 337-378 / 632-702, so _GDN_FLUSH keeps the grid).
# 2026-12-04 (docs/kernels.md run 36): whole heads on two-warp programs, 4 per multiprocessor (213-241 registers, no
# spills), as the read copy's fold: gdn_fold_forms.py, 19:10, two passes (staggered / in phase / every row folding):
# 182.3-183.1 / 179.0-180.2 / 506 and 343.1-343.7 / 339.2-340.0 / 980-981 us, against 187.7-189.0 / 181.9-183.0 / 557
# and 352.5-352.9 / 345.3-345.9 / 1088-1092 for half heads on 4 warps, 3 per SM (half heads on two warps 184.1-184.6;
# whole heads on two warps, 3 per SM, 192.5-192.7).
_GDN_DECODE_FLUSH = {
    (128, 128): LaunchConfig(block=16, split=1, num_warps=2, form="worklist", programs_per_sm=4),
}
# The same launch when the step reads a 16-bit read copy: the exact fold (GDN_READ_COPY_FOLD) adds a prologue per
# work item (the ring's Gram matrix and N, 14-15 us of latency on the H200) and 255 registers, so whole heads per
# program pay it once. benchmarks/experiments/gdn_fold_forms.py --read-dtype bf16, 2026-12-03 22:2x (16/32 / 16/64
# heads, us per step, staggered / every row folding): the grid form with whole heads 191.9 / 342.9 and 1123 / 2199,
# against 203.9 / 390.3 and 1723 / 3437 for the fp32 table's work list (4 programs per multiprocessor: 187.7 /
# 352.5 and 1368 / 2692; one tile per item, split 8: 277.2 / 529.3). The grid form wins where every row folds on
# the same step, as in generate(). decode_kernels --read-dtype bf16, 2026-12-04 06:30 / 06:35, back to back
# (staggered / in phase): the work list 204.4 / 209.4 and 391.3 / 393.4, the grid 190.1 / 184.4 and 341.4 / 343.0.
# Now a work list of whole heads, 2 programs per multiprocessor: the prologue paid once per head, and no idle
# programs on the steps where few rows fold. gdn_fold_forms.py --read-dtype bf16, 2026-12-04 11:1x (staggered /
# in phase / every row folding / none): 179.7 / 175.3 / 1207 / 113.3 and 335.0 / 324.6 / 2366 / 200.8, against
# the grid's 190.6 / 184.7 / 1122 / 128.5 and 347.9 / 343.3 / 2197 / 229.1 (3 programs per SM: 179.3 / 194.8;
# docs/kernels.md run 31). With the tile loop software-pipelined (3 stages; docs/kernels.md run 33), 2026-12-04
# 17:46, two passes: 166.4-167.2 / 162.9-163.8 / 1027 and 320.1-320.3 / 302.5-303.4 / 2018-2021, against
# 178.3-178.7 / 173.2-173.6 / 1189 and 344.4-345.1 / 322.8-323.4 / 2333-2337 on one stage (2 stages 175.7 /
# 1156, 4-5 stages 177-178 / 1047-1057; 3 per SM on 3 stages 167.1 / 183.3). The fp32 fold gains nothing from
# stages (187.2-188.7 against 187.2-187.9 us).
# Now (run 34) the "merged" fold (GDN_READ_COPY_FOLD) on two-warp programs, 4 per multiprocessor, one stage:
# gdn_fold_forms.py --read-dtype bf16, 2026-12-04 18:4x, two passes: 162.1-167.7 / 157.4-158.4 / 934-937 and
# 301.4-311.6 / 290.2-291.1 / 1820-1824 us, against 166.6-168.7 / 163.5-164.7 / 1032-1038 and 309.6-311.6 /
# 303.6-304.7 / 2020-2026 for "blocked" on the entry before (the blocked fold on two warps: 201-373 us; merged on
# 2 stages 171-172, on 3 per SM 182, on one warp 198, half heads 179-180; docs/kernels.md run 34).
_GDN_DECODE_FLUSH_READ = {
    (128, 128): LaunchConfig(block=16, split=1, num_warps=2, form="worklist", programs_per_sm=4),
}
# Mamba-2 weights launch, one program per (group, row): only num_warps is read. Decoding (T = 1) and
# verification (T > 1). Shapes missing from the tables get 4 warps (the fixed choice before 2026-12-01).
# Swept 2026-12-01: decoding 1 / 2 / 4 warps 322.0 / 319.6 / 319.8 us (96x80, one tile per main program; a
# tie, the table stays empty), verification (T = 4) 515.0 / 520.8 / 518.5 (96x80) and 556.8 / 561.9 / 558.8
# (128x64): 1 warp, within 1%.
_MAMBA2_DECODE_WEIGHTS: dict[tuple[int, int], LaunchConfig] = {}
_MAMBA2_WEIGHTS = {
    (80, 128): LaunchConfig(block=1, split=1, num_warps=1),
    (64, 128): LaunchConfig(block=1, split=1, num_warps=1),
}
# GDN weights launch, one program per (key head, row): only num_warps is read (block / split are unused,
# 1 by convention). Decoding (T = 1) and verification (T > 1) tables. Swept 2026-11-29 17:25 (16/32 heads,
# decode / verify step): 1 warp 199.2 / 456.8 us, 2 warps 200.4 / 458.6, 4 (before) 204.2 / 462.1, 8 210.2 /
# 491.5 -- a 1-2% gain, about the run-to-run noise, in both.
_GDN_DECODE_WEIGHTS = {
    (128, 128): LaunchConfig(block=1, split=1, num_warps=1),
}
# Past ``_GDN_WEIGHTS_SHORT_MAX_T`` tokens (from T = 4) the ring keys' products with the new keys and queries as one tl.dot
# (form "dot", tf32x3; the reductions it replaces are lane shuffles: 350 against 942 shuffles at T = 4 for sm_90,
# 854 against 2,038 at T = 8). 2026-12-03 (docs/kernels.md run 27; 16/32 / 16/64 heads, 2 of T accepted, us per
# step, two runs each): T = 8 436.8-438.2 / 802.1-806.3 against 462.8-466.4 / 855.6-859.8; T = 4 336.4-336.8 /
# 622.7-626.8 against 337.6-338.0 / 624.2-629.3 (a tie); T = 2 304.1-304.4 / 568.3-575.2 against 297.8-300.5 /
# 563.4-563.9 and decoding 192.4 / 358.3-360.2 against 186.8-187.4 / 352.0-354.4 (the dot's 167 registers
# against 126 at T = 1); on 2 warps slower everywhere.
_GDN_WEIGHTS_SHORT_MAX_T = 3
_GDN_WEIGHTS_SHORT = {
    (128, 128): LaunchConfig(block=1, split=1, num_warps=1),
}
_GDN_WEIGHTS = {
    (128, 128): LaunchConfig(block=1, split=1, num_warps=1, form="dot"),
}
# Where a Mamba-2 decode step (T = 1) folds the rows whose ring is full: in the flush launch before the
# others (False), or inside the main launch's tile programs (True: no flush launch; each program folds
# its own tile with rank-1 updates and writes it, so exiting programs and a second read of the folded
# tiles go away). decode_kernels --sweep, 2026-11-29 15:00 (fold loop one entry per iteration): 329.1 /
# 350.3 / 181.5 us in the main launch against 333.1 / 360.8 / 193.0. Verification (T > 1) folds in the
# flush launch: with a quarter of the rows folding per step the main launch's folding programs cost
# more (spec_kernels --sweep, T = 4: 727 / 778 us against 602 / 651). The same variant for GDN lost in
# every run (decode 206.9-228.8 against 200.7-210.4 us, verify 637 against 523) and was removed.
# 2026-12-01: the folding rows in a main launch of their own (a work list, on a second stream or not) lost
# too (decode 327.9-382.9 against 321, verify 575-583 against 517; docs/kernels.md run 10, not merged).
_MAMBA2_FOLD_IN_MAIN: dict[tuple[int, int], bool] = {
    (80, 128): True,
    (64, 128): True,
}
# Verification (T > 1) always folds in the flush launch. Its token-block forms folding a folding row's tile
# chunk by chunk as they loaded it (one read, where the flush launch's rows are read twice) lost: spec_kernels
# --sweep, T = 4, 2 of 4, 2026-12-02 (run 21): 685.5-698.7 / 736.6-751.3 us against 469.2-469.7 / 508.1-511.3
# with the flush launch (96x80 / 128x64); removed in run 24.
# GDN conventional kernel: decoding (one token) and the snapshot baseline of speculative decoding (T tokens,
# each state written to its own slot). 2026-12-01, benchmarks/experiments/gdn_conventional_forms.py (16/32 heads,
# after the kernel's sizes became compile-time constants and its loads lost their masks): decoding, 8-row
# 1-warp tiles 263.1-264.3 us (98-99% of the floor) against 273.0-273.4 for 32-row 8-warp ones (265.7 before
# the change; 270.3 for 8 rows then); 8 rows, 2 tiles per program 265.3-265.5, 16 rows on 2 warps 268.3-269.5,
# 32 rows on 4 warps 272.4-273.2; fla 258.7-259.5. Snapshot baseline, T = 4: 8 rows 683.1 us (96.5% of its
# floor) against 857.5 (76.9%) for the 32-row 8-warp table entry before, 831-865 for 16 / 32 rows on 2-4 warps.
_GDN_CONVENTIONAL = {
    (128, 128): LaunchConfig(block=8, split=16, num_warps=1),
}


# Whether a replay step of several launches (fold, weights, main) makes its later launches with programmatic
# dependent launch (sm_90+): their programs start while the launch before is still running and wait
# in-kernel for it (common.overlap_launches; each kernel's docstring says what it does before the wait).
# decode_kernels --sweep, 2026-12-01 11:51, us per step, plain / overlapping: GDN 16/32 195.3 / 190.6, 16/64
# 362.5 / 356.7; Mamba-2 298.8 / 299.2, 317.0 / 316.7, 169.8 / 169.5 (a tie); verification (T = 4) 0.4-1.2%
# faster. Main programs reading their first checkpoint tile before the wait lost (3-9% slower; removed).
_OVERLAP_LAUNCHES = True


def _default(dim: int, key_dim: int, loop: bool) -> LaunchConfig:
    block = 16 if key_dim >= 64 else 32
    tiles = -(-dim // block)
    return LaunchConfig(block=block, split=1 if loop else tiles, num_warps=4)


def _pick(table: dict, dim: int, key_dim: int, loop: bool) -> LaunchConfig:
    return table.get((dim, key_dim)) or _default(dim, key_dim, loop)


def mamba2_replay_config(head_dim: int, state_size: int, read_copy: bool = False) -> LaunchConfig:
    """The decode (T = 1) main launch; ``read_copy``: reading a 16-bit read copy (``_MAMBA2_REPLAY_READ``)."""
    return _pick(_MAMBA2_REPLAY_READ if read_copy else _MAMBA2_REPLAY, head_dim, state_size, loop=False)


def mamba2_flush_config(head_dim: int, state_size: int) -> LaunchConfig:
    return _pick(_MAMBA2_FLUSH, head_dim, state_size, loop=True)


def mamba2_verify_config(head_dim: int, state_size: int) -> LaunchConfig:
    return _pick(_MAMBA2_VERIFY, head_dim, state_size, loop=False)


def mamba2_conventional_config(head_dim: int, state_size: int) -> LaunchConfig:
    return _pick(_MAMBA2_CONVENTIONAL, head_dim, state_size, loop=False)


def gdn_replay_config(value_dim: int, key_dim: int) -> LaunchConfig:
    return _pick(_GDN_REPLAY, value_dim, key_dim, loop=True)


def gdn_main_config(value_dim: int, key_dim: int, num_tokens: int, read_copy: bool = False) -> LaunchConfig:
    """The three-launch step's main launch: ``_GDN_DECODE_MAIN`` for T = 1 (``_GDN_DECODE_MAIN_READ`` when it
    reads a 16-bit read copy), ``_GDN_VERIFY_SHORT`` up to ``_GDN_VERIFY_SHORT_MAX_T`` tokens, ``_GDN_VERIFY``
    for longer drafts (verification with a read copy keeps those: not tuned for it)."""
    if num_tokens == 1:
        table = _GDN_DECODE_MAIN_READ if read_copy else _GDN_DECODE_MAIN
    else:
        table = _GDN_VERIFY_SHORT if num_tokens <= _GDN_VERIFY_SHORT_MAX_T else _GDN_VERIFY
    return _pick(table, value_dim, key_dim, loop=False)


# GDN's exact fold with a read copy (docs/ops.md, "Read copy"), in the fold launches: "blocked" (each tile's
# corrections as two tl.dots with the ring's keys and an entries x entries factor N solved once per head;
# 255 registers, 2 programs per multiprocessor on sm_90, Triton 3.6) or "entries" (entry by entry, 154
# registers, 3 programs). decode_kernels.py --read-dtype bf16, 2026-12-03 22:22, H200, batch 256, window 16
# (GDN 16/32 / 16/64): blocked 203.5 / 391.1 us per step, entries 532.8 / 949.0.
# "merged" (the default since run 34): each tile's corrections as one tl.dot with a (keys, entries) factor M formed
# once per head, on two-warp fold programs (_GDN_DECODE_FLUSH_READ); decode_kernels.py --read-dtype bf16, 2026-12-04
# 18:46: 161.2 / 299.1 us per step against 167.2 / 313.7 for "blocked" on its 4-warp, 3-stage launch. The "-tf32x3"
# forms (the corrections' products on the tensor cores, three tf32 products each) lost on every launch shape tried
# (gdn_fold_forms.py, 18:38: 194-209 against 166-179 us staggered at 16/32); they stay as forms for the record and the tests.
# A "chunked" form (merged's sums over 32-key chunks, two passes per tile: 96 registers on 4 warps) lost by 40-50%
# (gdn_fold_forms.py, 2026-12-04 20:30: 227-262 / 427-540 us against 161-181 / 301-354 for merged on the same
# launch shapes, 16/32 / 16/64) and was removed (docs/kernels.md run 37).
GDN_READ_COPY_FOLDS = ("blocked", "entries", "merged", "blocked-tf32x3", "merged-tf32x3")
GDN_READ_COPY_FOLD = "merged"


def gdn_read_copy_fold_constexprs(form: str) -> dict:
    """A read-copy fold form's kernel constexprs: ``READ_FOLD`` (the algorithm: "blocked", "merged" or
    "entries") and ``READ_DOT`` (the precision of the corrections' products)."""
    if form not in GDN_READ_COPY_FOLDS:
        raise ValueError(f"read_copy_fold must be one of {GDN_READ_COPY_FOLDS}, got {form!r}")
    algorithm, _, precision = form.partition("-")
    return dict(READ_FOLD=algorithm, READ_DOT=precision or "ieee")


def gdn_flush_config(value_dim: int, key_dim: int, num_tokens: int = 2, read_copy: bool = False) -> LaunchConfig:
    """The three-launch step's fold launch: ``_GDN_DECODE_FLUSH`` for T = 1 (``_GDN_DECODE_FLUSH_READ`` when the
    step reads a 16-bit read copy), ``_GDN_FLUSH`` for T > 1."""
    if num_tokens == 1:
        table = _GDN_DECODE_FLUSH_READ if read_copy else _GDN_DECODE_FLUSH
    else:
        table = _GDN_FLUSH
    return _pick(table, value_dim, key_dim, loop=True)


def _weights_config(decode_table: dict, verify_table: dict, dim: int, key_dim: int, num_tokens: int) -> LaunchConfig:
    """A weights launch's config (``num_warps`` only): the decoding table for T = 1, the verification
    one for T > 1; 4 warps for shapes missing from the table."""
    table = decode_table if num_tokens == 1 else verify_table
    return table.get((dim, key_dim)) or LaunchConfig(block=1, split=1, num_warps=4)


def gdn_weights_config(value_dim: int, key_dim: int, num_tokens: int) -> LaunchConfig:
    """The three-launch step's weights launch: ``_GDN_DECODE_WEIGHTS`` (T = 1), ``_GDN_WEIGHTS_SHORT`` up to
    ``_GDN_WEIGHTS_SHORT_MAX_T`` tokens, ``_GDN_WEIGHTS`` for longer drafts."""
    verify = _GDN_WEIGHTS_SHORT if num_tokens <= _GDN_WEIGHTS_SHORT_MAX_T else _GDN_WEIGHTS
    return _weights_config(_GDN_DECODE_WEIGHTS, verify, value_dim, key_dim, num_tokens)


def mamba2_weights_config(head_dim: int, state_size: int, num_tokens: int) -> LaunchConfig:
    """The Mamba-2 weights launch: ``_MAMBA2_DECODE_WEIGHTS`` (T = 1) / ``_MAMBA2_WEIGHTS`` (T > 1)."""
    return _weights_config(_MAMBA2_DECODE_WEIGHTS, _MAMBA2_WEIGHTS, head_dim, state_size, num_tokens)


def replay_overlap() -> bool:
    """Whether replay steps overlap their launches (``_OVERLAP_LAUNCHES``), where the GPU can."""
    return _OVERLAP_LAUNCHES


def gdn_conventional_config(value_dim: int, key_dim: int) -> LaunchConfig:
    return _pick(_GDN_CONVENTIONAL, value_dim, key_dim, loop=False)


def gdn_decode_launches(value_dim: int, key_dim: int) -> int:
    """How a GDN decode step (T = 1) runs: 1 = the single replay kernel, 3 = verification's three launches."""
    return _GDN_DECODE_LAUNCHES.get((value_dim, key_dim), 1)


def mamba2_fold_in_main(head_dim: int, state_size: int, num_tokens: int) -> bool:
    """Whether a Mamba-2 replay step folds full rings inside its main launch (else in a flush launch first):
    the table's choice for decoding (T = 1); verification (T > 1) always uses the flush launch."""
    return num_tokens == 1 and _MAMBA2_FOLD_IN_MAIN.get((head_dim, state_size), False)

