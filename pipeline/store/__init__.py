"""The output store: one Zarr v3 store per job (layout, writer, reader)."""
from linpipe.store.layout import (
    CODEC_CHOICE,
    DEFAULT_OUTPUTS,
    DIM_BASE,
    DIM_CHANNEL,
    DIM_FEATURE,
    DIM_POSITION,
    DIM_TIME,
    FORMAT,
    FORMAT_VERSION,
    OUTPUT_KINDS,
    POSITION_DIM,
    ArraySpec,
    codecs_for,
)
from linpipe.store.reader import IncompleteStoreWarning, OutputReader, open_output
from linpipe.store.records import StoredRecord
from linpipe.store.writer import OutputStore

__all__ = ["CODEC_CHOICE", "DEFAULT_OUTPUTS", "DIM_BASE", "DIM_CHANNEL", "DIM_FEATURE", "DIM_POSITION",
           "DIM_TIME", "FORMAT", "FORMAT_VERSION", "OUTPUT_KINDS", "POSITION_DIM", "ArraySpec",
           "IncompleteStoreWarning", "OutputReader", "OutputStore", "StoredRecord", "codecs_for",
           "open_output"]
