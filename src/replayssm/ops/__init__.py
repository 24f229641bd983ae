"""The replayssm op surface: ``torch.library`` custom ops under ``replayssm::``.

One folder per op family, each holding its op definitions (schema, argument
check, fake implementation), its PyTorch twin (``reference.py``), its Triton
kernels and its launch table (``launch.py``):

* ``mamba2/``: ``mamba2_step``, ``mamba2_materialize``, ``mamba2_conventional_step``
* ``gdn/``: ``gdn_step``, ``gdn_materialize``, ``gdn_conventional_step``
* ``conv/``: ``causal_conv_step``, the decode step of the conv in front of both
* ``commit/``: ``commit``, the cursor move that accepts verified entries

``dispatch.py`` decides where a call goes (kernel or twin); ``_checks.py``
holds the argument checks every implementation runs first. The ops mutate the
state tensors they are given and return only fresh outputs. ``ReplayState``
(``replayssm.state``) owns the state tensors and is the way to call them;
docs/ops.md documents the layouts and the contract.
"""

from __future__ import annotations

from ._checks import set_value_checks
from .commit import commit
from .conv import causal_conv_step
from .gdn import gdn_conventional_step, gdn_materialize, gdn_step
from .mamba2 import mamba2_conventional_step, mamba2_materialize, mamba2_step

__all__ = [
    "set_value_checks",
    "mamba2_step",
    "mamba2_materialize",
    "mamba2_conventional_step",
    "gdn_step",
    "gdn_materialize",
    "gdn_conventional_step",
    "commit",
    "causal_conv_step",
]
