"""The checks of a run's config against what it names: the data sources, losses, models and parallel plans
of the libraries below (config/ holds the schema they check, and imports none of them)."""
