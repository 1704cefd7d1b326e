"""aiayn: sweeps."""
