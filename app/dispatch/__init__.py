"""How work travels between the gateway (control plane) and node agents (data plane)."""
