"""vLLM's Qwen Gated DeltaNet layer with its decode routed through ``replayssm::gdn_step``.

vLLM's GDN layer runs its core (conv + recurrence) in ``_forward_core``
(through ``torch.ops.vllm.qwen_gdn_attention_core``) on the GPU; on the CPU
``forward_cpu`` calls a separate CPU core. This subclass makes every
platform go through ``_forward_core`` and overrides it: decode rows
(single-token, or speculative verification) run the conv window with
rollback and the replay op; prefill rows go to vLLM's own core with a
prefill-only copy of the metadata. Projections, gated norm and output
projection are the stock layer's.
"""

from __future__ import annotations

import torch
from torch import Tensor
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
from vllm.platforms import current_platform

from . import _common as C


class ReplayQwenGatedDeltaNet(C.ReplayLayerMixin, QwenGatedDeltaNetAttention):
    """``QwenGatedDeltaNetAttention`` whose decode reads checkpoint + ring."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_replay(self.num_spec, self.prefix, "gdn")
        self._replay_on_cpu = current_platform.is_cpu()
        # The fused CUDA spec-decode path bypasses _forward_core: keep every step on it.
        self.enable_fused_gdn_spec_decode = False

    def _checkpoint(self) -> Tensor:
        """vLLM's recurrent state as ``(slots, value_heads, V, K)``.

        The CPU kernels keep it as ``[slots, heads, K, V]`` in memory (the
        tensor is declared with V before K); the CUDA kernels use the declared
        layout.
        """
        ssm = self.kv_cache[1]
        if self._replay_on_cpu:
            n, h, v, k = ssm.shape
            return ssm.view(n, h, k, v).transpose(-1, -2)
        return ssm

    # -- the step ------------------------------------------------------------------

    def forward_cpu(self, hidden_states: Tensor) -> Tensor:
        # Same projections as the stock CPU forward; the core goes through _forward_core.
        from vllm.utils.torch_utils import _encode_layer_name

        mixed_qkvz, _ = self.in_proj_qkvz(hidden_states)
        ba, _ = self.in_proj_ba(hidden_states)
        if self.gqa_interleaved_layout:
            query, key, value, z, b, a = self.fix_query_key_value_ordering(mixed_qkvz, ba)
            mixed_qkv = torch.cat([t.flatten(-2) for t in (query, key, value)], dim=-1)
        else:
            qkv_size = (self.key_dim * 2 + self.value_dim) // self.tp_size
            mixed_qkv, z = mixed_qkvz.split([qkv_size, self.value_dim // self.tp_size], dim=-1)
            z = z.reshape(z.size(0), -1, self.head_v_dim)
            b, a = self.split_ba(ba)
        core_attn_out = torch.zeros(
            (hidden_states.size(0), self.num_v_heads // self.tp_size, self.head_v_dim),
            dtype=hidden_states.dtype,
            device=hidden_states.device,
        )
        torch.ops.vllm.qwen_gdn_attention_core(
            mixed_qkv, b.contiguous(), a.contiguous(), core_attn_out, layer_name=_encode_layer_name(self.prefix)
        )
        return self._output_projection(core_attn_out, z)

    def _forward_core(self, mixed_qkv: Tensor, b: Tensor, a: Tensor, core_attn_out: Tensor):
        table = get_forward_context().attn_metadata
        md = table.get(self.prefix) if isinstance(table, dict) else None
        if md is None or self.replay_state is None:
            return self._stock_core(mixed_qkv, b, a, core_attn_out, md)
        if md.spec_sequence_masks is not None:
            self._spec_step(mixed_qkv, b, a, core_attn_out, md)
        else:
            self._plain_step(mixed_qkv, b, a, core_attn_out, md)

    def _plain_step(self, mixed_qkv, b, a, core_attn_out, md) -> None:
        nd, ndt, npf, npt = md.num_decodes, md.num_decode_tokens, md.num_prefills, md.num_prefill_tokens
        slots = md.non_spec_state_indices_tensor
        if nd > 0:
            rows = C.DecodeRows(slots=slots[:nd].long(), T=1, token_index=None, accepted=None)
            core_attn_out[:ndt] = self._replay(mixed_qkv[:ndt], b[:ndt], a[:ndt], rows, commit=True)
            C.count("gdn_decode_calls")
        if npf > 0:
            qsl = md.non_spec_query_start_loc
            prefill_md = C.replace(
                md,
                num_decodes=0,
                num_decode_tokens=0,
                num_actual_tokens=npt,
                non_spec_state_indices_tensor=slots[nd : nd + npf],
                non_spec_query_start_loc=qsl[nd : nd + npf + 1] - ndt,
                has_initial_state=md.has_initial_state[nd : nd + npf],
            )
            if nd > 0 and not self._replay_on_cpu:
                # vLLM's CUDA prefill conv reads launch metadata built over decodes + prefills: rebuild it.
                from vllm.v1.attention.backends.utils import compute_causal_conv1d_metadata

                nums_dict, batch_ptr, offsets = compute_causal_conv1d_metadata(
                    prefill_md.non_spec_query_start_loc.cpu(), device=mixed_qkv.device
                )
                prefill_md = C.replace(prefill_md, nums_dict=nums_dict, batch_ptr=batch_ptr, token_chunk_offset_ptr=offsets)
            out = core_attn_out[ndt : ndt + npt]
            self._prefill(mixed_qkv[ndt : ndt + npt], b[ndt : ndt + npt], a[ndt : ndt + npt], out, prefill_md)

    def _spec_step(self, mixed_qkv, b, a, core_attn_out, md) -> None:
        nsd, nsdt = md.num_spec_decodes, md.num_spec_decode_tokens
        mixed = md.num_prefills > 0 or md.num_decodes > 0
        spec_idx = md.spec_token_indx.long() if mixed else None
        take = (lambda t: t.index_select(0, spec_idx)) if mixed else (lambda t: t[:nsdt])
        rows = C.spec_rows(
            md.spec_state_indices_tensor[:nsd, 0], md.spec_query_start_loc, nsdt, self.replay.tokens_per_step, md.num_accepted_tokens
        )
        out = self._replay(take(mixed_qkv), take(b), take(a), rows, commit=False)
        if mixed:
            core_attn_out.index_copy_(0, spec_idx, out.to(core_attn_out.dtype))
        else:
            core_attn_out[:nsdt] = out
        C.count("gdn_verify_calls")
        if md.num_prefills > 0:
            ns_idx = md.non_spec_token_indx.long()
            prefill_md = C.replace(
                md,
                spec_sequence_masks=None,
                spec_sequence_masks_cpu=None,
                spec_token_indx=None,
                non_spec_token_indx=None,
                spec_state_indices_tensor=None,
                spec_query_start_loc=None,
                num_spec_decodes=0,
                num_spec_decode_tokens=0,
                num_accepted_tokens=None,
                num_actual_tokens=md.num_prefill_tokens,
            )
            out = torch.zeros((ns_idx.numel(),) + tuple(core_attn_out.shape[1:]), dtype=core_attn_out.dtype, device=core_attn_out.device)
            self._prefill(mixed_qkv.index_select(0, ns_idx), b.index_select(0, ns_idx), a.index_select(0, ns_idx), out, prefill_md)
            core_attn_out.index_copy_(0, ns_idx, out)

    def _replay(self, mixed_qkv: Tensor, b: Tensor, a: Tensor, rows: C.DecodeRows, commit: bool) -> Tensor:
        state = self.replay_state
        offset = C.commit_previous(rows, state)
        conv_state = C.conv_state_dim_last(self.kv_cache[0], is_conv_state_dim_first())
        weight = getattr(self.conv1d, "_cpu_unpacked_conv_weight", None)
        if weight is None:
            weight = self.conv1d.weight.view(self.conv1d.weight.size(0), -1)
        conv = C.conv_decode(rows.pad(mixed_qkv), conv_state, weight, self.conv1d.bias, self.activation, rows, offset)
        n, T = rows.n, rows.T
        kd, vd = self.key_dim // self.tp_size, self.value_dim // self.tp_size
        q, k, v = torch.split(conv, [kd, kd, vd], dim=-1)
        hk, hv = self.num_k_heads // self.tp_size, self.num_v_heads // self.tp_size
        o = state.step(  # the fused gates: the kernels form g and beta from a and b, as vLLM's own kernels do
            q.reshape(n, T, hk, self.head_k_dim),
            k.reshape(n, T, hk, self.head_k_dim),
            v.reshape(n, T, hv, self.head_v_dim),
            rows.pad(a),
            rows.pad(b),
            rows=rows.slots,
            commit=commit,
            A_log=self.A_log,
            dt_bias=self.dt_bias,
        )
        return rows.unpad(o)

    def _prefill(self, mixed_qkv, b, a, out, prefill_md) -> None:
        state = self.replay_state
        slots = prefill_md.non_spec_state_indices_tensor.long()
        C.fold_before_prefill(state, slots, prefill_md.has_initial_state)
        with C.swapped_metadata(self.prefix, prefill_md):
            self._stock_core(mixed_qkv, b, a, out, prefill_md)
        state.clear_ring(slots)
        C.count("gdn_prefill_calls")
        C.note_prefill_slots(self.prefix, slots)

    def _stock_core(self, mixed_qkv, b, a, core_attn_out, md) -> None:
        if self._replay_on_cpu:
            if md is None:
                return  # profile run: the CPU core does nothing either
            from vllm.model_executor.layers.mamba.ops.cpu.gdn_attention import cpu_gdn_attention_core

            cpu_gdn_attention_core(mixed_qkv, b, a, core_attn_out, self.prefix)
        else:
            super()._forward_core(mixed_qkv, b, a, core_attn_out)
