"""Capacity providers: the clouds' groups of machines that node pools are, resized by the
planner. One interface (base.py), one module per cloud."""
