"""Pydantic models of the admin API: what callers write (specs) and what they read back."""
