# Unit names and machine IDs from the cluster, as this line would reach it (fleetctl's
# completion/names.rs). Wraps clap's _fleetctl above.
_fleetctl_with_names() {
    local cur="$2" prev="$3"
    _fleetctl "$@"
    [[ "$cur" == -* ]] && return 0
    case "$prev" in
        @VALUED@) return 0 ;;
    esac
    local words=()
    read -ra words <<< "${COMP_LINE:0:COMP_POINT}"
    # The word being completed is no argument yet.
    [[ -n "$cur" ]] && unset 'words[${#words[@]}-1]'
    local globals=() sub="" args=0 i word
    for (( i = 1; i < ${#words[@]}; i++ )); do
        word="${words[i]}"
        case "$word" in
            @GLOBAL@) globals+=("$word" "${words[i+1]}"); i=$((i + 1)) ;;
            @GLOBAL_EQ@) globals+=("$word") ;;
            @VALUED@) i=$((i + 1)) ;;
            -*) ;;
            *) if [[ -z "$sub" ]]; then sub="$word"; else args=$((args + 1)); fi ;;
        esac
    done
    local ask=()
    case "$sub" in
        @MACHINES@) (( args == 0 )) && ask+=(machines) ;;
    esac
    case "$sub" in
        @UNITS@) ask+=(units) ;;
        ssh) (( args == 0 )) && ask+=(units) ;;
    esac
    local kind names
    for kind in "${ask[@]}"; do
        case "$kind" in
            units) names=$(FLEETCTL_REQUEST_TIMEOUT="${FLEETCTL_REQUEST_TIMEOUT:-2}" "$1" "${globals[@]}" list-unit-files --no-legend --fields unit 2>/dev/null) ;;
            machines) names=$(FLEETCTL_REQUEST_TIMEOUT="${FLEETCTL_REQUEST_TIMEOUT:-2}" "$1" "${globals[@]}" list-machines --no-legend --full --fields machine 2>/dev/null) ;;
        esac
        COMPREPLY+=( $(compgen -W "$names" -- "$cur") )
    done
    case "$sub" in
        @FILES@) COMPREPLY+=( $(compgen -f -- "$cur") ) ;;
    esac
    return 0
}

if [[ "${BASH_VERSINFO[0]}" -eq 4 && "${BASH_VERSINFO[1]}" -ge 4 || "${BASH_VERSINFO[0]}" -gt 4 ]]; then
    complete -F _fleetctl_with_names -o nosort -o bashdefault -o default fleetctl
else
    complete -F _fleetctl_with_names -o bashdefault -o default fleetctl
fi
