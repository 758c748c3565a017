#!/bin/sh
# Entrypoint of the replaygpu image.
#
#   IMAGE learner ... | actor ... | serve ... | health ... | --version   -> replaygpu ...
#   IMAGE replaygpu ...                                                -> replaygpu ...
#   IMAGE sh | python ... (any other executable on PATH)               -> run as is
#
# Before a learner or a service starts (and before TensorFlow loads), each folder given with
# --checkpoint-dir or --journal-dir must be writable by this container's user: a bind-mounted
# host folder keeps its host owner. If it is not, this prints one line naming the folder, the
# uid/gid and the fixes, and exits 2.
#
# Replicas of one actor service (`docker compose up --scale actor=N`) cannot be told apart by
# their arguments, but each needs its own --actor-index (its seed, its Ape-X epsilon and its
# n-step streams). With REPLAYGPU_ACTOR_SLOTS=DIR (a volume shared by the replicas) and no
# --actor-index, an actor claims the lowest free index in [0, --num-actors) by holding
# flock(DIR/actor-I.lock) for its lifetime; the kernel frees the claim when the container stops.
#
# Then it execs replaygpu, which becomes PID 1 and receives SIGTERM itself (final checkpoint).
set -eu

case "${1:-}" in
    replaygpu) shift ;;
    -* | learner | actor | serve | health | info | demo | eval) ;;
    *)
        if [ "$#" -gt 0 ] && command -v "$1" >/dev/null 2>&1; then
            exec "$@"
        fi
        ;;
esac

# prints why folder $1 is not writable (nothing: it is)
not_writable() {
    if ! mkdir -p "$1" 2>/dev/null; then
        echo "it cannot be created"
    elif (: >"$1/.replaygpu-write-check.$$") 2>/dev/null; then
        rm -f "$1/.replaygpu-write-check.$$"
    else
        echo "it is owned by uid $(stat -c %u "$1") gid $(stat -c %g "$1"), mode $(stat -c %a "$1")"
    fi
}

# exits 2 with one line naming the folder, this uid/gid and the fixes, unless $2 is writable
check_folder() {
    why=$(not_writable "$2")
    [ -z "$why" ] && return 0
    uid=$(id -u)
    gid=$(id -g)
    echo "replaygpu: $1 $2 is not writable by uid $uid gid $gid ($why); fix one of:" \
        "on the host \`chown -R $uid:$gid HOST_DIR\` (the folder mounted at $2) or use a named" \
        "volume; run as the folder's owner with \`--user \$(id -u):\$(id -g)\`;" \
        "\`podman run --userns=keep-id\` or a \`-v HOST_DIR:$2:U\` mount;" \
        "Kubernetes \`securityContext.fsGroup: $gid\`" >&2
    exit 2
}

fail() {
    echo "replaygpu: $*" >&2
    exit 2
}

# Walk the arguments for --checkpoint-dir/--journal-dir (as "--flag DIR" or "--flag=DIR"), and
# note the subcommand, --actor-index, --num-actors and --processes.
previous=""
subcommand=""
actor_index=""
num_actors=""
processes=""
for arg in "$@"; do
    case "$previous" in
        --checkpoint-dir | --journal-dir) check_folder "$previous" "$arg" ;;
        --actor-index) actor_index=$arg ;;
        --num-actors) num_actors=$arg ;;
        --processes) processes=$arg ;;
    esac
    case "$arg" in
        learner | actor | serve | health | info | demo | eval) subcommand=${subcommand:-$arg} ;;
        --checkpoint-dir=* | --journal-dir=*) check_folder "${arg%%=*}" "${arg#*=}" ;;
        --actor-index=*) actor_index=${arg#*=} ;;
        --num-actors=*) num_actors=${arg#*=} ;;
        --processes=*) processes=${arg#*=} ;;
    esac
    previous=$arg
done

slots=${REPLAYGPU_ACTOR_SLOTS:-}
if [ "$subcommand" = actor ] && [ -n "$slots" ] && [ -z "$actor_index" ]; then
    case "$num_actors" in
        "" | *[!0-9]*) fail "REPLAYGPU_ACTOR_SLOTS=$slots needs the actor's --num-actors N" \
            "(the fleet size), got '$num_actors'; pass --num-actors, or unset" \
            "REPLAYGPU_ACTOR_SLOTS and pass --actor-index" ;;
    esac
    case "$processes" in
        "" | 1) ;;
        *) fail "REPLAYGPU_ACTOR_SLOTS=$slots gives each replica one actor index, but got" \
            "--processes $processes; pass --processes 1 (or leave it out) and scale the replicas" ;;
    esac
    check_folder REPLAYGPU_ACTOR_SLOTS "$slots"
    i=0
    while [ "$i" -lt "$num_actors" ]; do
        exec 9>>"$slots/actor-$i.lock"
        flock --nonblock 9 && break
        exec 9>&-
        i=$((i + 1))
    done
    [ "$i" -lt "$num_actors" ] || fail "all $num_actors actor indices in" \
        "REPLAYGPU_ACTOR_SLOTS=$slots are taken: more actor replicas than --num-actors" \
        "$num_actors; scale the actors to at most $num_actors or raise --num-actors"
    echo "replaygpu: actor index $i of $num_actors (claimed $slots/actor-$i.lock)" >&2
    set -- "$@" --actor-index "$i"
    [ -n "$processes" ] || set -- "$@" --processes 1
fi

exec replaygpu "$@"
