"""Meridian: an open control plane for LLM inference across regions and clouds."""

import os

# Agents start engines, and the control plane an embedded PostgreSQL's pg_ctl, while gRPC is
# running (fork, then exec at once). gRPC's fork handlers, meant for children that go on using
# gRPC, then run in the child and can crash it before the exec (a simulated engine died with
# SIGSEGV in about one start in three). Children that exec need none of them. It must be set
# before gRPC starts: every `meridian` command imports this package first.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
