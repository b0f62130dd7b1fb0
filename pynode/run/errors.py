"""The run layer's refusals (pynode.run.trainer, .peercheck and the room protocol raise them)."""

from __future__ import annotations

from pynode.core.errors import DaisyError


class ForkError(DaisyError):
    """This peer's state hash or kernel probe differs from the group's at a step."""


class ContributionError(DaisyError):
    """A reduced step covers some microbatch twice or never: it must not be applied."""


class VerificationError(DaisyError):
    """Peers recomputed a microbatch to different results and no strict majority agrees."""


class RoomError(DaisyError):
    """A room action that cannot be done now (a run is going, no peer is ready, ...)."""


class LeftRun(DaisyError):
    """This peer leaves its run without a fault of its own (another peer took it over
    without it): it asks the run's leader to join it again."""


class LeftRoom(RoomError):
    """The host removed or declined this peer: it stops its run where it stands and takes
    part in nothing more (RoomPeer.leave)."""


class OutputError(DaisyError):
    """A file this peer was asked to write (--save, --log, --summary, a kit) cannot be
    written there: found before the run where it can be, else when it is written (the file
    that was there, if any, is left as it was)."""
