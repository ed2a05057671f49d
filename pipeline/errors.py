"""User-facing errors.

Anything a user can cause (a bad file, a bad flag, a bad model directory) raises
LinpipeError with a one-line message that names the file, the record and the place.
The CLI prints it as `Error: ...` and exits non-zero; it never shows a traceback.

A message that names an option writes it with `option(name)`: each front end spells it its own
way (the CLI as its flag, a spec file as its key); str() spells it as the library keyword.
"""
import re

_OPTION = re.compile(r"\{option:(\w+)\}")


def option(name: str) -> str:
    """An option named in a message (`name`: its keyword, e.g. "unit_size")."""
    return f"{{option:{name}}}"


def render(text: str, spell=lambda name: name) -> str:
    """A message (an error's, a note's) with each option spelt by `spell(name)`."""
    return _OPTION.sub(lambda m: spell(m.group(1)), text)


class LinpipeError(Exception):
    """An error caused by the user's input or environment, with a message that says what to fix."""

    def render(self, spell=lambda name: name) -> str:
        """The message with each option spelt by `spell(name)`."""
        return render(super().__str__(), spell)

    def __str__(self) -> str:
        return self.render()


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
        how = (f"use {option('model')} default-timeseries (the shipped time-series model), or train one "
               f"with linpipe train on {shlex.quote(str(path))} ({option('out')} MODEL_DIR, and "
               f"{option('time_column')} COL if it has one), then pass {option('model')} MODEL_DIR")
    else:
        how = f"use {option('model')} default (the shipped DNA model) or a DNA model directory"
    return ModelError(f"{path}: a {input_modality} input, but model {model_ref} is a {model_modality} "
                      f"model; {how}")
