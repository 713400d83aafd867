"""Model stacks: builders for MHA/MLA/DSA/DeepSeek-V4 and named presets."""
from hicache.models.deepseek_v4 import (FLASH_RATIOS, PRO_RATIOS, REAL_GEOMETRY, V4Geometry, deepseek_v4,
                                        geometry_for_dims)
from hicache.models.dense import dsa, mha, mla
from hicache.models.linear_hybrid import HybridGeometry, linear_hybrid
from hicache.models.presets import PRESETS, preset

__all__ = ["FLASH_RATIOS", "PRESETS", "PRO_RATIOS", "REAL_GEOMETRY", "HybridGeometry", "V4Geometry", "deepseek_v4",
           "dsa", "geometry_for_dims", "linear_hybrid", "mha", "mla", "preset"]
