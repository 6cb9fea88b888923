"""Prefect tasks: each calls one function of lego.pipeline and records its result in the run's session.

Caching is Lego's own (artifacts keyed by a content hash under the work dir, see lego.pipeline), so the tasks
use Prefect's NO_CACHE policy: a Prefect cache entry whose artifact was deleted must not count.
"""
