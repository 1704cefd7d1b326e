"""aiayn: lightning_modules."""
