"""Errors about what the user gave the engine (a config, a checkpoint, a prompt, an option).

The command line prints these in one line and exits 2; any other exception is a bug and keeps its
traceback.
"""
from __future__ import annotations


class InputError(ValueError):
    """Bad input: the message names the file, field, row or option and the value that is wrong."""


class CheckpointError(InputError, KeyError):
    """A checkpoint that cannot be loaded as it is (a KeyError too, for a missing or stray tensor)."""

    __str__ = Exception.__str__     # KeyError would print the message in quotes


class MissingFileError(InputError, FileNotFoundError):
    """A file the engine needs is not there."""

    __str__ = Exception.__str__
