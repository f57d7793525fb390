"""Recipe assets: datasets generated for off-platform inference."""

from dagster import AssetExecutionContext, Config, MaterializeResult, MetadataValue, asset
from pydantic import Field

from ..recipes import perturb_file


class PerturbationRecipeConfig(Config):
    seed_dataset: str = Field("data/datasets/demo_decisions.jsonl", description="gdi_text_v1 seed rows")
    out: str = Field("data/generated/perturbed.jsonl", description=".jsonl, .csv or .parquet")
    types: list[str] = Field(default_factory=list, description="perturbation types; default: all rule-based ones")
    seed: int = 0
    variants_per_type: int = Field(1, ge=1, le=5)


@asset(
    group_name="recipes",
    description="perturbed variants of a seed dataset, each row with metadata.original_query, "
    "ready to be answered off-platform and scored by llm.perturbation_robustness_external",
)
def perturbation_dataset(context: AssetExecutionContext, config: PerturbationRecipeConfig) -> MaterializeResult:
    out = perturb_file(config.seed_dataset, config.out, config.types or None, config.seed, config.variants_per_type)
    context.log.info(f"wrote {out['rows']} rows ({out['seed_rows']} seed rows) to {out['path']}")
    return MaterializeResult(
        metadata={
            "rows": out["rows"],
            "seed_rows": out["seed_rows"],
            "by_type": MetadataValue.json(out["by_type"]),
            "path": MetadataValue.path(out["path"]),
        }
    )
