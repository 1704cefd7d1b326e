"""aiayn.ablations: what to run, as data. Table 3 of the paper, the rows beyond it, and the presets
that scale them; no torch here.

`table3.csv` is the paper's Table 3 (one row per line, blank cell = same as base, with the paper's
reported dev PPL, BLEU and params); `extended.csv` holds rows beyond the paper in the same layout.
Add a row by adding one line to either file.
"""
