"""The HTTP edge: typed endpoints, authentication, error mapping, middleware, OpenAPI."""
