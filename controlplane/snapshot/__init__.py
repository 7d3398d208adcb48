"""The desired state of each region, compiled from the fleet state at a revision (pure)."""

from controlplane.snapshot.compiler import compile_region
from controlplane.snapshot.types import FleetState, RegionSnapshot

__all__ = ["FleetState", "RegionSnapshot", "compile_region"]
