"""Inputs: one random-access reader per file format (FASTA, time series), chosen by `open_input`."""
from linpipe.inputs.base import Input, RecordInfo, open_input, stem

__all__ = ["Input", "RecordInfo", "open_input", "stem"]
