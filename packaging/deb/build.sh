#!/bin/bash
# Builds the Debian package `fleet` (docs/deploy.md, section 1, says what it does and why), run by
# `make package`: `make install` of $BIN_DIR's binaries into a staging tree with Debian's
# paths, this directory's control files and drop-ins on top, then `dpkg-deb --build` and
# `lintian`, whose errors fail the build. Prints the .deb's path last.
#
# Environment (set by the Makefile): BIN_DIR (fleetd and fleetctl to package), PACKAGE_DIR
# (output directory), DEB_VERSION (optional, default <workspace version>-1), MAKE,
# DEB_COMPRESS (dpkg-deb's -Z, default xz; the tests take gzip, 4x faster), LINTIAN (no:
# skip it, for a test's second build of the same files).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
workspace=$(cd "$here/../.." && pwd)
: "${BIN_DIR:?}" "${PACKAGE_DIR:?}" "${MAKE:=make}"
version=${DEB_VERSION:-$(sed -n 's/^version = "\(.*\)"/\1/p' "$workspace/Cargo.toml" | head -1)-1}
arch=$(dpkg --print-architecture)
stage="$PACKAGE_DIR/fleet_${version}_$arch"
deb="$PACKAGE_DIR/fleet_${version}_$arch.deb"

rm -rf "$stage"
mkdir -p "$stage/DEBIAN"
"$MAKE" --no-print-directory -C "$workspace" install DESTDIR="$stage" BIN_DIR="$BIN_DIR" \
    PREFIX=/usr SYSCONFDIR=/etc SYSTEMDUNITDIR=/lib/systemd/system \
    ZSHCOMPDIR=/usr/share/zsh/vendor-completions >/dev/null

# Debian policy: stripped binaries (the debug info of a debug build is ~90% of its size).
strip --remove-section=.comment --remove-section=.note --strip-unneeded \
    "$stage/usr/bin/fleetd" "$stage/usr/bin/fleetctl"

# The package's own: the units wait for /etc/fleet/fleet.conf, the socket belongs to the
# group `fleet`, which systemd-sysusers creates.
for unit in fleet.service fleet.socket; do
    install -D -m 0644 "$here/systemd/$unit.conf" "$stage/lib/systemd/system/$unit.d/debian.conf"
done
install -D -m 0644 "$here/sysusers.conf" "$stage/usr/lib/sysusers.d/fleet.conf"

# The operator's documentation where Debian puts it: the README and docs/ with the same
# layout, so that the README's links (docs/deploy.md) lead to the right file. Debian policy
# 12.3: documentation over 4 kB is gzip-compressed (-n: reproducible).
doc="$stage/usr/share/doc/fleet"
install -d "$doc/docs"
install -m 0644 "$here/copyright" "$doc/copyright"
install -m 0644 "$workspace/README.md" "$doc/README.md"
install -m 0644 "$workspace"/docs/*.md "$workspace"/docs/*.svg "$workspace"/docs/*.png "$doc/docs/"
find "$doc" -name '*.md' -size +4k -exec gzip -9n {} +
sed -e "s/@VERSION@/$version/" -e "s/@DATE@/$(date -R -d @"${SOURCE_DATE_EPOCH:-$(git -C "$workspace" log -1 --format=%ct 2>/dev/null || date +%s)}")/" \
    "$here/changelog" | gzip -9n >"$doc/changelog.Debian.gz"

for script in postinst prerm postrm; do
    install -m 0755 "$here/$script" "$stage/DEBIAN/$script"
done
(cd "$stage" && find etc -type f | sed 's|^|/|' | sort) >"$stage/DEBIAN/conffiles"
# Every file's checksum, for `dpkg --verify` and debsums. The conffiles (every file under
# etc/, above) are left out, as dh_md5sums leaves them out: dpkg records their sums itself.
(cd "$stage" && find . -path ./DEBIAN -prune -o -path ./etc -prune -o -type f -printf '%P\0' |
    LC_ALL=C sort -z | xargs -0 md5sum) >"$stage/DEBIAN/md5sums"
chmod 0644 "$stage/DEBIAN/md5sums"

# What the binaries link against (libc6, libgcc-s1), as dpkg-shlibdeps computes it for a
# source package: it only needs a debian/control naming the package.
shlibs=$(
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    mkdir "$tmp/debian"
    printf 'Source: fleet\n\nPackage: fleet\nArchitecture: any\n' >"$tmp/debian/control"
    cd "$tmp" && dpkg-shlibdeps -O "$stage/usr/bin/fleetd" "$stage/usr/bin/fleetctl" 2>/dev/null |
        sed -n 's/^shlibs:Depends=//p'
)
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@SHLIBS@/$shlibs/" -e "s/@SIZE@/$size/" \
    "$here/control" >"$stage/DEBIAN/control"

dpkg-deb --root-owner-group -Z"${DEB_COMPRESS:-xz}" --build "$stage" "$deb" >/dev/null
rm -rf "$stage"
# Errors fail the build; warnings and information tags are shown (docs/deploy.md, section 1,
# says which ones stay and why; the package test checks that those this package once had stay gone).
if [ "${LINTIAN:-yes}" != no ]; then
    lintian --fail-on error --display-info --suppress-tags-from-file "$here/lintian-suppressed" \
        "$deb" >&2
fi
echo "$deb"
