"""linpipe.jobs: the Ray side of linpipe.

request (what the user asked for) -> spec (YAML into requests) -> plan (what work exists) ->
cluster (Ray set-up) -> driver (Scheduler over actor) -> the store; dryrun and submission (the
job-server client) reuse the request and the plan. Nothing here calls ray.init() at import
time, imports click or prints.
"""
