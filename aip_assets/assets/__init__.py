from .stages import STAGE_ASSETS

__all__ = ["STAGE_ASSETS"]
