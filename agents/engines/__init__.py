"""Engines an agent runs: the SGLang launcher, the simulator, and external endpoints."""
