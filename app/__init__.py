"""Corral's gateway and control plane."""
