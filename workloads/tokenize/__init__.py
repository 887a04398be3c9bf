"""genrec.workloads.tokenize"""
