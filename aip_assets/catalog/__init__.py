"""Catalogues: protected attributes and personas (en, de)."""
