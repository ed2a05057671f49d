"""Outputs for people and other tools: genome-browser tracks, Parquet tables, plots."""

# linpipe plot's defaults, here rather than in plot.py so that the CLI's help can name them
# without importing numpy and the store
DNA_SMOOTH = 50  # positions of the rolling mean drawn over per-base (dna) outputs
MAX_CHANNELS = 8  # time-series channels drawn when none is chosen
