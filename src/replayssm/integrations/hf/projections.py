"""One GEMM for a mixer's input projections that all read the same hidden state.

A Qwen3.5 Gated DeltaNet layer projects each token four times (``in_proj_qkv``, ``in_proj_z``,
``in_proj_b``, ``in_proj_a``; OLMo-Hybrid six times, Qwen3-Next twice). In a captured decode step
the two 32-wide products cost about as much as a 2048-wide one, 5 us each per layer at batch 256 on
the H200 (a profile of the captured step): launch and tile latency, not bytes. So while a model is patched, the
adapter computes them as one product over the weights stacked row-wise, then splits the result.

No weight memory is duplicated: ``bind`` stacks the weights into one tensor and points each
layer's parameter at its rows (``param.data = stacked[rows]``), so the model's own forward (the
prefill) and ``state_dict`` see the same values, and the old storages are freed. ``unbind`` (from
``unpatch``) gives each parameter a storage of its own again. If the parameters stop pointing at
the stacked rows (``model.to(...)``, ``param.data = ...`` by the user), ``refresh``, run before
every eager call, stacks them again; in-place writes (``load_state_dict``, ``copy_``) go to the
stacked rows and need nothing.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import Tensor, nn

logger = logging.getLogger(__name__)


def stack_refusal(layers: list[nn.Module]) -> str | None:
    """Why ``layers`` cannot share one stacked weight (None if they can)."""
    for layer in layers:
        if type(layer) is not nn.Linear:  # quantised or otherwise wrapped linears compute something else
            return f"{type(layer).__name__} is not a plain torch.nn.Linear"
        if layer._forward_hooks or layer._forward_pre_hooks or "forward" in layer.__dict__:
            return "a forward hook is registered on one of the projections, or its forward replaced (accelerate)"
        if type(layer.weight) is not nn.Parameter or type(layer.weight.data) is not torch.Tensor:
            return "a projection weight is a tensor subclass"
        if layer.weight.device.type == "meta":
            return "a projection weight is on the meta device"
    first = layers[0].weight
    if any(lay.weight.dtype != first.dtype or lay.weight.device != first.device for lay in layers):
        return "the projection weights differ in dtype or device"
    if any(lay.weight.shape[1] != first.shape[1] for lay in layers):
        return "the projections take inputs of different widths"
    if len({lay.bias is None for lay in layers}) > 1:
        return "some projections have a bias and some do not"
    if len({id(lay.weight) for lay in layers}) < len(layers):
        return "two projections share a weight"
    return None


class StackedProjections:
    """The layers ``names`` of ``module`` computed as one ``F.linear``; call ``bind`` to start."""

    def __init__(self, module: nn.Module, names: tuple[str, ...]):
        self.module = module
        self.names = names
        self.weight: Tensor | None = None  # (sum of out_features, in_features) once bound
        self.bias: Tensor | None = None
        self._pointers: tuple[int, ...] = ()

    def layers(self) -> list[nn.Linear]:
        return [getattr(self.module, name) for name in self.names]

    @property
    def bound(self) -> bool:
        return self.weight is not None

    def bind(self) -> bool:
        """Stack the weights and point the layers at their rows; False (nothing changed) if they cannot be."""
        layers = self.layers()
        reason = stack_refusal(layers)
        if reason is not None:
            logger.info("replayssm: %s keeps its projections %s apart: %s", type(self.module).__name__, self.names, reason)
            return False
        with torch.no_grad():
            weight = torch.cat([lay.weight for lay in layers])
            bias = None if layers[0].bias is None else torch.cat([lay.bias for lay in layers])
            start = 0
            for lay in layers:
                rows = slice(start, start + lay.weight.shape[0])
                lay.weight.data = weight[rows]
                if bias is not None:
                    lay.bias.data = bias[rows]
                start = rows.stop
        # a captured step (CUDA graphs) reads them in place, like the model's parameters
        torch._dynamo.mark_static_address(weight)
        if bias is not None:
            torch._dynamo.mark_static_address(bias)
        self.weight, self.bias = weight, bias
        self._pointers = self._current_pointers()
        return True

    def unbind(self) -> None:
        """Give each layer's parameters storage of their own again (the stacked tensor is then freed)."""
        if not self.bound:
            return
        with torch.no_grad():
            for lay in self.layers():
                if _same_storage(lay.weight, self.weight):
                    lay.weight.data = lay.weight.data.clone()
                if lay.bias is not None and self.bias is not None and _same_storage(lay.bias, self.bias):
                    lay.bias.data = lay.bias.data.clone()
        self.weight = self.bias = None
        self._pointers = ()

    def refresh(self) -> None:
        """Re-stack if the layers' parameters no longer point at the stacked rows (host-side check, no sync)."""
        if self.bound and self._current_pointers() != self._pointers:
            self.weight = self.bias = None  # dropped: bind stacks the weights as they are now
            self.bind()

    def __call__(self, hidden_states: Tensor) -> list[Tensor]:
        """The layers' outputs, in the order of ``names``."""
        if not self.bound:
            return [lay(hidden_states) for lay in self.layers()]
        out = F.linear(hidden_states, self.weight, self.bias)
        return list(out.split([lay.out_features for lay in self.layers()], dim=-1))

    def _current_pointers(self) -> tuple[int, ...]:
        params = [p for lay in self.layers() for p in (lay.weight, lay.bias) if p is not None]
        return tuple(p.data_ptr() for p in params)


def _same_storage(a: Tensor, b: Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
