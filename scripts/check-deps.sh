#!/usr/bin/env bash
# Checks, after `make deps` installed the packages, that everything the build and the tests use
# is really there: each file of scripts/deps.tsv (saying which package provides a missing one),
# and a Rust toolchain at least as new as the workspace's rust-version. Run by `make deps`.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
missing=0

# On a merged-/usr Debian, /bin/x and /usr/bin/x are one file: either spelling will do.
present() {
    [ -e "$1" ] && return 0
    case "$1" in
    /usr/*) [ -e "${1#/usr}" ] ;;
    *) [ -e "/usr$1" ] ;;
    esac
}

while IFS=$'\t' read -r path package why; do
    case "$path" in '' | '#'*) continue ;; esac
    if ! present "$path"; then
        echo "missing: $path (Debian package $package), needed for $why" >&2
        missing=1
    fi
done <"$root/scripts/deps.tsv"

need=$(sed -n 's/^rust-version *= *"\([0-9.]*\)".*/\1/p' "$root/Cargo.toml" | head -1)
if ! command -v cargo >/dev/null || ! command -v rustc >/dev/null; then
    echo "missing: a Rust toolchain (cargo and rustc $need or newer); install it with rustup:" >&2
    echo "  https://rustup.rs, then: rustup toolchain install stable" >&2
    missing=1
else
    have=$(rustc --version); have=${have#rustc }; have=${have%% *}
    if [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
        echo "too old: rustc $have; this workspace needs $need or newer (rustup update stable)" >&2
        missing=1
    fi
fi

if [ "$missing" -ne 0 ]; then
    echo "make deps: the packages above are missing after installing; install them with" >&2
    echo "  apt-get install --no-install-recommends <package>" >&2
    exit 1
fi
