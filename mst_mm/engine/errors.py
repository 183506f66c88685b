"""Errors the user can fix: our tools print the message and exit with status 2.

Each also derives from the built-in exception the same failure raised before, so code that
caught ``FileNotFoundError`` or ``UnpicklingError`` keeps working.
"""
import pickle


class UserInputError(Exception):
    """A bad input: a checkpoint, a config option or a command-line argument."""


class ConfigOptionError(UserInputError, ValueError):
    """A ``--cfg-options`` entry with a bad syntax, or a key that cannot be merged."""


class CheckpointError(UserInputError):
    """A checkpoint file that cannot be used for what was asked."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """The checkpoint file does not exist."""


class UnreadableCheckpointError(CheckpointError, RuntimeError):
    """The file is empty, truncated, corrupted, or not a PyTorch checkpoint at all."""


class UnsafeCheckpointError(CheckpointError, pickle.UnpicklingError):
    """The pickle asks for a global that weights-only loading does not allow."""


class NotATrainingCheckpointError(CheckpointError, ValueError):
    """A readable checkpoint without the training state that ``--resume`` needs."""


class IncompleteCheckpointError(CheckpointError, ValueError):
    """A checkpoint that leaves weights of the model at their random initialisation."""


class NotATestConfigError(UserInputError, ValueError):
    """A config that has nothing to test (no test split or metric), e.g. a pretraining one."""


class ConfigValueError(UserInputError, ValueError):
    """A config setting that cannot work as given; the message names it and the fix."""
