# Sourced by scripts/demo and scripts/test: create or reuse .venv with Python 3.12 and install.
# Usage: . scripts/_venv.sh [extra]   (extra: "sdk", the default, adds JAX for the demo's
# workloads; "dev" installs the dev tools and the SDK)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"

find_python() {
  for cand in python3.12 "$(command -v pyenv >/dev/null 2>&1 && pyenv root)/versions/3.12"*/bin/python3.12 \
              /usr/bin/python3.12 /usr/local/bin/python3.12; do
    if [ -n "$cand" ] && command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      command -v "$cand"; return 0
    fi
  done
  echo "mldiag: Python 3.12 not found (needed by jax 0.12 and xprof 2.24.2)" >&2
  return 1
}

# What pip is doing, one short line a step on stderr (pip's own --quiet said nothing for a
# minute, minutes on a cold machine): each package it collects, then the install itself.
pip_progress() {
  local n=0 line
  while IFS= read -r line; do
    case "$line" in
      Collecting\ *)
        n=$((n + 1)); line="${line#Collecting }"
        printf 'mldiag: setup: [%d] %s\n' "$n" "${line%% *}" >&2 ;;
      "Installing collected packages: "*)
        printf 'mldiag: setup: installing %d package(s) into .venv ...\n' \
          "$(($(tr -cd , <<<"$line" | wc -c) + 1))" >&2 ;;
      ERROR:*|error:*) printf '%s\n' "$line" >&2 ;;
    esac
  done
}

setup_started=$SECONDS
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
  PY="$(find_python)"
  echo "mldiag: setup: creating .venv with $PY (first run only)" >&2
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
fi

extra="${1:-sdk}"
spec="$ROOT"
[ -n "$extra" ] && spec="$ROOT[$extra]"
# Reinstall only when the project metadata changed since the last install.
stamp="$VENV/.mldiag-installed-$extra"
lock="$ROOT/functions/requirements.lock"
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ] || [ "$lock" -nt "$stamp" ]; then
  # The functions' hashed lock pins the runtime packages here too (without its hashes, as
  # constraints), so the tests run the versions the functions deploy, whatever PyPI has now.
  constraints="$VENV/functions-constraints.txt"
  grep -E '^[A-Za-z0-9][A-Za-z0-9._-]*==' "$lock" | sed 's/ *\\$//' > "$constraints"
  echo "mldiag: setup: installing mldiag[$extra] and its pinned dependencies into .venv" \
    "(about a minute, several on a cold machine or a slow network) ..." >&2
  "$VENV/bin/python" -m pip install --progress-bar off --disable-pip-version-check \
    -c "$constraints" -e "$spec" 2>&1 | pip_progress || true
  echo "mldiag: setup: checking that mldiag, xprof and jax import ..." >&2
  "$VENV/bin/python" -c 'import mldiag, xprof, jax'
  touch "$stamp"
  echo "mldiag: setup: .venv ready in $((SECONDS - setup_started)) s" >&2
fi
export PATH="$VENV/bin:$PATH"
