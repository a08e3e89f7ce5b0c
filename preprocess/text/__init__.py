"""Shared readers of raw text: input files to documents, documents to words, progress bars."""
