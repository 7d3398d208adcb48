"""The usage ledger: one record per request, journaled on the agent's disk and shipped to
the control plane, which stores each once (docs/ledger.md)."""
