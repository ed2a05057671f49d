"""linpipe.jobs: the Ray side of linpipe.

Each module imports only modules further down this list (tests/test_imports.py keeps the graph
acyclic):

    detached (a job for the job server), driver (run_job), repair (verify --repair)
    preflight (every check before a run), split (one record over a group of actors),
    variants (score-variants' replay units on actors)
    pool (the one loop of Ray work: actor slots, calls in flight, a dead actor's work requeued)
    worker_process (the actor Ray runs: the worker in a child process)
    actor (the worker), cluster (Ray set-up)
    overlap (the worker's threads), write_process (its writes, in the relay's process)
    plan (what work a request stands for), submission (the job-server client), lease
    spec (YAML into requests), checks, regions, auth
    request (JobRequest, RunOptions)
    options (every option, declared once), errors, child (a child process: its start, the channel),
    ray_compat, watchdog (the embedded Ray's processes end with its driver),
    whole (a whole record's kept layers and progress) (the leaves)

Nothing here calls ray.init() at import time, imports click or prints.
"""
