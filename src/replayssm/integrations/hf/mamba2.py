"""Adapter for the Mamba-2 mixers (mamba2, bamba, falcon_h1, granitemoehybrid, nemotron_h, zamba2).

All six share one shape: ``in_proj`` gives ``[gate | x B C | dt]``, a causal
conv runs over ``x B C``, the SSD recurrence, then the gated RMSNorm and
``out_proj``. The differences that matter to decoding are small enough to be
two hooks: how the projection is formed (FalconH1 scales its input and
output by muP multipliers) and whether the gate goes into the recurrence's
output (FalconH1 without ``mamba_rms_norm``) or into the norm.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ...config import ReplayConfig
from ...state import Mamba2Geometry, Mamba2ReplayState
from .base import MixerAdapter, mask_padding


def _plain_projection(mixer: nn.Module, hidden_states: Tensor) -> Tensor:
    return mixer.in_proj(hidden_states)


def _falcon_projection(mixer: nn.Module, hidden_states: Tensor) -> Tensor:
    return mixer.in_proj(hidden_states * mixer.ssm_in_multiplier) * mixer.mup_vector


@dataclass(frozen=True)
class Mamba2Variant:
    """How one Mamba-2 mixer class departs from the common shape."""

    project: Callable[[nn.Module, Tensor], Tensor] = _plain_projection
    #: True when the gate multiplies the recurrence output (``y * silu(z)``) instead of entering the norm.
    gate_in_recurrence: Callable[[nn.Module], bool] = lambda mixer: False


PLAIN = Mamba2Variant()
FALCON_H1 = Mamba2Variant(project=_falcon_projection, gate_in_recurrence=lambda mixer: not mixer.mamba_rms_norm)


class Mamba2Adapter(MixerAdapter):
    family = "mamba2"
    state_type = Mamba2ReplayState
    mask_after_conv = True

    def __init__(self, mixer: nn.Module, config: ReplayConfig, context, variant: Mamba2Variant = PLAIN):
        super().__init__(mixer, config, context)
        self.variant = variant
        self.gate_in_recurrence = variant.gate_in_recurrence(mixer)
        self.geometry = Mamba2Geometry(
            heads=mixer.num_heads, head_dim=mixer.head_dim, state_size=mixer.ssm_state_size, groups=mixer.n_groups
        )
        if mixer.num_heads * mixer.head_dim != mixer.intermediate_size:
            raise ValueError(
                f"replayssm: {type(mixer).__name__} layer {self.layer_idx}: heads ({mixer.num_heads}) x head_dim "
                f"({mixer.head_dim}) != intermediate_size ({mixer.intermediate_size})"
            )

    def new_state(self, slots: int, config: ReplayConfig, device: torch.device) -> Mamba2ReplayState:
        return Mamba2ReplayState(self.geometry, slots, config, device, activation_dtype=self.activation_dtype)

    def replay(self, hidden_states: Tensor, layer, attention_mask, commit: bool) -> Tensor:
        m, g = self.mixer, self.geometry
        batch, num_tokens, _ = hidden_states.shape
        dtype = hidden_states.dtype
        projected = self.variant.project(m, mask_padding(hidden_states, attention_mask))
        gate, xbc, dt = projected.split([m.intermediate_size, m.conv_dim, m.num_heads], dim=-1)
        xbc = mask_padding(self.conv(layer, xbc.transpose(1, 2)), attention_mask)
        x, B, C = xbc.split([m.intermediate_size, g.groups * g.state_size, g.groups * g.state_size], dim=-1)
        state = layer.replay
        x = x.reshape(batch, num_tokens, g.heads, g.head_dim)
        A = -torch.exp(m.A_log.float())
        B = B.reshape(batch, num_tokens, g.groups, g.state_size)
        C = C.reshape(batch, num_tokens, g.groups, g.state_size)
        z = gate.reshape(batch, num_tokens, g.heads, g.head_dim) if self.gate_in_recurrence else None
        if self.conventional:
            y = state.conventional_step(x, dt, A, B, C, m.D, m.dt_bias, z, rows=layer.replay_rows)
        else:
            y = state.step(x, dt, A, B, C, m.D, m.dt_bias, z, rows=layer.replay_rows, commit=commit)
        y = y.reshape(batch, num_tokens, -1)
        if not self.gate_in_recurrence:
            y = m.norm(y, gate)
        return m.out_proj(y.to(dtype))
