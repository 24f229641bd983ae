"""The launcher of ``gdn_step``: which GDN kernels a replay step runs, in which order, with which configuration.

Decoding, one token per row (docs/ops.md, SPEC §2), off the launch table's
shapes: ``_gdn_replay_kernel`` (decode.py)
runs one program per (tile group, value head, row). A program computes the
per-head quantities once (normalised q and k, the ring keys' dot products
``k_i . k_t`` and ``k_i . q_t`` with their decays), then for each tile of
value rows reads the checkpoint once for both ``S_c k`` and ``S_c q``, forms
``r = S_{t-1} k_t``, the corrected update ``d_t = beta (v - alpha r)`` and
``o_t``, and writes ``d_t`` into the ring. Rows whose ring is full fold it
first (``S <- exp(g_i) S + d_i k_i^T`` in fp32) and write the checkpoint.
``_gdn_append_kernel`` (one program per row) then writes the normalised key
and the log-decay, which every tile of a row reads, and moves the cursor.

Verification, T > 1 tokens per row (SPEC §3), three launches (decoding can
take them too: ``decode_launches=3``, or the ``launch.decode_launches`` table):

1. ``_gdn_flush_kernel`` over (tile group, value head, row): rows whose ring
   cannot take T more entries fold it into the checkpoint (fp32, stored in
   the checkpoint dtype); every other program exits after reading its
   cursor. The only checkpoint write. Its "worklist" form (the decoding
   table's) has a fixed grid of a few programs per multiprocessor looping
   over the folding rows' items instead (fold.py).
2. ``_gdn_weights_kernel`` over (key head, row): the key-side products, once
   per key head for its value heads, into a scratch of per-token weights
   (ring, causal of o, checkpoint decay) and the T x T matrix
   ``N = (I + diag(beta) C)^{-1} diag(beta)`` (C: the causal weights of r),
   solved per value head by forward substitution in fp32; plus the normalised
   k and scaled q of the new tokens; appends k and g at the row's ring
   positions and records the first of them (verify.py).
3. ``_gdn_main_kernel`` over (tile, value head, row), shaped like the
   conventional kernel: from one read of a checkpoint tile and the ring's d
   slice, the checkpoint + ring parts A and B of r and o for all T tokens
   (rows x T), then all corrected updates at once, ``D = (V - A) N^T``, and
   the outputs ``O = B + D W'^T`` (W': causal weights of o), in registers:
   no token waits on another's d through memory. Writes the outputs and the
   d entries (one block store each), never the state. One program per row
   moves the cursor. Its ``"mma"`` form (the verification table's for drafts
   of 3 tokens or more) forms these products as tensor-core dots in tf32x3,
   the checkpoint product over key chunks whose loads are pipelined (verify.py).


Launches are ordered, which is the only synchronisation between them: each
ring position and the cursor change only in a launch after every reader of
them. On sm_90+ launches 2 and 3 overlap the one before (programmatic
dependent launch, ``launch.OVERLAP_LAUNCHES``): their programs wait in-kernel
for it before touching anything it writes. Nothing is read on the host; the
only allocations are the output and the scratch, so a step can be captured
in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
from torch import Tensor

from .. import launch as launch_defaults
from ..launch import LaunchConfig
from ..triton_helpers import check_form, device_context, next_pow2, overlap_launches, pdl_launch_options, worklist_grid
from . import launch
from .decode import _gdn_append_kernel, _gdn_replay_kernel
from .fold import _gdn_flush_kernel
from .verify import _gdn_main_kernel, _gdn_weights_kernel

#: Key columns per dot of the main launch's "mma" form (_main_tile_mma): 32 beat 16 and whole-tile dots by 1-9%.
_MMA_KEY_CHUNK = 32


def scale_or_default(scale: float | None, key_dim: int) -> float:
    return key_dim**-0.5 if scale is None else float(scale)


def tiles_of(dim: int, cfg: LaunchConfig) -> tuple[int, int]:
    num_tiles = triton.cdiv(dim, cfg.block)
    return num_tiles, min(cfg.split, num_tiles)


def gdn_step_out(
    q, k, v, g, beta, checkpoint, ring_k, ring_d, ring_g, cursor, pending,
    rows, commit: bool, use_qk_l2norm: bool, scale: float | None, o: Tensor, config: LaunchConfig | None = None,
    flush_config: LaunchConfig | None = None, decode_launches: int | None = None, weights_config: LaunchConfig | None = None,
    overlap: bool | None = None, read_checkpoint: Tensor | None = None, ring_beta: Tensor | None = None,
    A_log: Tensor | None = None, dt_bias: Tensor | None = None,
) -> None:  # fmt: skip
    """The replay step writing its outputs into ``o``; see ``replayssm.ops.gdn_step``.

    T = 1 (decoding) runs ``_gdn_replay_kernel`` (``config``, default ``launch.single_kernel_config``) and the
    append, or, with ``decode_launches=3`` (default from ``launch.decode_launches``), the three launches
    of verification. T > 1 (verification) runs ``_gdn_flush_kernel`` (``flush_config``, default from
    ``launch.fold_config``), ``_gdn_weights_kernel`` (``weights_config``: only its ``num_warps`` counts;
    default from ``launch.weights_launch_config``) and ``_gdn_main_kernel`` (``config``, default from
    ``launch.main_config``). ``overlap`` (default ``launch.OVERLAP_LAUNCHES``): the weights and main launches
    with programmatic dependent launch where the GPU has it (``triton_helpers.overlap_launches``).
    ``read_checkpoint`` (SPEC §4): the main launch reads it instead of the checkpoint, and the fold
    launches write both, folding exactly with ``ring_beta`` (required with a copy); decoding then always takes the three
    launches (the single kernel reads and folds the same tiles, so it has no read copy).
    ``A_log``, ``dt_bias``: the fused gates (g and beta are the raw a and b; ``tiles.raw_decay``, ``raw_beta``).
    """
    batch, num_tokens, key_heads, key_dim = k.shape
    value_heads, value_dim = v.shape[2], v.shape[3]
    if decode_launches is None:
        decode_launches = 3 if read_checkpoint is not None else launch.decode_launches(value_dim, key_dim)
    if decode_launches not in (1, 3):
        raise ValueError(f"gdn_step_out: decode_launches must be 1 or 3, got {decode_launches}")
    if decode_launches == 1 and num_tokens == 1 and read_checkpoint is not None:
        raise ValueError("gdn_step_out: the single decode kernel has no read copy; pass decode_launches=3 with read_checkpoint")
    if (read_checkpoint is None) != (ring_beta is None):
        raise ValueError("gdn_step_out: ring_beta goes with read_checkpoint (the exact fold of a copy needs it): pass both or neither")
    if num_tokens > 1 or decode_launches == 3:
        _gdn_three_launches(
            q, k, v, g, beta, checkpoint, ring_k, ring_d, ring_g, cursor, pending, rows, commit, use_qk_l2norm, scale, o, config, flush_config,
            weights_config, launch_defaults.OVERLAP_LAUNCHES if overlap is None else overlap, read_checkpoint, ring_beta, A_log, dt_bias,
        )  # fmt: skip
        return
    window = ring_k.shape[1]
    cfg = config or launch.single_kernel_config(value_dim, key_dim)
    check_form("_gdn_replay_kernel", cfg)
    num_tiles, split = tiles_of(value_dim, cfg)
    q1, k1, v1, g1, beta1, o1 = q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], o[:, 0]
    with device_context(v):
        _gdn_replay_kernel[(split, value_heads, batch)](
            p_q=q1, p_k=k1, p_v=v1, p_g=g1, p_beta=beta1, p_A_log=A_log, p_dt_bias=dt_bias, p_o=o1,
            p_ckpt=checkpoint, p_ring_k=ring_k, p_ring_d=ring_d, p_ring_g=ring_g, p_cursor=cursor, p_rows=rows,
            s_q_b=q1.stride(0), s_q_h=q1.stride(1), s_q_k=q1.stride(2),
            s_k_b=k1.stride(0), s_k_h=k1.stride(1), s_k_k=k1.stride(2),
            s_v_b=v1.stride(0), s_v_h=v1.stride(1), s_v_v=v1.stride(2),
            s_g_b=g1.stride(0), s_g_h=g1.stride(1),
            s_beta_b=beta1.stride(0), s_beta_h=beta1.stride(1),
            s_o_b=o1.stride(0), s_o_h=o1.stride(1), s_o_v=o1.stride(2),
            **dict(zip(("s_ck_s", "s_ck_h", "s_ck_v", "s_ck_k"), checkpoint.stride())),
            **dict(zip(("s_rk_s", "s_rk_l", "s_rk_h", "s_rk_k"), ring_k.stride())),
            **dict(zip(("s_rd_s", "s_rd_l", "s_rd_h", "s_rd_v"), ring_d.stride())),
            **dict(zip(("s_rg_s", "s_rg_l", "s_rg_h"), ring_g.stride())),
            V=value_dim, K=key_dim, L=window, value_per_key=value_heads // key_heads, scale=scale_or_default(scale, key_dim),
            L2NORM=use_qk_l2norm, RAW_GATES=A_log is not None,
            BLOCK_V=cfg.block, BLOCK_K=next_pow2(key_dim), BLOCK_L=max(next_pow2(window), 16),
            NUM_TILES=num_tiles, SPLIT=split,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
        _gdn_append(k, g, ring_k, ring_g, cursor, pending, rows, commit, use_qk_l2norm, value_heads, A_log, dt_bias)


def _gdn_three_launches(
    q, k, v, g, beta, checkpoint, ring_k, ring_d, ring_g, cursor, pending,
    rows, commit, use_qk_l2norm, scale, o, config, flush_config, weights_config, overlap: bool, read_checkpoint: Tensor | None,
    ring_beta: Tensor | None, A_log: Tensor | None, dt_bias: Tensor | None,
) -> None:  # fmt: skip
    batch, num_tokens, key_heads, key_dim = k.shape
    value_heads, value_dim = v.shape[2], v.shape[3]
    window = ring_k.shape[1]
    value_per_key = value_heads // key_heads
    block_k, block_l, block_t = next_pow2(key_dim), next_pow2(window), next_pow2(num_tokens)
    # Per-call scratch (like the output): weights per (row, value head, token), normalised k / scaled q
    # per (row, key head), each row's first new ring position.
    weights = torch.empty(batch, value_heads, num_tokens, 2 * window + 2 * num_tokens + 1, dtype=torch.float32, device=v.device)
    qk = torch.empty(batch, key_heads, 2, num_tokens, key_dim, dtype=torch.float32, device=v.device)
    pos = torch.empty(batch, dtype=torch.int32, device=v.device)
    ck_strides = dict(zip(("s_ck_s", "s_ck_h", "s_ck_v", "s_ck_k"), checkpoint.stride()))
    rk_strides = dict(zip(("s_rk_s", "s_rk_l", "s_rk_h", "s_rk_k"), ring_k.stride()))
    rd_strides = dict(zip(("s_rd_s", "s_rd_l", "s_rd_h", "s_rd_v"), ring_d.stride()))
    rg_strides = dict(zip(("s_rg_s", "s_rg_l", "s_rg_h"), ring_g.stride()))
    scratch_strides = dict(
        **dict(zip(("s_w_b", "s_w_h", "s_w_t"), weights.stride()[:3])),
        **dict(zip(("s_qk_b", "s_qk_h", "s_qk_i", "s_qk_t"), qk.stride()[:4])),
    )  # fmt: skip
    # Every launch's configuration is checked before the first launch: a bad one must not leave a half-done step.
    fcfg = flush_config or launch.fold_config(value_dim, key_dim)
    wcfg = weights_config or launch.weights_launch_config(value_dim, key_dim, num_tokens)
    cfg = config or launch.main_config(value_dim, key_dim, num_tokens, read_checkpoint is not None)
    check_form("_gdn_flush_kernel", fcfg, ("", "worklist"))
    check_form("_gdn_weights_kernel", wcfg, ("", "dot"))
    ring_dot = wcfg.form == "dot"
    check_form("_gdn_main_kernel", cfg, ("", "mma"))
    mma = cfg.form == "mma"
    if mma and (cfg.block < 16 or key_dim < 16):
        raise ValueError(f"_gdn_main_kernel: the 'mma' form needs tiles of >= 16 rows and key_dim >= 16 (tl.dot), got {cfg.block} / {key_dim}")
    if fcfg.block < 16:
        raise ValueError(f"_gdn_flush_kernel: the fold needs tiles of >= 16 rows (tl.dot), got {fcfg.block}")
    fold_tiles, fold_split = tiles_of(value_dim, fcfg)
    work_list = fcfg.form == "worklist"
    flush_grid = (worklist_grid(v.device, batch * value_heads * fold_split, fcfg),) if work_list else (fold_split, value_heads, batch)
    use_pdl = overlap_launches(v.device, overlap)
    later = pdl_launch_options(use_pdl)  # the launches after the step's first, a plain one (its inputs come from before the op)
    has_read = read_checkpoint is not None
    ring_beta_arg = ring_beta if has_read else ring_g  # (not read without a copy)
    # Verification with a copy reads the checkpoint (docs/ops.md, "Read copy"); decoding reads the copy.
    exact_reads = has_read and num_tokens > 1
    fold_args = dict(
        p_ckpt=checkpoint, p_read=read_checkpoint, HAS_READ=has_read, EXACT_READS=exact_reads,
        p_ring_k=ring_k, p_ring_d=ring_d, p_ring_g=ring_g, p_ring_beta=ring_beta_arg, p_rows=rows, **ck_strides, **rk_strides, **rd_strides,
        **rg_strides, V=value_dim, K=key_dim, L=window, value_per_key=value_per_key, batch=batch, heads=value_heads, T=num_tokens,
        USE_PDL=use_pdl, BLOCK_V=fcfg.block, BLOCK_K=block_k, BLOCK_L=max(block_l, 16), NUM_TILES=fold_tiles, SPLIT=fold_split,
        BLOCK_B=next_pow2(batch), num_warps=fcfg.num_warps, num_stages=fcfg.num_stages,
    )  # fmt: skip
    with device_context(v):
        _gdn_flush_kernel[flush_grid](p_cursor=cursor, WORKLIST=work_list, **fold_args)
        _gdn_weights_kernel[(key_heads, batch)](
            p_q=q, p_k=k, p_g=g, p_beta=beta, p_A_log=A_log, p_dt_bias=dt_bias, p_ring_k=ring_k, p_ring_g=ring_g, p_ring_beta=ring_beta_arg, p_cursor=cursor, p_rows=rows,
            p_w=weights, p_qk=qk, p_pos=pos, HAS_READ=has_read, EXACT_READS=exact_reads, RAW_GATES=A_log is not None,
            **dict(zip(("s_q_b", "s_q_t", "s_q_h", "s_q_k"), q.stride())),
            **dict(zip(("s_k_b", "s_k_t", "s_k_h", "s_k_k"), k.stride())),
            **dict(zip(("s_g_b", "s_g_t", "s_g_h"), g.stride())),
            **dict(zip(("s_beta_b", "s_beta_t", "s_beta_h"), beta.stride())),
            **rk_strides, **rg_strides, **scratch_strides,
            K=key_dim, L=window, value_per_key=value_per_key, scale=scale_or_default(scale, key_dim),
            T=num_tokens, L2NORM=use_qk_l2norm, USE_PDL=use_pdl,
            BLOCK_J=next_pow2(value_per_key), BLOCK_K=max(block_k, 16) if ring_dot else block_k,
            BLOCK_L=max(block_l, 16) if ring_dot else block_l, BLOCK_T=block_t,
            **(dict(RING_DOT=True, BLOCK_M=max(16, next_pow2(2 * num_tokens))) if ring_dot else {}),
            num_warps=wcfg.num_warps, **later,
        )  # fmt: skip
        num_tiles, split = tiles_of(value_dim, cfg)
        _gdn_main_kernel[(split, value_heads, batch)](
            # The checkpoint this launch reads: the read copy in decoding with one (same strides).
            p_v=v, p_o=o, p_ckpt=read_checkpoint if has_read and not exact_reads else checkpoint, p_ring_d=ring_d,
            p_cursor=cursor, p_pending=pending, p_rows=rows,
            p_w=weights, p_qk=qk, p_pos=pos,
            **dict(zip(("s_v_b", "s_v_t", "s_v_h", "s_v_v"), v.stride())),
            **dict(zip(("s_o_b", "s_o_t", "s_o_h", "s_o_v"), o.stride())),
            **ck_strides, **rd_strides, **scratch_strides,
            V=value_dim, K=key_dim, L=window, value_per_key=value_per_key, T=num_tokens, COMMIT=commit,
            USE_PDL=use_pdl, MMA=mma,
            BLOCK_V=cfg.block, BLOCK_K=block_k, BLOCK_L=max(block_l, 16) if mma else block_l, BLOCK_T=block_t,
            BLOCK_M=max(16, next_pow2(2 * num_tokens)), NUM_TILES=num_tiles, SPLIT=split, BLOCK_KC=min(_MMA_KEY_CHUNK, block_k),
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **later,
        )  # fmt: skip


def _gdn_append(k, g, ring_k, ring_g, cursor, pending, rows, commit, use_qk_l2norm, value_heads, A_log, dt_bias) -> None:
    batch, num_tokens, key_heads, key_dim = k.shape
    _gdn_append_kernel[(batch,)](
        p_k=k, p_g=g, p_A_log=A_log, p_dt_bias=dt_bias, p_ring_k=ring_k, p_ring_g=ring_g, p_cursor=cursor, p_pending=pending, p_rows=rows,
        **dict(zip(("s_k_b", "s_k_t", "s_k_h", "s_k_k"), k.stride())),
        **dict(zip(("s_g_b", "s_g_t", "s_g_h"), g.stride())),
        **dict(zip(("s_rk_s", "s_rk_l", "s_rk_h", "s_rk_k"), ring_k.stride())),
        **dict(zip(("s_rg_s", "s_rg_l", "s_rg_h"), ring_g.stride())),
        T=num_tokens, L=ring_k.shape[1], HK=key_heads, HV=value_heads, K=key_dim,
        COMMIT=commit, L2NORM=use_qk_l2norm, RAW_GATES=A_log is not None,
        BLOCK_HK=next_pow2(key_heads), BLOCK_K=next_pow2(key_dim), BLOCK_HV=next_pow2(value_heads),
        num_warps=4,
    )  # fmt: skip


def gdn_step(
    q, k, v, g, beta, checkpoint, ring_k, ring_d, ring_g, cursor, pending,
    rows, commit: bool, use_qk_l2norm: bool, scale: float | None, read_checkpoint: Tensor | None = None,
    ring_beta: Tensor | None = None, A_log: Tensor | None = None, dt_bias: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """The launcher of ``replayssm.ops.gdn_step`` (fp32 / fp16 / bf16)."""
    args = (q, k, v, g, beta, checkpoint, ring_k, ring_d, ring_g, cursor, pending, rows, commit, use_qk_l2norm, scale)
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)  # contiguous, as the fake kernel says (v may be strided)
    gdn_step_out(*args, o=o, read_checkpoint=read_checkpoint, ring_beta=ring_beta, A_log=A_log, dt_bias=dt_bias)
    return o
