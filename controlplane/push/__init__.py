"""The gRPC Fleet service: registration, snapshots pushed down, acks and telemetry up."""
