"""The run layer's refusals (pynode.run.trainer and pynode.run.peercheck raise them)."""

from __future__ import annotations

from pynode.core.errors import DaisyError


class ForkError(DaisyError):
    """This peer's state hash or kernel probe differs from the group's at a step."""


class ContributionError(DaisyError):
    """A reduced step covers some microbatch twice or never: it must not be applied."""


class VerificationError(DaisyError):
    """Peers recomputed a microbatch to different results and no strict majority agrees."""
