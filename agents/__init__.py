"""The regional node agents: config sync, engines, gateway and router."""

import os

# The agent starts engines (fork, then exec at once) while its gRPC stream to the control plane
# is open. gRPC's fork handlers, meant for children that go on using gRPC, then run in the
# child and can crash it before the exec (a simulated engine died with SIGSEGV in about one
# start in three). Children that exec need none of them; this must be set before gRPC starts.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
