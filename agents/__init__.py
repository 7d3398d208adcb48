"""The regional node agents: config sync, engines, gateway and router."""
