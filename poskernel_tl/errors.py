"""Whose fault is it? :class:`UserError` and its subclasses are bad input: the command
line prints their one-line message (which names the flag or file to change) and exits 2.
Any other exception is a bug in poskernel_tl: the command line shows the traceback and
asks for a report. Every user error derives from ``ValueError``, so code that caught
``ValueError`` before keeps working."""

import errno
import os
import signal


class UserError(ValueError):
    """Bad input: a flag, a name, a file or an argument the user can change."""


class UnknownNameError(UserError, KeyError):
    """A model, dataset, analysis or preset name that is not known."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ModelUnavailableError(UserError):
    """The weights or a package needed to build the model are not on this machine."""


class DataError(UserError):
    """A dataset cannot be read or does not have enough text."""


class ResultFileError(UserError):
    """A saved condition is missing, corrupt or inconsistent (the message names the file)."""


class NonFiniteError(UserError, FloatingPointError):
    """A forward pass produced NaN/inf logits (e.g. half precision overflowing)."""


class NoConditionError(UserError, FileNotFoundError):
    """A command that reads a folder of results given one that does not exist or holds no
    finished condition: the user's mistake, one line and exit status 2."""


class PlanError(UserError):
    """A run that cannot fit in the memory or time it is given (names the flag to change)."""


class FolderBusyError(UserError):
    """Another process holds the output folder's lock (its PID and command named)."""


class WriteError(UserError, OSError):
    """A file could not be written (a full disk, a read-only file system, no permission):
    names the file and the cause; what was finished before is kept."""

    def __init__(self, path, cause: OSError, detail: str = ""):
        reason = os.strerror(cause.errno) if cause.errno else str(cause)
        todo = "free space or choose another --out" if cause.errno == errno.ENOSPC else \
            "choose another --out"
        super().__init__(f"could not write {path}: {reason}{f' ({detail})' if detail else ''}"
                         f"; finished conditions are kept: {todo}, then rerun to resume")
        self.errno = cause.errno


class Stopped(BaseException):
    """The process was asked to stop by a signal (SIGTERM from a scheduler or ``timeout``):
    raised from the command's handler, like KeyboardInterrupt for SIGINT."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def stop_line(signum: int) -> str:
    """The one line a command stopped by ``signum`` prints (exit status 128 + signum)."""
    return (f"poskernel: stopped by {signal.Signals(signum).name}; finished conditions are "
            "kept; rerun the same command to resume")


BUG_HINT = ("this is a bug in poskernel_tl, not a problem with your input: please report "
            "it with the command you ran and the traceback above")
