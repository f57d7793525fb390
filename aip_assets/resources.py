"""Dagster resources: the warehouse, and the SUT a launch evaluates.

Both show in the UI's Resources tab and in the launch dialog's config, so a run launched from the
UI can write another warehouse or point a registered spec at another SUT without editing YAML:

- ``warehouse`` (:class:`Warehouse`): the DuckDB file the stages read and write (empty: the
  project's, ``data/warehouse.duckdb``, or ``$AIP_WAREHOUSE``).
- ``sut`` (:class:`SutConnection`): used by the launcher job ``aip_launch`` (schedules, the
  new-spec sensor, or a launch from its Launchpad). Empty: the spec's own ``sut``. With a
  ``base_url``, the run registered by that launch evaluates this OpenAI-compatible endpoint
  instead, recorded as the run's SUT in its stored spec.

Secrets stay out of Dagster: ``api_key_env`` names the environment variable that holds the key
(as in a spec); the key itself is read from the environment at call time and is never part of
the run's config, its stored spec, a log or metadata.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dagster import ConfigurableResource, InitResourceContext
from pydantic import Field

from .runspec import RunSpec, parse_spec
from .settings import override


class Warehouse(ConfigurableResource):
    """The DuckDB warehouse the stages read and write.

    While a run's step uses it, its ``path`` is this process's warehouse (``settings.override``),
    so every read and write of the step finds that file; restored when the step ends.
    """

    path: str = Field(
        default="", description="DuckDB file; empty: $AIP_WAREHOUSE, else data/warehouse.duckdb in the project"
    )

    @contextmanager
    def yield_for_execution(self, context: InitResourceContext) -> Iterator[Warehouse]:
        with override(**({"warehouse": Path(os.path.abspath(self.path))} if self.path else {})):
            yield self


class SutConnection(ConfigurableResource):
    """An OpenAI-compatible SUT endpoint to evaluate instead of the spec's own (empty: the spec's)."""

    base_url: str = Field(default="", description="e.g. http://localhost:8000/v1; empty keeps the spec's sut")
    model: str = Field(default="", description="the model name the endpoint serves")
    api_key_env: str = Field(
        default="", description="name of the environment variable holding its API key (never the key)"
    )

    def apply(self, spec: RunSpec) -> RunSpec:
        """``spec`` with this SUT (validated like a spec's connection), or unchanged when empty."""
        if not self.base_url:
            return spec
        data = spec.model_dump(mode="json")
        data["sut"] = {
            "provider": "openai",
            "base_url": self.base_url,
            "model": self.model or "default",
            **({"api_key_env": self.api_key_env} if self.api_key_env else {}),
        }
        return parse_spec(data, "resource sut")  # a bad URL or a credential in it: a SpecError naming the field
