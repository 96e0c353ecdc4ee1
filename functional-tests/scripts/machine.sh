#!/bin/bash
# One test machine: a real systemd as PID 1 of its own PID+mount+UTS+IPC namespace, inside a
# network namespace the harness made. Two phases, both run by this one file so the whole boot
# sequence reads top to bottom:
#
#   machine.sh boot   on the host: joins the machine's cgroups, then enters the network namespace
#                     and unshares the rest, re-running this script as `init` in the new namespaces.
#   machine.sh init   PID 1 of the new namespaces: builds the machine's private view of the
#                     filesystem, then execs systemd.
#
# Inputs (environment, set by the harness in Rust, see src/machine.rs):
#   FT_STAGE     host directory with this machine's files: machine-id, hostname, system/ (units for
#                /run/systemd/system), fleet/ (copied to /run/fleet)
#   FT_NETNS     name of the network namespace (/run/netns/$FT_NETNS)
#   FT_CGROUPS   space-separated cgroup directories made for this machine, one per hierarchy
#   FT_TARGET    the unit systemd boots
#   FT_BIN_DIR   optional: host directory mounted read-only at /opt/fleet/bin
#   FT_WRITABLE_ROOT  optional, 1: the machine's root is an overlay over the host's root with a
#                tmpfs on top (writes stay in the machine's memory), for tests that install
#                packages with dpkg; else the host's root, read-only
#
# Safety: nothing here may change the host. Every mount happens in the new, private mount
# namespace, and `init` refuses to exec systemd unless /tmp is a fresh tmpfs, because systemd's
# boot empties /tmp (Debian's `D /tmp` tmpfiles rule) and without it that would be the host's /tmp.
set -euo pipefail

boot() {
    # Our own cgroup in every hierarchy BEFORE unshare, so that everything systemd forks later is
    # below it. The host has no cgroup namespace: without this, same-named units on two machines
    # would share /system.slice/<unit> and see each other's processes.
    local dir
    for dir in $FT_CGROUPS; do
        echo $$ >"$dir/cgroup.procs"
    done
    # nsenter rather than `ip netns exec`: the latter remounts /sys for the new network namespace,
    # which drops the cgroup mounts below /sys/fs/cgroup that systemd needs.
    exec nsenter --net="/run/netns/$FT_NETNS" \
        unshare --pid --fork --mount --uts --ipc --mount-proc --propagation private \
        "$0" init
}

# Allowed OS unit files: everything else the OS ships is masked, so the machine runs only
# journald, dbus and what the harness installs. Targets stay: they only group units (which are
# masked) and default dependencies of every service name them (Requires=sysinit.target), so
# masking them would make every start fail.
keep_unit() {
    case "$1" in
        systemd-journald.service | systemd-journald.socket | systemd-journald-dev-log.socket) return 0 ;;
        dbus.service | dbus.socket) return 0 ;;
        *.target | *.slice) return 0 ;;
        *) return 1 ;;
    esac
}

# The machine's own root: an overlay whose lower layer is the host's root filesystem (that
# mount alone, read through) and whose upper layer is a tmpfs, made the root with pivot_root.
# Whatever the machine writes (dpkg's database, /etc, /usr) lands in the tmpfs and dies with
# the machine's mount namespace; the host's files are never written. The old root stays
# mounted at /.host-root until `drop_host_root`: the binds below still read from it.
writable_root() {
    mount -t tmpfs -o mode=0755 tmpfs-root /mnt
    mkdir /mnt/upper /mnt/work /mnt/root
    mount -t overlay -o lowerdir=/,upperdir=/mnt/upper,workdir=/mnt/work overlay-root /mnt/root
    local dir
    for dir in dev proc sys; do
        mount --rbind "/$dir" "/mnt/root/$dir"
    done
    mkdir /mnt/root/.host-root
    cd /mnt/root
    pivot_root . .host-root
    cd /
}

drop_host_root() {
    umount -l /.host-root
    rmdir /.host-root
}

mask_os_units() {
    local dir path name
    for dir in /etc/systemd/system /lib/systemd/system /usr/lib/systemd/system; do
        for path in "$dir"/*; do
            name=${path##*/}
            # Directories (foo.target.wants, foo.service.d) are not units.
            [[ -d $path ]] && continue
            keep_unit "$name" && continue
            # system.control ranks above /etc and /lib, so a /dev/null link there wins.
            ln -sfn /dev/null "/run/systemd/system.control/$name"
        done
    done
}

