"""Analysis of the reproduction: tidy result CSVs -> figures beside the paper's, and a claims report.

`results` loads and validates the CSVs, `derive` computes what is compared, `figures` draws one
PNG per paper figure (captions in `captions/`), and `report` writes the claims table. The paper's
numbers are in `reference/`. Run `python -m analysis --help` for the command line.
"""
