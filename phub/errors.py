"""Exceptions raised by phub. Every error names its culprit (a worker rank, a chunk, a config key)."""


class PHubError(RuntimeError):
    """Base class of every error phub raises on purpose."""


class ConfigError(PHubError, ValueError):
    """A parameter or configuration value is invalid; the message names it."""


class ProtocolError(PHubError):
    """A peer sent a frame that violates the protocol (bad magic, wrong length, unknown chunk...)."""


class JobFailed(PHubError):
    """The job cannot continue: a worker or server core was lost, or a peer reported an error."""


class PHubTimeout(PHubError, TimeoutError):
    """A blocking call did not complete in time; the message says what was still missing."""
