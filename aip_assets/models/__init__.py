"""Connections to language models: one async client for every role."""
