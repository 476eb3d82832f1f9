"""Shared test helpers: tiny models, a fake engine, input files and output readers, task references."""
