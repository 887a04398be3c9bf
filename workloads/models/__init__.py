"""genrec.workloads.models"""
