"""Helpers the gateway and the node share (the contracts are in ``wire``)."""
