"""Usage and cost: what each tenant's work used, read from the usage rollups and the
events not rolled up yet, grouped as asked and priced (``app.usage.report``)."""
