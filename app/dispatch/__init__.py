"""How work travels from the gateway (control plane) to node agents (data plane)."""
