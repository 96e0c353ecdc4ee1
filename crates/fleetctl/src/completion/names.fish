
# Unit names and machine IDs from the cluster, as this line would reach it (fleetctl's
# completion/names.rs): prints the names of kind $argv[1] (units or machines) that the
# argument under the cursor may be, and nothing elsewhere.
function __fleetctl_names
    set -l kind $argv[1]
    set -l words (commandline -opc)
    set -l globals
    set -l sub
    set -l args 0
    set -l n (count $words)
    set -l i 2
    while test $i -le $n
        set -l word $words[$i]
        switch $word
            case @GLOBAL@
                set -a globals $word
                set i (math $i + 1)
                test $i -le $n; and set -a globals $words[$i]
            case @GLOBAL_EQ@
                set -a globals $word
            case @VALUED@
                set i (math $i + 1)
            case '-*'
            case '*'
                if test -z "$sub"
                    set sub $word
                else
                    set args (math $args + 1)
                end
        end
        set i (math $i + 1)
    end
    set -l ask
    if contains -- "$sub" @MACHINES@; and test $args -eq 0
        set -a ask machines
    end
    if contains -- "$sub" @UNITS@
        set -a ask units
    else if test "$sub" = ssh; and test $args -eq 0
        set -a ask units
    end
    contains -- $kind $ask; or return 0
    set -q FLEETCTL_REQUEST_TIMEOUT; or set -lx FLEETCTL_REQUEST_TIMEOUT 2
    switch $kind
        case units
            $words[1] $globals list-unit-files --no-legend --fields unit 2>/dev/null
        case machines
            $words[1] $globals list-machines --no-legend --full --fields machine 2>/dev/null
    end
end

complete -c fleetctl -a "(__fleetctl_names units)"
complete -c fleetctl -a "(__fleetctl_names machines)"
