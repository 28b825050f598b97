"""Stateful sandboxes in the control plane: records, placement, routing to nodes."""
