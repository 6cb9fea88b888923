-- The catalog: one view per stored table over its Parquet files (see lego/data/schema.py for the layout).
-- Views read the globs at query time, so they always reflect the complete files on disk; temp files
-- (.<table>-<id>.parquet.tmp) never match. union_by_name keeps older files readable when columns are added.
CREATE OR REPLACE VIEW tasks AS SELECT * FROM read_parquet({{ tasks_glob }}, union_by_name = true, hive_partitioning = false);
CREATE OR REPLACE VIEW rollouts AS SELECT * FROM read_parquet({{ rollouts_glob }}, union_by_name = true, hive_partitioning = false);
CREATE OR REPLACE VIEW llm_calls AS SELECT * FROM read_parquet({{ llm_calls_glob }}, union_by_name = true, hive_partitioning = false);
CREATE OR REPLACE VIEW segments AS SELECT * FROM read_parquet({{ segments_glob }}, union_by_name = true, hive_partitioning = false);
CREATE OR REPLACE VIEW outcomes AS SELECT * FROM read_parquet({{ outcomes_glob }}, union_by_name = true, hive_partitioning = false);
CREATE OR REPLACE VIEW train_steps AS SELECT * FROM read_parquet({{ train_steps_glob }}, union_by_name = true, hive_partitioning = false);
CREATE OR REPLACE VIEW eval_results AS SELECT * FROM read_parquet({{ eval_results_glob }}, union_by_name = true, hive_partitioning = false);

-- A rollout may be graded more than once (a verifier retry): the newest outcome wins.
CREATE OR REPLACE VIEW latest_outcomes AS
SELECT *
FROM outcomes
QUALIFY row_number() OVER (PARTITION BY run_id, rollout_id ORDER BY written_at DESC, attempts DESC) = 1;
