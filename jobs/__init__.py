"""linpipe.jobs: the Ray side of linpipe.

Read top-down (each module imports only those after it): detached (a job for the job server)
and driver (run_job: the Scheduler over actors; split: one record over a group of them) ->
repair -> preflight (every check before a run) -> cluster (Ray set-up), submission (the
job-server client), lease -> plan (what work a request stands for) -> actor, regions, checks ->
spec (YAML into requests) -> request (JobRequest, RunOptions) -> options (every option declared
once) -> errors, ray_compat (leaves). Nothing here calls ray.init() at import time, imports
click or prints.
"""
