"""Exceptions raised by Quiver.

>>> raise PipelineError("explore('pca'): grid(pca, n_components=[]) is empty")
Traceback (most recent call last):
    ...
graph.errors.PipelineError: explore('pca'): grid(pca, n_components=[]) is empty
"""

from __future__ import annotations

__all__ = ["BranchFailureWarning", "PipelineError", "RunError"]


class PipelineError(ValueError):
    """A pipeline definition is wrong; raised when the pipeline is built.

    The message names the node (pipeline name and step) and says how to fix it.
    """


class RunError(RuntimeError):
    """A run could not produce any result (for example: every branch failed).

    Nothing is lost: ``table`` holds every branch with its status, error and
    traceback, exactly as ``Result.table`` would have; ``story`` (when the state machine
    ended the run) its last handlings, ``(stimulus id, events, instructions)``, oldest first.
    """

    def __init__(self, message: str, table=None, story=None):
        super().__init__(message)
        self.table = table
        self.story = list(story or [])


class BranchFailureWarning(UserWarning):
    """Every branch through one alternative failed: the choice was made without it."""
