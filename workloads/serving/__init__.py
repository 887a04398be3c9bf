"""Serving components without Ray: xSchedule's batching policies and the in-process open-loop harness.

They live in workloads (not platform/serve) so the lent GPU machine, which has no Ray, pydantic or
FastAPI, runs the same policy and decode function as the Serve app (docs/serving.md, "xSchedule").
"""
