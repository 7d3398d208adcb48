# Shared by scripts/up and scripts/test: install what is missing, never what is there.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

apt_updated=0
apt_install() {
  command -v apt-get >/dev/null || { log "no apt-get: install $* yourself"; exit 1; }
  if [ "$apt_updated" -eq 0 ]; then
    log "apt-get update"
    as_root apt-get update -qq
    apt_updated=1
  fi
  log "apt-get install $*"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

have_postgres_server() {
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null
}

ensure_postgres() {
  have_postgres_server || apt_install postgresql
  # Debian's package starts a cluster of its own; Meridian runs its own and needs none.
}

ensure_python() {
  local py
  py="$(command -v python3 || true)"
  if [ -z "$py" ] || ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    log "Meridian needs Python 3.11 or newer as python3"; exit 1
  fi
  if ! "$py" -c 'import venv, ensurepip' 2>/dev/null; then
    apt_install python3-venv
  fi
}

# ensure_venv LOCKFILE: a virtual environment with exactly the locked dependencies.
ensure_venv() {
  local lock="$ROOT/requirements/$1"
  local stamp="$VENV/.installed-$(sha256sum "$lock" "$ROOT/pyproject.toml" | sha256sum | cut -c1-16)"
  [ -f "$stamp" ] && return 0
  ensure_python
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  log "installing Python dependencies from requirements/$1"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --require-hashes -r "$lock"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -e "$ROOT"
  rm -f "$VENV"/.installed-*
  touch "$stamp"
}

# ensure_sglang: the real SGLang, in its own environment keyed by its version (outside the
# clone: ~/.cache/meridian/sglang-<version>, or $MERIDIAN_SGLANG_HOME), installed once (about
# 11 GB, 4 to 6 minutes) and reused. The version is named in agents/engines/sglang_env.py.
ensure_sglang() {
  local started=$SECONDS
  log "SGLang in its own environment ($("$VENV/bin/python" -c 'from agents.engines.sglang_env import SGLANG_VERSION as v, env_dir; print(v, "at", env_dir())'))"
  "$VENV/bin/meridian" engines sglang-env --install >/dev/null
  log "SGLang ready ($((SECONDS - started)) s)"
}
