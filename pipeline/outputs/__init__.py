"""Outputs for people and other tools: genome-browser tracks, Parquet tables, plots."""
