# Unit names and machine IDs from the cluster, as this line would reach it (fleetctl's
# completion/names.rs). clap's function above is renamed _fleetctl_clap; this one wraps it
# under the name zsh calls, so that it stays in place after the first completion.
_fleetctl() {
    local -a w
    w=("${(@)words[1,CURRENT-1]}")
    local cur="${words[CURRENT]}"
    _fleetctl_clap "$@"
    local ret=$?
    [[ "$cur" == -* ]] && return ret
    case "${w[-1]}" in
        (@VALUED@) return ret ;;
    esac
    local -a globals ask names
    local sub="" word kind
    integer args=0 i
    for (( i = 2; i <= ${#w}; i++ )); do
        word="${w[i]}"
        case "$word" in
            (@GLOBAL@) globals+=("$word" "${w[i+1]}"); i=$((i + 1)) ;;
            (@GLOBAL_EQ@) globals+=("$word") ;;
            (@VALUED@) i=$((i + 1)) ;;
            (-*) ;;
            (*) if [[ -z "$sub" ]]; then sub="$word"; else args=$((args + 1)); fi ;;
        esac
    done
    case "$sub" in
        (@MACHINES@) (( args == 0 )) && ask+=(machines) ;;
    esac
    case "$sub" in
        (@UNITS@) ask+=(units) ;;
        (ssh) (( args == 0 )) && ask+=(units) ;;
    esac
    for kind in $ask; do
        case "$kind" in
            (units) names=(${(f)"$(FLEETCTL_REQUEST_TIMEOUT="${FLEETCTL_REQUEST_TIMEOUT:-2}" "${w[1]}" "${globals[@]}" list-unit-files --no-legend --fields unit 2>/dev/null)"}) ;;
            (machines) names=(${(f)"$(FLEETCTL_REQUEST_TIMEOUT="${FLEETCTL_REQUEST_TIMEOUT:-2}" "${w[1]}" "${globals[@]}" list-machines --no-legend --full --fields machine 2>/dev/null)"}) ;;
        esac
        (( ${#names} )) && compadd -a names && ret=0
    done
    return ret
}

