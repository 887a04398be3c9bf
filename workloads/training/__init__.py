"""genrec.workloads.training"""
