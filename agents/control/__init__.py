"""The agent's side of the Fleet protocol: registration and the sync stream."""
