#!/usr/bin/env bash
# Installs ftrun and what it needs into a virtual environment, .venv in the repository: Debian's
# and Ubuntu's system Python refuse `pip install` (PEP 668), and a venv keeps the machine clean.
# Idempotent, and fast when nothing changed: a stamp in .venv records what was installed.
#
# The interpreter the venv is made from: $PYTHON when set (it must work, or this stops), else the
# first of `python3` on PATH and /usr/bin/python3 that runs and is Python >= 3.10. When none does,
# or it lacks venv/ensurepip (Debian ships them apart, in python3-venv), root installs the Debian
# packages with apt-get; anyone else gets a message saying what to install.
#
# Afterwards: `.venv/bin/ftrun ...`, or `source .venv/bin/activate` then `ftrun ...`.
# torch is pinned to the CPU build 2.13.0: a looser requirement pulls several GB of CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd -P)
VENV=$ROOT/.venv
TORCH_VERSION=2.13.0
PROG=setup.sh

die() { echo "$PROG: error: $*" >&2; exit 1; }
info() { echo "$PROG: $*" >&2; }
is_root() { [ "$(id -u)" = 0 ]; }

# Prints the interpreter's version (3.11) if it runs and is >= 3.10, else fails.
usable() {
    "$1" -c 'import sys; assert sys.version_info >= (3, 10); print("%d.%d" % sys.version_info[:2])' \
        2>/dev/null
}

apt_install() {  # --no-upgrade: what is installed already stays as it is
    command -v apt-get >/dev/null 2>&1 || return 1
    info "installing $* with apt-get"
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -qq update >&2 \
        && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -qq install -y \
            --no-install-recommends --no-upgrade "$@" >&2
}

find_python() {
    local candidate
    if [ -n "${PYTHON:-}" ]; then
        usable "$PYTHON" >/dev/null \
            || die "PYTHON='$PYTHON' does not run as Python >= 3.10 (unset PYTHON to let $PROG choose)"
        echo "$PYTHON"
        return
    fi
    for candidate in "$(command -v python3 || true)" /usr/bin/python3; do
        if [ -n "$candidate" ] && usable "$candidate" >/dev/null; then echo "$candidate"; return; fi
    done
    if is_root && apt_install python3 python3-venv && usable /usr/bin/python3 >/dev/null; then
        echo /usr/bin/python3
        return
    fi
    die "no Python >= 3.10 found (tried python3 on PATH and /usr/bin/python3)." \
        "Install one (Debian/Ubuntu: sudo apt-get install python3 python3-venv), or set PYTHON=/path/to/python3"
}

# The venv module and ensurepip, which Debian/Ubuntu ship apart from python3 (python3-venv).
ensure_venv_module() {
    local py=$1 version
    "$py" -c 'import venv, ensurepip' 2>/dev/null && return 0
    version=$(usable "$py")
    if is_root && apt_install python3-venv "python$version-venv" \
        && "$py" -c 'import venv, ensurepip' 2>/dev/null; then
        return 0
    fi
    die "$py cannot create a virtual environment (no venv/ensurepip module)." \
        "On Debian/Ubuntu: sudo apt-get install python3-venv (or python$version-venv), then run" \
        "this again; or set PYTHON to an interpreter that has venv"
}

# What an up-to-date venv holds; a different stamp (pyproject.toml edited, the venv's Python
# upgraded, the clone moved) means installing again.
stamp() {
    printf 'python %s\ntorch %s\nroot %s\npyproject %s\n' "$(usable "$VENV/bin/python")" \
        "$TORCH_VERSION" "$ROOT" "$(sha256sum pyproject.toml | cut -d' ' -f1)"
}

# The venv holds what the stamp says: torch's version and this clone's ftrun, importable.
venv_current() {
    [ -f "$VENV/.ftrun-stamp" ] && [ "$(<"$VENV/.ftrun-stamp")" = "$(stamp)" ] \
        && "$VENV/bin/python" - "$TORCH_VERSION" "$ROOT" <<'PY' 2>/dev/null
import importlib.metadata as md, importlib.util, os, sys
assert md.version("torch").split("+")[0] == sys.argv[1]
spec = importlib.util.find_spec("ftrun")
assert spec and os.path.realpath(spec.origin).startswith(os.path.join(sys.argv[2], "ftrun") + os.sep)
PY
}

wipe_venv() {  # everything but the lock this script holds
    find "$VENV" -mindepth 1 -maxdepth 1 ! -name .setup.lock -exec rm -rf {} +
}

main() {
    local py made_from=""
    # Another setup.sh (say a second scripts/test.sh) waits rather than installing alongside.
    mkdir -p "$VENV"
    exec 9>"$VENV/.setup.lock"
    flock -w 600 9 || die "another $PROG still holds $VENV/.setup.lock after 600 s"

    # A working venv is kept, whatever made it, unless PYTHON names another interpreter.
    if [ -f "$VENV/.ftrun-python" ]; then made_from=$(<"$VENV/.ftrun-python"); fi
    if usable "$VENV/bin/python" >/dev/null \
        && { [ -z "${PYTHON:-}" ] || [ "$(command -v "$PYTHON" || true)" = "$made_from" ]; }; then
        venv_current && return 0
    else
        py=$(find_python)
        ensure_venv_module "$py"
        if [ -e "$VENV/bin/python" ]; then info "recreating $VENV (it was made from ${made_from:-another Python})"; fi
        wipe_venv
        info "creating $VENV with $py (Python $(usable "$py"))"
        "$py" -m venv "$VENV" >&2 || { wipe_venv; die "$py -m venv $VENV failed (see above)"; }
        command -v "$py" >"$VENV/.ftrun-python"
    fi
    rm -f "$VENV/.ftrun-stamp"
    info "installing torch==$TORCH_VERSION and ftrun (editable, with test extras) into $VENV"
    "$VENV/bin/python" -m pip install --quiet "torch==$TORCH_VERSION" -e "$ROOT[test]"
    stamp >"$VENV/.ftrun-stamp"
    info "done: run .venv/bin/ftrun, or \`source .venv/bin/activate\` then ftrun"
}

main "$@"
