"""Named errors of the core. Each is raised before any state changes."""


class DaisyError(Exception):
    """Base of every error DaisyChain raises on purpose."""


class NonFiniteError(DaisyError, FloatingPointError):
    """A NaN or Inf reached a quantizer, a gradient or a checkpoint."""


class AccumulatorBoundError(DaisyError, OverflowError):
    """A GEMM's K exceeds what the int32 accumulator holds exactly (131,071)."""


class ShapeError(DaisyError, ValueError):
    """Operands of the wrong shape or dtype."""


class UnitVerificationError(DaisyError):
    """A verified unit network or its lookup table disagrees with integer arithmetic."""


class GateError(DaisyError):
    """No GEMM backend passed its exact gate, or a live audit found a wrong cell."""


class FixedPointOverflowError(DaisyError, OverflowError):
    """A value does not fit the int64 fixed-point format, or a reduction would wrap."""


class NoGemmError(DaisyError, TypeError):
    """An int8 GEMM was asked of a model built without one (its task says uses_units =
    False: a plain-float task has no verified GEMM)."""
