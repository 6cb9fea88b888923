"""Evaluation reports and harness comparison (no Prefect); running an evaluation is lego.pipeline.evaluation.

- stats.wilson_interval: a resolved rate's confidence interval.
- report.EvalReport / summarize_outcomes: one evaluation's resolved rate with its interval, infra failures
  reported apart (they are not the policy's doing), cheat rate, turns and tokens.
- compare: rows from MLflow evaluation runs, side by side as a rich table, a PNG plot and an HTML page.
"""
