"""The output store: one Zarr v3 store per job (layout, writer, reader)."""
from linpipe.store.writer import (
                                  CODEC_CHOICE,
                                  DEFAULT_OUTPUTS,
                                  FORMAT_VERSION,
                                  OUTPUT_KINDS,
                                  POSITION_DIM,
                                  OutputStore,
                                  codecs_for,
                                  open_output,
)

__all__ = ["CODEC_CHOICE", "DEFAULT_OUTPUTS", "FORMAT_VERSION", "OUTPUT_KINDS", "POSITION_DIM", "OutputStore",
           "codecs_for", "open_output"]
