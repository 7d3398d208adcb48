"""What the suites share: starting the parts, fleets, clients and documents (no suite imports
another's conftest or tests)."""
