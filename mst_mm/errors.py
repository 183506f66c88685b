"""The two errors a user can fix; our tools print the message and exit with status 2."""
from typing import Sequence


class UserInputError(ValueError):
    """A bad input: a config option, a command-line argument or a data setting."""


class CheckpointError(UserInputError):
    """A checkpoint that is missing, unreadable, unsafe, or not what was asked for."""


def some_keys(keys: Sequence[str], limit: int = 8) -> str:
    """At most ``limit`` of ``keys`` for a message, and how many there are in all."""
    keys = list(keys)
    return ', '.join(keys[:limit]) + (f' ... ({len(keys)} in all)' if len(keys) > limit else '')
