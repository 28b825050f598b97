"""Per-tenant quotas and the admission control that enforces them."""
