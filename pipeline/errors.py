"""User-facing errors.

Anything a user can cause (a bad file, a bad flag, a bad model directory) raises
LinpipeError with a one-line message that names the file, the record and the place.
The CLI prints it as `Error: ...` and exits non-zero; it never shows a traceback.
"""


class LinpipeError(Exception):
    """An error caused by the user's input or environment, with a message that says what to fix."""


class InputError(LinpipeError):
    """A malformed or unreadable input file (FASTA, Parquet, CSV, ...)."""


class ModelError(LinpipeError):
    """A malformed, mismatched or unreadable model directory."""


class StoreError(LinpipeError):
    """An output store that cannot be created, opened or written."""
