"""Warm pools of workers, one framework for every backend (see ``pool``)."""
