"""Constrained decoding (STATIC): constraint sets, the CSR transition matrix, mask backends."""
