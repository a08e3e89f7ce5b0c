"""The on-disk contracts, at the bottom of the library: every file format has one owner here.

`preprocess/` writes these files and `pmi_jax` reads them; both import this package and nothing
in it imports either. docs/design.md describes each format in prose.
"""
