"""Prefect flows: one per stage, the pipeline, and the deployments. Wiring only: every capability is in lego/.

Import lego.pipeline.prefect_env.configure_prefect_env(work) before importing this package (the CLI does).
"""
