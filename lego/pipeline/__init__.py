"""The pipeline's stages as plain functions (no Prefect): tasks -> filter -> rollout -> verify -> dataset ->
train -> evaluate.

Each stage's output is an artifact directory <work>/artifacts/<stage>/<key>/ whose key is a content hash of its
inputs (upstream artifact keys, task set contents, policy checkpoint, its config sections, the source of the
code it runs); `result.json`, written last and atomically, marks it complete. A stage whose key already has a
complete artifact is served from it. Token data lives in the work dir's Parquet dataset under a data run id
derived from the key (`rollout-<key>`, `eval-<key>` ...), so a stage killed mid-way resumes where it stopped.
Runs are recorded in <work>/runs/<run_id>/manifest.json (the keys each stage used), which `lego stage --from`
reads. Prefect wiring lives in flows/ and tasks/, MLflow in lego.track.
"""
