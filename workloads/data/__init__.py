"""Datasets: the dataset-dir format, the synthetic generator and the importers."""
