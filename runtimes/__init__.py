"""Corral's data plane: execution backends and the node agent that drives them."""
