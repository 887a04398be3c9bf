"""xSchedule's batching policies, for the Serve app. They live in genrec.workloads.serving.xschedule
(plain, Ray-free code the in-process harness shares on the lent GPU machine, which has no Ray); this
module keeps the Serve-side import path."""

from genrec.workloads.serving.xschedule import (  # noqa: F401 (re-exports)
    POLICIES,
    Admission,
    BatchPolicy,
    FixedBatchPolicy,
    FixedConfig,
    QueuedRequest,
    ScheduleConfig,
    ServiceModel,
    SLOBatchPolicy,
    budget_for,
    request_tokens,
)
