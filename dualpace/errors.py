"""Exceptions shared across DualPace modules."""


class DualPaceError(Exception):
    """Base class of every error DualPace raises on purpose."""


class CheckpointError(DualPaceError, ValueError):
    """A checkpoint directory cannot be loaded; the message names the file and tensor."""
