"""What happens to a tenant beyond its rows: its deletion (``app.tenants.deletion``)."""
