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


def modality_mismatch(path, input_modality: str, model_ref, model_modality: str) -> ModelError:
    """A series given to a DNA model (or the reverse), with how to get the right model."""
    import shlex

    if input_modality == "timeseries":
        how = ("use --model default-timeseries (the shipped time-series model), or train one: "
               f"linpipe train {shlex.quote(str(path))} --out MODEL_DIR [--time-column COL], "
               "then pass --model MODEL_DIR")
    else:
        how = "use --model default (the shipped DNA model) or a DNA model directory"
    return ModelError(f"{path}: a {input_modality} input, but model {model_ref} is a {model_modality} "
                      f"model; {how}")
