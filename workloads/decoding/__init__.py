"""genrec.workloads.decoding"""
