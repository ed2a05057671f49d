"""linpipe.jobs: the Ray side of linpipe (driver, actors, job specs, submission).

Nothing here calls ray.init() at import time.
"""
