"""Launch configurations: what every family's launch table is made of.

The kernels mutate state, so nothing is autotuned: each family's
``launch.py`` is a table of hand-picked configurations per state shape,
fp32 state, measured on an H200 at batch 256, window 16 (the figures behind
each choice and the forms that lost are in docs/kernels.md). A shape
missing from a table gets ``default_config``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LaunchConfig:
    """How one launch tiles one (row, head) state of ``dim x key_dim``.

    ``block`` rows of the state (head_dim or value_dim direction) per tile, a
    power of two, >= 16 where a fold is a ``tl.dot``; ``split`` programs share
    one head's tiles (each loops over every ``split``-th tile);
    ``form`` names a kernel variant where a kernel has several;
    ``programs_per_sm`` sizes the grid of work-list forms.
    """

    block: int
    split: int
    num_warps: int
    num_stages: int = 1
    form: str = ""
    programs_per_sm: int = 0

    def as_dict(self) -> dict:
        out = {"block": self.block, "split": self.split, "num_warps": self.num_warps, "num_stages": self.num_stages}
        if self.form:
            out["form"] = self.form
        if self.programs_per_sm:
            out["programs_per_sm"] = self.programs_per_sm
        return out


#: Replay steps of several launches start each later launch with programmatic dependent launch on sm_90+
#: (its programs wait in-kernel for the launch before): 0.4-2.4% faster per step, never slower.
OVERLAP_LAUNCHES = True


def default_config(dim: int, key_dim: int, loop: bool) -> LaunchConfig:
    """The rule for shapes missing from a table: 16-row tiles (32 for small keys), 4 warps; ``loop``: one program per head."""
    block = 16 if key_dim >= 64 else 32
    tiles = -(-dim // block)
    return LaunchConfig(block=block, split=1 if loop else tiles, num_warps=4)


def pick(table: dict, dim: int, key_dim: int, loop: bool) -> LaunchConfig:
    """``table[(dim, key_dim)]``, else ``default_config``."""
    return table.get((dim, key_dim)) or default_config(dim, key_dim, loop)


def weights_config(table: dict, dim: int, key_dim: int) -> LaunchConfig:
    """A weights launch (one program per (group or key head, row)): only ``num_warps`` is read; 4 off the table."""
    return table.get((dim, key_dim)) or LaunchConfig(block=1, split=1, num_warps=4)
