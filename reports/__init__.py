"""aiayn: reports."""
