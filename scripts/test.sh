#!/usr/bin/env bash
# The project's one test command (see README): formatting, lints, the API docs, Rust
# tests (doctests included), then the Python extension built into .venv and its
# pytest suite.
# Stops at the first failure. Creates/updates the .venv it needs by itself.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

FMT_COLOR=()
if [[ "${CI:-}" == "true" ]]; then
    export CARGO_TERM_COLOR=never
    FMT_COLOR=(--color never)  # rustfmt colours its diff even into a log file otherwise
fi

PYTHON_BIN="${PYTHON:-python3}"
VENV="$ROOT/.venv"
# Python packages the tests need (torch deliberately absent: tests needing it skip).
PY_DEPS=(
    "maturin>=1.5,<2"
    "numpy>=2,<3"
    "pytest>=8,<10"
    "ml_dtypes>=0.5,<1"
    "scipy>=1.10,<2"
)

step() { printf '\n==> %s\n' "$*"; }

# ---------------------------------------------------------------- venv
if [[ ! -x "$VENV/bin/python" ]]; then
    step "creating venv at .venv with $("$PYTHON_BIN" --version 2>&1)"
    "$PYTHON_BIN" -m venv "$VENV"
fi
# Reinstall only when the dependency list changes (stamp file inside the venv).
STAMP="$VENV/.tensorwire-deps"
WANT="$(printf '%s\n' "${PY_DEPS[@]}")"
if [[ ! -f "$STAMP" ]] || [[ "$(cat "$STAMP")" != "$WANT" ]]; then
    step "installing Python test dependencies into .venv"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PY_DEPS[@]}"
    printf '%s\n' "$WANT" > "$STAMP"
fi
export VIRTUAL_ENV="$VENV"
export PATH="$VENV/bin:$PATH"
# pyo3's build script (clippy/test of the bindings crate, maturin) uses this interpreter.
export PYO3_PYTHON="$VENV/bin/python"
unset CONDA_PREFIX || true
# Rust test binaries of the pyo3 crate link libpython; let them find a shared one
# (pyenv's lives outside the loader's default paths).
PY_LIBDIR="$("$VENV/bin/python" -c 'import sysconfig as s; print(s.get_config_var("LIBDIR") if s.get_config_var("Py_ENABLE_SHARED") else "")')"
if [[ -n "$PY_LIBDIR" ]]; then
    export LD_LIBRARY_PATH="$PY_LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# ---------------------------------------------------------------- Rust
step "cargo fmt --all -- --check"
cargo fmt --all -- --check ${FMT_COLOR[@]+"${FMT_COLOR[@]}"}

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --quiet --workspace --all-targets -- -D warnings

step "cargo doc --workspace --no-deps (rustdoc warnings, such as broken links, are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --quiet --workspace --no-deps

step "cargo test --workspace"
cargo test --workspace

# The async packet stream (tokio feature) is off in the workspace-wide runs above.
step "cargo clippy + test -p tensorwire-packet --features tokio"
cargo clippy --quiet -p tensorwire-packet --all-targets --features tokio -- -D warnings
cargo test -p tensorwire-packet --features tokio

# ---------------------------------------------------------------- Python
BINDINGS_MANIFEST="bindings/python/Cargo.toml"

step "maturin develop --release -m $BINDINGS_MANIFEST"
"$VENV/bin/maturin" develop --release -m "$BINDINGS_MANIFEST"

step "python -m pytest bindings/python/tests -q"
set +e
"$VENV/bin/python" -m pytest bindings/python/tests -q
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
    echo "ERROR: pytest collected no tests in bindings/python/tests (exit 5); the Python tests must exist." >&2
    exit 1
elif [[ $rc -ne 0 ]]; then
    echo "ERROR: pytest failed (exit $rc)" >&2
    exit "$rc"
fi

step "all checks passed"
