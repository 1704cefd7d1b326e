"""The schema of the run files aiayn writes (config.json, metrics.json): a file of a newer schema is refused, not
misread. One number for both, kept here, below every layer that reads them (a run's own config.json is read as a
--config file by the options, and written by the run directory)."""

SCHEMA = 1
