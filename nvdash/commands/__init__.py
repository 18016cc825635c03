"""The commands ``nvdash`` runs: each takes its parsed arguments, prints, and returns the exit status.

One module per command; :mod:`nvdash.cli` parses the command line and hands the result to one of them. The
domain packages below keep the pure work (exporting, importing, reporting); nothing below imports this package.
"""
