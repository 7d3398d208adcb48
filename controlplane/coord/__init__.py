"""Coordination of control-plane replicas: leader, revision fan-out and presence."""
