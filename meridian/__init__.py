"""Meridian: an open control plane for LLM inference across regions and clouds."""
