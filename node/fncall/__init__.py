"""FnCall backends: one stateless call each (``base.FnBackend``)."""
