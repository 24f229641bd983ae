"""vLLM's Mamba-2 mixer with its decode routed through ``replayssm::mamba2_step``.

vLLM calls ``conv_ssm_forward(projected_states, output)`` (through
``torch.ops.vllm.mamba_mixer2``) with prefill and decode tokens of one step
together, decodes first. This subclass runs the decode rows itself (conv
window with rollback, then the replay op) and hands the prefill rows to
vLLM's own method with a prefill-only copy of the metadata. Everything else
— projections, gated norm, output projection, weights — is the stock layer.
"""

from __future__ import annotations

import torch
from torch import Tensor
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

from . import _common as C


class ReplayMambaMixer2(C.ReplayLayerMixin, MambaMixer2):
    """``MambaMixer2`` whose decode reads checkpoint + ring instead of writing the state every token."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_replay(self.num_spec, self.prefix, "mamba2")

    # -- the step ----------------------------------------------------------------

    def conv_ssm_forward(self, projected_states: Tensor, output: Tensor):
        metadata_table = get_forward_context().attn_metadata
        md = metadata_table.get(self.prefix) if isinstance(metadata_table, dict) else None
        if md is None or self.replay_state is None:  # profile run, or no cache bound yet
            return super().conv_ssm_forward(projected_states, output)
        nd, ndt = md.num_decodes, md.num_decode_tokens
        npf, npt = md.num_prefills, md.num_prefill_tokens
        if nd > 0:
            self._replay_decode(projected_states[:ndt], output[:ndt], md)
        if npf > 0:
            self._stock_prefill(projected_states[ndt : ndt + npt], output[ndt : ndt + npt], md)

    def _stock_prefill(self, projected_states: Tensor, output: Tensor, md) -> None:
        state = self.replay_state
        slots = md.state_indices_tensor_p.long()
        C.fold_before_prefill(state, slots, md.has_initial_states_p)
        prefill_only = C.replace(
            md, num_decodes=0, num_decode_tokens=0, state_indices_tensor_d=None, query_start_loc_d=None, num_accepted_tokens=None
        )
        with C.swapped_metadata(self.prefix, prefill_only):
            super().conv_ssm_forward(projected_states, output)
        # vLLM wrote the prefill's final state into its state tensor: that is the new checkpoint.
        state.clear_ring(slots)
        C.count("mamba2_prefill_calls")
        C.note_prefill_slots(self.prefix, slots)

    def _replay_decode(self, projected_states: Tensor, output: Tensor, md) -> None:
        state = self.replay_state
        nd, ndt = md.num_decodes, md.num_decode_tokens
        slots = md.state_indices_tensor_d[:nd, 0]
        spec = self.replay.num_spec > 0
        if spec:
            rows = C.spec_rows(slots, md.query_start_loc_d, ndt, self.replay.tokens_per_step, md.num_accepted_tokens)
        else:
            rows = C.DecodeRows(slots=slots.long(), T=1, token_index=None, accepted=None)
        offset = C.commit_previous(rows, state)

        hidden_BC, dt = torch.split(
            projected_states[..., self.tped_intermediate_size :], [self.tped_conv_size, self.tped_dt_size], dim=-1
        )
        conv_state = C.conv_state_dim_last(self.kv_cache[0], is_conv_state_dim_first())
        xBC = C.conv_decode(
            rows.pad(hidden_BC), conv_state, self.conv_weights, self.conv1d.bias, self.activation, rows, offset
        )
        x, B, Cm = self.split_hidden_states_B_C_fn(xBC)
        n, T = rows.n, rows.T
        heads, groups = self.tped_dt_size, self.n_groups // self.tp_size
        y = state.step(
            x.reshape(n, T, heads, self.head_dim),
            rows.pad(dt),
            self.A.float(),
            B.reshape(n, T, groups, -1),
            Cm.reshape(n, T, groups, -1),
            self.D,
            self.dt_bias,
            rows=rows.slots,
            commit=not spec,
        )
        output.copy_(rows.unpad(y).reshape(ndt, -1).to(output.dtype))
        C.count("mamba2_verify_calls" if spec else "mamba2_decode_calls")
