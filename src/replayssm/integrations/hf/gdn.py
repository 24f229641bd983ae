"""Adapter for the Gated DeltaNet mixers (qwen3_next, qwen3_5, qwen3_5_moe, olmo_hybrid).

All share: projections give q, k, v (through a causal conv), a gate z, and
per-value-head ``b`` (beta = sigmoid(b)) and ``a`` (log-decay
``g = -exp(A_log) * softplus(a + dt_bias)``); the delta rule with
l2-normalised q and k; a gated RMSNorm per value head; an output projection.
They differ in how the projections are packed, which the ``project`` hook
of each variant undoes with the mixer's own layers.

Transformers keeps the state as ``(batch, value_heads, key_dim, value_dim)``;
the replay checkpoint is ``(slots, value_heads, value_dim, key_dim)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...config import ReplayConfig
from ...state import GDNGeometry, GDNReplayState
from .base import MixerAdapter, mask_padding
from .projections import StackedProjections

#: project(mixer, outputs) -> (qkv columns (batch, conv_dim, T), z (batch, T, value_dim), b, a (batch, T, value_heads)),
#: ``outputs`` being those of the variant's ``projections`` layers, in order
Projection = Callable[[nn.Module, list[Tensor]], tuple[Tensor, Tensor, Tensor, Tensor]]


def _qwen3_next_projection(mixer: nn.Module, outputs: list[Tensor]):
    q, k, v, z, b, a = mixer.fix_query_key_value_ordering(*outputs)
    qkv = torch.cat([t.reshape(t.shape[0], t.shape[1], -1) for t in (q, k, v)], dim=-1)
    return qkv.transpose(1, 2), z, b, a


def _qwen3_5_projection(mixer: nn.Module, outputs: list[Tensor]):
    qkv, z, b, a = outputs
    return qkv.transpose(1, 2), z, b, a


def _olmo_hybrid_projection(mixer: nn.Module, outputs: list[Tensor]):
    q, k, v, g, b, a = outputs
    return torch.cat([q, k, v], dim=-1).transpose(1, 2), g, b, a


@dataclass(frozen=True)
class GDNVariant:
    #: the mixer's input projections (``nn.Linear`` layers of the hidden state), computed as one GEMM while
    #: patched (projections.py)
    projections: tuple[str, ...]
    project: Projection
    norm: str = "norm"
    out_proj: str = "out_proj"
    #: beta scale: OlmoHybrid's ``allow_neg_eigval`` doubles beta (range (0, 2))
    beta_scale: Callable[[nn.Module], float] = lambda mixer: 1.0


QWEN3_NEXT = GDNVariant(projections=("in_proj_qkvz", "in_proj_ba"), project=_qwen3_next_projection)
QWEN3_5 = GDNVariant(projections=("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"), project=_qwen3_5_projection)
OLMO_HYBRID = GDNVariant(
    projections=("q_proj", "k_proj", "v_proj", "g_proj", "b_proj", "a_proj"),
    project=_olmo_hybrid_projection,
    norm="o_norm",
    out_proj="o_proj",
    beta_scale=lambda mixer: 2.0 if mixer.allow_neg_eigval else 1.0,
)


class GDNAdapter(MixerAdapter):
    family = "gdn"
    state_type = GDNReplayState

    def __init__(self, mixer: nn.Module, config: ReplayConfig, context, variant: GDNVariant):
        super().__init__(mixer, config, context)
        self.variant = variant
        self.beta_scale = variant.beta_scale(mixer)
        self.norm = getattr(mixer, variant.norm)
        self.out_proj = getattr(mixer, variant.out_proj)
        self.projections = StackedProjections(mixer, variant.projections)
        self.geometry = GDNGeometry(
            key_heads=mixer.num_k_heads, value_heads=mixer.num_v_heads, key_dim=mixer.head_k_dim, value_dim=mixer.head_v_dim
        )

    def apply(self) -> None:
        self.projections.bind()

    def restore(self) -> None:
        self.projections.unbind()

    def forward(self, hidden_states: Tensor, *args, **kwargs) -> Tensor:
        # Weights replaced since patch() (model.to(...), load_state_dict(assign=True)): stack them again. Eager
        # calls only: a captured decode step follows an eager prefill, and a per-step check would cost host time.
        if not torch.compiler.is_compiling():
            self.projections.refresh()
        return super().forward(hidden_states, *args, **kwargs)

    def new_state(self, slots: int, config: ReplayConfig, device: torch.device) -> GDNReplayState:
        return GDNReplayState(self.geometry, slots, config, device)

    def state_from_hf(self, state: Tensor) -> Tensor:
        return state.transpose(-1, -2)

    def state_to_hf(self, state: Tensor) -> Tensor:
        return state.transpose(-1, -2).contiguous()

    def replay(self, hidden_states: Tensor, layer, attention_mask, commit: bool) -> Tensor:
        m, g = self.mixer, self.geometry
        batch, num_tokens, _ = hidden_states.shape
        h = mask_padding(hidden_states, attention_mask)
        qkv, z, b, a = self.variant.project(m, self.projections(h))
        qkv = self.conv(layer, qkv)
        key_dim, value_dim = g.key_heads * g.key_dim, g.value_heads * g.value_dim
        q, k, v = qkv.split([key_dim, key_dim, value_dim], dim=-1)
        if self.beta_scale == 1.0:  # the fused gates: the kernels form g and beta from a and b as the model does
            gate_a, gate_b, gate_params = a, b, dict(A_log=m.A_log, dt_bias=m.dt_bias)
        else:  # a scaled beta (OlmoHybrid's allow_neg_eigval) is formed here
            gate_b = b.sigmoid() * self.beta_scale
            gate_a, gate_params = -m.A_log.float().exp() * F.softplus(a.float() + m.dt_bias), {}
        state = layer.replay
        q = q.reshape(batch, num_tokens, g.key_heads, g.key_dim)
        k = k.reshape(batch, num_tokens, g.key_heads, g.key_dim)
        v = v.reshape(batch, num_tokens, g.value_heads, g.value_dim)
        if self.conventional:
            o = state.conventional_step(q, k, v, gate_a, gate_b, rows=layer.replay_rows, **gate_params)
        else:
            o = state.step(q, k, v, gate_a, gate_b, rows=layer.replay_rows, commit=commit, **gate_params)
        o = self.norm(o.reshape(-1, g.value_dim), z.reshape(-1, g.value_dim))
        return self.out_proj(o.reshape(batch, num_tokens, -1))
