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

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
  PY="$(find_python)"
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
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -c "$constraints" \
    -e "$spec" 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
  "$VENV/bin/python" -c 'import mldiag, xprof, jax' 
  touch "$stamp"
fi
export PATH="$VENV/bin:$PATH"
