"""Speculation bookkeeping over a ``ReplayState``: verifying drafts, accepting some, taking tokens back.

The state does the device work (``step(commit=False)``, ``commit``,
``rollback``, ``fold``, ``resized``); this module holds the rules that sit
around it, for the two kinds of callers:

* **per row** (vLLM: each request has its own accepted count):
  ``commit_verified`` accepts what the engine confirmed of each row's last
  verification, and ``resume`` makes a row's checkpoint its exact state
  before a prefill continues from it;
* **uniform** (Hugging Face ``generate``: every row advances together):
  ``UniformSpeculation`` mirrors the cursor on the host, so a step reads no
  device value, and keeps the tokens since the last rollback in the ring:
  a step that would fold them first folds only the ones before, a draft
  longer than the ring grows it, and ``rollback`` takes tokens back by
  moving cursors.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .config import MAX_WINDOW
from .state import ReplayState


def commit_verified(state: ReplayState, rows: Tensor, accepted: Tensor) -> Tensor:
    """Accept ``accepted[i]`` tokens of row ``rows[i]``'s last verification (at most what it verified).

    A row whose last step was not a verification has nothing pending and
    accepts 0. Returns the counts committed, as int64.
    """
    accepted = torch.minimum(accepted.to(state.pending.dtype), state.pending[rows])
    state.commit(accepted, rows)
    return accepted.long()


def resume(state: ReplayState, rows: Tensor) -> None:
    """Make the checkpoint of ``rows`` their exact state (the ring folded in), for a prefill that continues it.

    A row with an unconfirmed verification cannot be resumed: which of its
    entries count is not known yet.
    """
    if rows.numel() == 0:
        return
    if bool((state.pending[rows] > 0).any()):
        raise RuntimeError(
            "replayssm: a row resumed by a prefill right after an unconfirmed speculative verification; "
            "its accepted count is unknown here"
        )
    state.load(state.materialize(rows), rows)


class UniformSpeculation:
    """Bookkeeping of a state whose rows all advance together.

    ``pending``: tokens of the last verification not yet committed;
    ``rollable``: tokens committed since the last rollback (the ones a
    rollback may still take back); ``cursor``: every row's cursor, mirrored
    on the host (None when unknown). ``on_replace`` is called with the new
    state when the ring is resized.
    """

    def __init__(self, state: ReplayState, on_replace: Callable[[ReplayState], None] | None = None):
        self.state = state
        self.on_replace = on_replace
        self.restart()

    def restart(self) -> None:
        """After ``load`` or ``reset``: empty rings, nothing to take back."""
        self.pending = 0
        self.rollable = 0
        self.cursor: int | None = 0

    def plan(self, num_tokens: int, recording: bool) -> bool:
        """Prepare a step of ``num_tokens`` per row; returns the step's ``commit`` flag.

        Not recording, the step commits at once and nothing is kept
        rollable. Recording, the step's tokens stay pending; the ring grows
        if the rollable tokens and the draft do not fit, and a step that
        would fold the rollable tokens folds only the ones before them.
        """
        if self.pending:
            self.commit(self.pending, rollable=recording)
        if not recording:
            self.cursor = None
            return True
        if self.cursor is None:
            self.cursor = int(self.state.cursor[0])
        need = self.rollable + num_tokens
        if need > self.state.window:
            self.grow(need)
        if self.cursor + num_tokens > self.state.window and self.cursor > self.rollable:
            self.fold_front(self.cursor - self.rollable)
        if self.cursor + num_tokens > self.state.window:  # the step folds the (final) committed entries first
            self.cursor = 0
        return False

    def commit(self, accepted: int, rollable: bool = True) -> None:
        """Accept the first ``accepted`` tokens of the last verification in every row (``rollable``: and keep them so)."""
        state = self.state
        rows = torch.arange(state.slots, device=state.device)
        state.commit(torch.full((state.slots,), accepted, dtype=torch.int32, device=state.device), rows)
        if self.cursor is not None:
            self.cursor += accepted
        if rollable:
            self.rollable += accepted
        self.pending = 0

    def check_rollback(self, n: int, kept: int) -> int:
        """How many committed tokens taking back ``n`` tokens needs; raises if the ring no longer holds them.

        ``kept``: how many tokens a prefill keeps rollable (for the message).
        """
        back = max(n - self.pending, 0)
        if back > self.rollable:
            raise RuntimeError(
                f"replayssm: taking back {n} tokens (crop(-{n})) asks to roll back {back} committed tokens, but only {self.rollable} were "
                f"added since the previous rollback (or since the prefill, which keeps at most {kept} tokens "
                "rollable); use a larger ReplayConfig.window"
            )
        return back

    def rollback(self, n: int, kept: int) -> None:
        """Take the last ``n`` tokens back (pending ones first); afterwards nothing is rollable."""
        back = self.check_rollback(n, kept)
        self.commit(self.pending - min(n, self.pending))
        if back:
            self.state.rollback(back)
            if self.cursor is not None:
                self.cursor -= back
        self.rollable = 0

    def fold_front(self, count: int) -> None:
        """Fold the first ``count`` committed entries of every row; the rest move to the front of the ring."""
        self.state.fold(count)
        self.cursor -= count

    def grow(self, window: int) -> None:
        """A ring of ``window`` entries, for a draft longer than the ring (up to ``MAX_WINDOW``)."""
        if window > MAX_WINDOW:
            raise ValueError(
                f"replayssm: a speculative run of {window} tokens exceeds the largest ring ({MAX_WINDOW}); "
                "draft fewer tokens per verification"
            )
        self._replace(self.state.resized(window))

    def shrink(self, window: int) -> None:
        """Back to a ring of ``window`` entries: every (now final) entry is folded into the checkpoint."""
        if self.state.window <= window:
            return
        self.state.fold(self.state.cursor.clone())
        self._replace(self.state.resized(window))
        self.cursor = 0

    def _replace(self, state: ReplayState) -> None:
        self.state = state
        if self.on_replace is not None:
            self.on_replace(state)
