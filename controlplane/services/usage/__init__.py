"""The usage ledger on the control plane: records stored once, reports and budgets."""