init() {
    # Only ever as PID 1 of the namespaces `boot` made (`unshare --pid --fork --mount`): run on
    # the host, the mounts below would hide the host's /run and /tmp and make its / read-only.
    if [[ $$ -ne 1 ]]; then
        echo "machine.sh init: not PID 1 of a new namespace, refusing" >&2
        exit 2
    fi

    # The harness's files (this machine's stage directory, the bin dir) may live anywhere, also
    # below /tmp, /var/tmp or /run, which get fresh mounts next. Open them first: a directory
    # reached through /proc/self/fd stays the host's, whatever is mounted over its path later.
    exec 3<"$FT_STAGE"
    local stage=/proc/self/fd/3
    if [[ -n ${FT_BIN_DIR:-} ]]; then
        exec 4<"$FT_BIN_DIR"
    fi
    local writable=${FT_WRITABLE_ROOT:-}
    if [[ $writable == 1 ]]; then
        writable_root
    fi

    # Host mounts below the directories the machine gets fresh must go first, in this private
    # mount namespace only: /run/netns holds every machine's network namespace, and a copy of
    # those mounts here (merely hidden under the new /run) would keep the other machines'
    # namespaces alive for as long as this machine runs.
    local target
    findmnt -rn -o TARGET | grep -E '^/(run|tmp|var/tmp|var/lib/systemd|var/log/journal|dev/shm)(/|$)' |
        sort -r | while read -r target; do
            # Another cluster may tear its namespace down between findmnt and here; a mount
            # that is already gone is fine (the tmpfs checks below still guard the host).
            if ! umount -l "$target" 2>/dev/null && findmnt -rn --mountpoint "$target" >/dev/null; then
                echo "machine.sh: cannot unmount $target" >&2
                exit 1
            fi
        done

    # Writable, private, empty: systemd, journald, dbus and fleetd write here.
    local dir
    for dir in /run /tmp /var/tmp /var/lib/systemd /var/log/journal /dev/shm; do
        mount -t tmpfs -o mode=0755,nosuid,nodev "tmpfs-$dir" "$dir"
    done
    chmod 1777 /tmp /var/tmp /dev/shm
    if [[ $(findmnt -n -o FSTYPE --mountpoint /tmp) != tmpfs ]]; then
        echo "machine.sh: /tmp is not a private tmpfs, refusing to boot systemd" >&2
        exit 1
    fi

    # Identity. Read-only binds: the machine cannot rewrite the harness's files.
    mount --no-canonicalize --bind "$stage/machine-id" /etc/machine-id
    mount -o remount,bind,ro /etc/machine-id
    mount --no-canonicalize --bind "$stage/hostname" /etc/hostname
    mount -o remount,bind,ro /etc/hostname
    hostname "$(cat "$stage/hostname")"

    if [[ -n ${FT_BIN_DIR:-} ]]; then
        # /opt gets a tmpfs so the mount point can exist without touching the host's /opt.
        mount -t tmpfs -o mode=0755 tmpfs-opt /opt
        mkdir -p /opt/fleet/bin
        mount --no-canonicalize --bind /proc/self/fd/4 /opt/fleet/bin
        mount -o remount,bind,ro /opt/fleet/bin
    fi

    mkdir -p /run/systemd/system /run/systemd/system.control /run/systemd/journald.conf.d /run/fleet
    mask_os_units
    cp -r "$stage/system/." /run/systemd/system/
    cp -r "$stage/fleet/." /run/fleet/
    exec 3<&- 4<&-
    # No persistent journal: the machine's log lives and dies with it. No kernel messages
    # either: /dev/kmsg is the host's, and every machine would copy the host's dmesg.
    printf '[Journal]\nStorage=volatile\nReadKMsg=no\n' >/run/systemd/journald.conf.d/fleet-test.conf

    # Last: from here on the machine cannot write to the host's root filesystem at all (the
    # writable root writes to its tmpfs only, the host's root goes from view). Per-mount
    # flags (bind remounts), so the host's own mounts stay read-write. /sys and /proc/sys hold
    # host-wide kernel settings; the cgroup mounts below /sys/fs/cgroup are separate mounts and
    # stay writable, as the machine's systemd needs.
    if [[ $writable == 1 ]]; then
        drop_host_root
    else
        mount -o remount,bind,ro /
    fi
    mount -o remount,bind,ro /sys
    mount --bind /proc/sys /proc/sys
    mount -o remount,bind,ro /proc/sys

    # container= tells systemd it is not the host's init: it skips hardware and kernel setup,
    # logs to stderr (our log file) and keeps this environment for its services.
    exec env -i container=fleet-test PATH=/usr/sbin:/usr/bin:/sbin:/bin \
        /lib/systemd/systemd --system --unit="$FT_TARGET" --show-status=no
}

case "${1:-}" in
    boot) boot ;;
    init) init ;;
    *)
        echo "usage: machine.sh boot|init (run by the functional-test harness)" >&2
        exit 2
        ;;
esac
