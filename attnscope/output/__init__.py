"""Rendering: JSON and CSV documents, files written whole, terminal tables, figures, the HTML report, and one view
per result type that ties them together. Computes nothing."""
