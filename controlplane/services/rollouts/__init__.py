"""Rollouts: a declared change reaches the fleet in waves, judged by what the fleet measures,
and rolled back by itself. See `begin` (the writer's side), `driver` (the leader's loop),
`judge` (the checks) and `compose` (what each target is compiled from)."""
