"""Session fixtures shared by the suite: the test config, its work dir, a Docker engine, the base image."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One intra-op thread per torch process (this one and the `lego` children): the suite runs several workers on few
# cores, where each process's own thread pool only contends with the others (`scripts/gpu_check.sh --cpu` took 34 s
# of CPU with two threads, 20 s with one, on the loaded 2-core machine: docs/benchmarks.md).
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Parallel workers (pytest -n, scripts/test.sh): each gets a work dir of its own (catalog, MLflow, Prefect home,
# artifacts), also for the `lego` commands the tests run in-process or as children; the Docker engine is the one
# scripts/test.sh started and exported as DOCKER_HOST.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["LEGO_WORK_DIR"] = f".lego-test/workers/{os.environ['PYTEST_XDIST_WORKER']}"


@pytest.fixture(scope="session")
def lego_config():
    from lego.config import load_config

    return load_config("test")


@pytest.fixture(scope="session")
def work_dir(lego_config):
    from lego.workdir import WorkDir

    return WorkDir.create(lego_config.project.work_dir)


@pytest.fixture(scope="session")
def docker_engine(lego_config, work_dir):
    from lego.errors import DockerUnavailableError
    from lego.sandbox.daemon import docker_engine as engine_context

    try:
        context = engine_context(work_dir.docker_root, lego_config.docker.host, lego_config.docker.start_private_daemon)
        engine = context.__enter__()
    except DockerUnavailableError as exc:
        pytest.skip(f"no Docker engine: {exc}")
    yield engine
    context.__exit__(None, None, None)


@pytest.fixture(scope="session")
def base_image(docker_engine, lego_config):
    from lego.sandbox.image import ensure_base_image

    return ensure_base_image(docker_engine.client, lego_config.docker)


@pytest.fixture(scope="session")
def tokenizer_dir():
    from lego.engine.tokenizer import ensure_tokenizer

    return ensure_tokenizer()


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    """The real Qwen3 tokenizer, loaded once for the suite."""
    from lego.engine.tokenizer import load_tokenizer

    return load_tokenizer(tokenizer_dir)


@pytest.fixture(scope="session")
def tiny_model_path(lego_config, work_dir):
    from lego.engine.checkpoint import default_model_path, init_tiny_model

    return init_tiny_model(lego_config.model.init, default_model_path(lego_config, work_dir), seed=lego_config.project.seed)


@pytest.fixture(scope="session")
def calc_task(tmp_path_factory):
    """A tiny repo with history whose base commit has a bug (tests/repo_fixtures.py); independent of the bundled set."""
    from repo_fixtures import make_calc_task

    return make_calc_task(tmp_path_factory.mktemp("calc"))


@pytest.fixture(scope="session")
def calc_image(docker_engine, base_image, calc_task):
    from lego.sandbox.task_image import ensure_task_image

    return ensure_task_image(docker_engine.client, calc_task, base_image)


@pytest.fixture(scope="session")
def factory(docker_engine, lego_config, base_image):
    from lego.sandbox.docker_sandbox import DockerSandboxFactory

    return DockerSandboxFactory(docker_engine.client, lego_config.sandbox, base_image=base_image)


@pytest.fixture(scope="session")
def verifier(docker_engine, base_image, lego_config, factory):
    from lego.verify import Verifier

    return Verifier(docker_engine.client, base_image, lego_config.sandbox, lego_config.verify, factory=factory)


# ---------------------------------------------------------------------------------------------- order
# Seconds each of the longest modules took in a full parallel run (scripts/test.sh, 4 workers, this 2-core machine).
# Workers take whole modules (--dist loadfile) in collection order, so the longest go first: a long module that
# starts last runs alone at the end while the other workers idle. Re-measure with `--durations=0` when they change.
MODULE_SECONDS = {
    "test_cluster.py": 630, "test_pipeline.py": 245, "test_harbor_backend.py": 180, "test_pipeline_e2e.py": 150,
    "test_vllm_engine.py": 140, "test_honest_agent.py": 135, "test_eval.py": 135, "test_rollout_stage.py": 115,
    "test_run_output.py": 115, "test_task_environments.py": 110, "test_redteam_infra.py": 110,
    "test_validate.py": 110, "test_redteam_grading.py": 110, "test_remote_engine.py": 105,
    "test_bench_proxy.py": 100, "test_ray_rollouts.py": 230, "test_harbor_grading.py": 100,
    "test_termination.py": 100, "test_redteam.py": 90, "test_harness_scripted.py": 90,
    "test_harness_random.py": 90, "test_redteam_decoys.py": 75, "test_honest_patches.py": 75,
}


def pytest_collection_modifyitems(items):
    """The longest modules first, the rest after them in their own order; tests within a module keep theirs."""
    rank = {name: index for index, name in enumerate(sorted(MODULE_SECONDS, key=MODULE_SECONDS.get, reverse=True))}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


# ---------------------------------------------------------------------------------------------- skips
# The only skips a run may have, each with its reason. Any other skip fails the run (a Docker test that skips because
# no engine answers, a harness that failed to install, a missing tool): a green run must mean the real parts ran.
ALLOWED_SKIPS = {
    "tests/test_engine.py::test_vllm_engine_generates_with_routing":
        "no GPU: vLLM's own routed-experts capture runs on a CUDA device (tests/test_vllm_engine.py runs the engine "
        "and its CPU capture here; scripts/gpu_check.sh runs this where a GPU is lent)",
    "tests/test_eval.py::test_real_swebench_lite_exports_where_the_hub_and_registry_are_reachable":
        "no hub: real SWE-bench needs the Hugging Face hub and an image registry; the guard itself is tested here",
}
_unexpected_skips: list[str] = []


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail") and report.nodeid not in ALLOWED_SKIPS:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _unexpected_skips.append(f"{report.nodeid}: {reason}")


def pytest_collectreport(report):
    """A whole module skipped at collection (`pytest.skip(allow_module_level=True)`, a module-level importorskip) is a
    skip too: none is allowed."""
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _unexpected_skips.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session, exitstatus):
    if _unexpected_skips and not os.environ.get("PYTEST_XDIST_WORKER"):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if _unexpected_skips and not os.environ.get("PYTEST_XDIST_WORKER"):
        terminalreporter.section("skips not on the allow-list (tests/conftest.py ALLOWED_SKIPS): the run fails")
        for line in _unexpected_skips:
            terminalreporter.line(line)

