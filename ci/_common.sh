# Shared by ci/test and ci/demo: find the repo, build .venv from nothing, list the packages.
# Sourced, not run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source "$ROOT/ci/_packages.sh"
VENV="${CI_VENV:-$ROOT/.venv}"
LOGS="${CI_LOGS:-$ROOT/.ci-logs}"
TORCH_SPEC="${CI_TORCH:-torch==2.13.0}"   # the CPU build; on the CI machine a local file
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
export PIP_DISABLE_PIP_VERSION_CHECK=1
mkdir -p "$LOGS"

now() { date +%s; }

setup_venv() {
  local t0; t0=$(now)
  local py="${PYTHON:-}"
  if [ -z "$py" ]; then
    for c in python3.11 python3; do command -v "$c" >/dev/null && { py="$c"; break; }; done
  fi
  [ -x "$VENV/bin/python" ] || "$py" -m venv "$VENV"
  PY="$VENV/bin/python"
  "$PY" -m pip install -q --upgrade pip >"$LOGS/setup.log" 2>&1 || true
  # torch first and alone, so that nothing later pulls a multi-GB CUDA build
  "$PY" -m pip install -q "$TORCH_SPEC" >>"$LOGS/setup.log" 2>&1 || { tail -20 "$LOGS/setup.log"; exit 1; }
  "$PY" -m pip install -q numpy pytest pytest-timeout >>"$LOGS/setup.log" 2>&1 || { tail -20 "$LOGS/setup.log"; exit 1; }
  echo "setup: venv $VENV, $("$PY" -c 'import sys,torch; print(f"python {sys.version.split()[0]}, torch {torch.__version__}")') ($(( $(now) - t0 ))s)"
}

# pip install ./<pkg> (+ its test-only requirements); prints seconds taken, fails loudly
install_package() {
  local p="$1" t0; t0=$(now)
  local log="$LOGS/$p-build.log"
  install_system_packages "$p" >"$log" 2>&1 || { tail -30 "$log" >&2; return 1; }
  if ! "$PY" -m pip install "./$p" >"$log" 2>&1; then
    echo "$p: BUILD FAILED after $(( $(now) - t0 ))s; last lines of $log:" >&2
    tail -30 "$log" >&2
    return 1
  fi
  if [ -f "$p/requirements-test.txt" ]; then
    "$PY" -m pip install -r "$p/requirements-test.txt" >>"$log" 2>&1 || { tail -30 "$log" >&2; return 1; }
  fi
  echo $(( $(now) - t0 ))
}

# Debian packages a package's tests need (one per line in <pkg>/apt-packages.txt), e.g. etcd-server
install_system_packages() {
  local f="$ROOT/$1/apt-packages.txt" missing=() d
  [ -f "$f" ] || return 0
  while read -r d; do
    [ -n "$d" ] && [ "${d#\#}" = "$d" ] || continue
    dpkg -s "$d" >/dev/null 2>&1 || missing+=("$d")
  done <"$f"
  [ ${#missing[@]} -gt 0 ] || return 0
  local sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
}

# the version a package declares in src/<pkg>/_version.py
declared_version() {
  sed -n 's/^__version__ *= *"\(.*\)"/\1/p' "$ROOT/$1/src/$1/_version.py"
}
