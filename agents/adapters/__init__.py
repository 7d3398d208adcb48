"""Tenants' LoRA adapters on the engines: their files, and which engine holds which."""
