"""The two errors a user can fix; our tools print the message and exit with status 2."""


class UserInputError(ValueError):
    """A bad input: a config option, a command-line argument or a data setting."""


class CheckpointError(UserInputError):
    """A checkpoint that is missing, unreadable, unsafe, or not what was asked for."""
