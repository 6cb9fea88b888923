"""MLflow helpers (no Prefect): an experiment per project, a parent run per pipeline run, a nested run per
stage and iteration; params are the flattened resolved config, tags name the harness, model, policy version and
task set; stage outputs are logged (small files) or referenced (paths + artifact keys), never copied on a cache
hit. See lego.track.tracker.Tracker. Every rollout is also an MLflow trace (one span per LLM call, one per
grading), written when its stage is recorded: lego.track.traces.
"""
