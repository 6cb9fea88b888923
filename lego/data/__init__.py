"""Token datasets: Parquet files per run, stage and iteration under <work>/data, a DuckDB catalog of views.

Writing (lego.data.writer.DatasetWriter(work, run_id)):
    append_trajectories(trajectories, stage="rollout")   rollouts, llm_calls, segments (token arrays, routing)
    append_outcomes(outcomes, iteration, stage="verify")
    append_tasks(tasks), append_train_steps(steps, iteration), append_eval_results(results, iteration)
  Every file is written atomically; malformed records raise lego.data.codec.DataValidationError.

Querying (lego.data.catalog.Catalog.open(work, config)): views tasks, rollouts, llm_calls, segments, outcomes,
  latest_outcomes, train_steps, eval_results, task_difficulty (sql/difficulty.sql), advantages
  (sql/advantages.sql), iteration_summary and train_summary (sql/metrics.sql), eval_summary (sql/comparisons.sql).

Reading (lego.data.reader): iter_trajectories, read_trajectories, iter_segment_batches, read_outcomes,
  read_tasks -- streamed, exact.
Training (lego.data.batches): iter_training_samples(catalog, run_id, iteration) -> TrainingSample per sequence;
  training_batch_fields(samples) -> kwargs of lego.train.trainer.TrainBatch.
Export (lego.data.export): write_verl_rl_dataset (verl RL parquet), build_verl_batch (verl actor tensors),
  export_iteration (both, for `lego data export`).
"""
