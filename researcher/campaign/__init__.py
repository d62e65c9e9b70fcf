"""Campaigns: a list of hypotheses (claims) run as studies of this project under one running-time budget,
the next look always going to the open claim closest to settling, with a ledger of findings and a
scorecard against the claims' published expectations. ``spec`` reads the file, ``record`` is the
campaign's state, ``allocate`` picks the next claim, ``runner`` runs sessions, ``standing`` reads a
claim's study back, ``ledger`` words it and ``tracking`` mirrors it into MLflow."""
