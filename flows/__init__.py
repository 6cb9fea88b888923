"""Prefect wiring only (every capability is in lego/): the pipeline flow, one task per stage, the rollout subflow
that fans shards out, and the deployments.

Import lego.pipeline.prefect_env.configure_prefect_env(work) before importing this package (the CLI does).
"""
