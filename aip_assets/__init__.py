"""aip_assets: a Dagster-native evaluation pipeline for LLM systems."""

__version__ = "0.1.0"
