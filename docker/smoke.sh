#!/usr/bin/env bash
# Smoke test of the image with buildah + podman (as on the project's machines; not part of CI):
# build it, check that an unwritable checkpoint folder is refused in one line with exit 2, run a
# learner and 2 actor containers on 127.0.0.1 for about a minute, check health and metrics, stop
# the learner with SIGTERM, check its final checkpoint, restart it and check that training
# resumed from it; then remove every container it made. Prints PASS/FAIL lines; exits 1 on any
# FAIL.
#
#   docker/smoke.sh                    # as root, from anywhere in the checkout
#   SKIP_BUILD=1 IMAGE=localhost/replaygpu:dev docker/smoke.sh
#
# Settings (environment): IMAGE, BASE (build base), CONTAINERS (folder of build.sh/run.sh),
# PORT (gRPC), MPORT (metrics), RUN_SECONDS (training before the stop), SKIP_BUILD=1.
# Containers use the host's network here: everything binds and connects to 127.0.0.1 only.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

IMAGE=${IMAGE:-localhost/replaygpu:smoke}
BASE=${BASE:-localhost/bookworm-python}
CONTAINERS=${CONTAINERS:-$(cd .. && pwd)/shared/containers}
[ -x "$CONTAINERS/run.sh" ] || CONTAINERS=/work/shared/containers
PORT=${PORT:-50151}
MPORT=${MPORT:-9151}
RUN_SECONDS=${RUN_SECONDS:-60}
TOKEN=smoke-$$-$RANDOM
PREFIX=rg-smoke-$$
LEARNER=$PREFIX-learner
SLOTS=$PREFIX-slots
PODMAN=(podman --runtime runc)
RUN=("$CONTAINERS/run.sh")
WORK=$(mktemp -d /tmp/replaygpu-smoke.XXXXXX)
failures=0

pass() { echo "PASS $*"; }
fail() {
    echo "FAIL $*"
    failures=$((failures + 1))
}
note() { echo "     $*"; }

cleanup() {
    for c in "$LEARNER" "$PREFIX-actor-1" "$PREFIX-actor-2" "$PREFIX-refused"; do
        "${PODMAN[@]}" rm -f -v -t 10 "$c" >/dev/null 2>&1
    done
    "${PODMAN[@]}" volume rm -f "$SLOTS" >/dev/null 2>&1
    rm -rf "$WORK"
}
trap cleanup EXIT

# the value of metric $1 (first sample) from the learner's endpoint, or empty
metric() {
    python3 - "$MPORT" "$1" <<'EOF'
import sys, urllib.request
try:
    text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read()
except OSError:
    sys.exit(0)
for line in text.decode().splitlines():
    if line.startswith(sys.argv[2] + " ") or line.startswith(sys.argv[2] + "{"):
        print(int(float(line.rsplit(" ", 1)[1])))
        break
EOF
}

# wait up to $1 seconds for the learner's health check; prints the seconds waited
wait_healthy() {
    local start=$SECONDS
    while ((SECONDS - start < $1)); do
        if "${PODMAN[@]}" healthcheck run "$LEARNER" >/dev/null 2>&1; then
            echo $((SECONDS - start))
            return 0
        fi
        sleep 1
    done
    return 1
}

learner_args=(learner --agent dqn --env CartPole-v1 --address "127.0.0.1:$PORT"
    --metrics-port "$MPORT" --checkpoint-dir /ckpt --steps 1000000)

# -- 1. build -----------------------------------------------------------------------------------
if [ "${SKIP_BUILD:-0}" != 1 ]; then
    started=$SECONDS
    if "$CONTAINERS/build.sh" --layers --format docker -f docker/Dockerfile -t "$IMAGE" \
        --build-arg "BASE=$BASE" . >"$WORK/build.log" 2>&1; then
        pass "image $IMAGE built from $BASE in $((SECONDS - started)) s"
    else
        tail -20 "$WORK/build.log"
        fail "build (log above)"
        exit 1
    fi
fi
size=$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE" 2>/dev/null)
note "image size: $((size / 1000000)) MB"

# -- 2. an unwritable checkpoint folder: one line, exit 2, nothing started ----------------------
mkdir -p "$WORK/root-owned" && chmod 755 "$WORK/root-owned"
"${RUN[@]}" --name "$PREFIX-refused" --no-healthcheck -v "$WORK/root-owned:/ckpt" "$IMAGE" \
    "${learner_args[@]}" >"$WORK/refused.out" 2>"$WORK/refused.err"
code=$?
lines=$(grep -cv 'systemd' "$WORK/refused.err")
if [ "$code" = 2 ] && [ "$lines" = 1 ] && grep -q 'not writable by uid 10001' "$WORK/refused.err" \
    && [ ! -s "$WORK/refused.out" ]; then
    pass "root-owned checkpoint folder refused: exit 2, one line:"
    note "$(grep -v systemd "$WORK/refused.err")"
else
    fail "root-owned checkpoint folder: exit $code, $lines lines: $(cat "$WORK/refused.err")"
fi
"${PODMAN[@]}" rm -f -v "$PREFIX-refused" >/dev/null 2>&1

# -- 3. learner + 2 actors -------------------------------------------------------------------
CKPT=$WORK/ckpt
mkdir -p "$CKPT" && chown 10001:10001 "$CKPT"
# podman runs health checks from systemd timers, which this machine lacks: interval disabled,
# `podman healthcheck run` runs the image's check by hand (pointed at this port).
"${RUN[@]}" -d --name "$LEARNER" -e "REPLAYGPU_TOKEN=$TOKEN" -v "$CKPT:/ckpt" \
    --health-cmd "replaygpu health 127.0.0.1:$PORT --timeout 5" --health-interval disable \
    "$IMAGE" "${learner_args[@]}" >/dev/null 2>"$WORK/run.err" || {
    cat "$WORK/run.err"
    fail "learner did not start"
    exit 1
}
if waited=$(wait_healthy 180); then
    pass "learner healthy (replaygpu health: SERVING) after ${waited} s"
else
    "${PODMAN[@]}" logs "$LEARNER" 2>&1 | tail -20
    fail "learner not healthy within 180 s"
    exit 1
fi
for i in 1 2; do
    # restart policy as in compose.yaml (restart: on-failure:5)
    "${RUN[@]}" -d --name "$PREFIX-actor-$i" --no-healthcheck --restart on-failure:5 \
        -e "REPLAYGPU_TOKEN=$TOKEN" \
        -e REPLAYGPU_ACTOR_SLOTS=/actor-slots -v "$SLOTS:/actor-slots" "$IMAGE" \
        actor "127.0.0.1:$PORT" --num-actors 2 --wait >/dev/null 2>>"$WORK/run.err"
done
sleep 5
indices=$(for i in 1 2; do
    "${PODMAN[@]}" logs "$PREFIX-actor-$i" 2>&1 | grep -o 'actor index [0-9]*'
done | sort | paste -sd ',')
if [ "$indices" = "actor index 0,actor index 1" ]; then
    pass "the 2 actor replicas claimed indices 0 and 1"
else
    fail "actor indices: '$indices'"
fi

started=$SECONDS
while ((SECONDS - started < RUN_SECONDS)); do
    sleep 15
    note "t=$((SECONDS - started)) s: SGD steps $(metric replaygpu_sgd_steps_total)," \
        "table $(metric replaygpu_table_size), open streams $(metric replaygpu_open_streams)"
done
before=$(metric replaygpu_sgd_steps_total)
inserted=$(metric replaygpu_table_inserted_total)
if [ -n "$before" ] && [ "$before" -gt 0 ] && [ "${inserted:-0}" -gt 0 ]; then
    pass "metrics on 127.0.0.1:$MPORT: $inserted transitions inserted, $before SGD steps"
else
    fail "metrics: SGD steps '$before', inserted '$inserted'"
fi
"${PODMAN[@]}" exec "$LEARNER" replaygpu info "127.0.0.1:$PORT" 2>&1 | head -2 | sed 's/^/     /'

# -- 4. SIGTERM: final checkpoint -------------------------------------------------------------
stopped=$SECONDS
"${PODMAN[@]}" stop -t 60 "$LEARNER" >/dev/null
code=$("${PODMAN[@]}" inspect --format '{{.State.ExitCode}}' "$LEARNER")
final=$("${PODMAN[@]}" logs "$LEARNER" 2>&1 | grep 'final checkpoint' | tail -1)
if [ "$code" = 0 ] && [ -n "$final" ] && ls "$CKPT"/ckpt-*.index >/dev/null 2>&1; then
    pass "podman stop (SIGTERM) took $((SECONDS - stopped)) s, exit 0, final checkpoint written:"
    note "${final#*: }"
    note "$(cd "$CKPT" && echo *)"
    final_step=$(echo "$final" | grep -o 'SGD step [0-9]*' | grep -o '[0-9]*$')
    before=${final_step:-$before}
else
    "${PODMAN[@]}" logs "$LEARNER" 2>&1 | tail -10
    fail "stop: exit $code, final checkpoint line '$final', files: $(ls "$CKPT")"
fi

# -- 5. restart: resumes from the checkpoint, the actors reconnect, training goes on ----------
"${PODMAN[@]}" start "$LEARNER" >/dev/null
if waited=$(wait_healthy 180); then
    pass "restarted learner healthy after ${waited} s"
else
    fail "restarted learner not healthy within 180 s"
fi
resumed=$("${PODMAN[@]}" logs "$LEARNER" 2>&1 | grep 'resumed from' | tail -1)
if [ -n "$resumed" ]; then
    pass "restored: ${resumed#*: }"
else
    fail "no 'resumed from' line in the restarted learner's log"
fi
started=$SECONDS
until [ "$(metric replaygpu_open_streams)" = 2 ] || ((SECONDS - started > 90)); do sleep 2; done
streams=$(metric replaygpu_open_streams)
restarts=$(for i in 1 2; do
    echo "actor-$i: $("${PODMAN[@]}" inspect --format '{{.RestartCount}}' "$PREFIX-actor-$i")"
done | paste -sd ' ')
if [ "$streams" = 2 ]; then
    pass "both actors reconnected $((SECONDS - started)) s after the learner was healthy"
else
    fail "$streams of 2 actor streams open 90 s after the restart; the actors' last lines:"
    for i in 1 2; do
        "${PODMAN[@]}" logs "$PREFIX-actor-$i" 2>&1 | tail -5 | sed "s/^/     actor-$i: /"
    done
fi
note "actor restarts by the restart policy: $restarts"
sleep 15
after=$(metric replaygpu_sgd_steps_total)
if [ -n "$after" ] && [ -n "$before" ] && [ "$after" -gt "$before" ]; then
    pass "training resumed: SGD step $before at the final checkpoint, $after 15 s after" \
        "the actors reconnected"
else
    fail "SGD steps after the restart '$after' not above '$before'"
fi

# -- 6. stop everything ---------------------------------------------------------------------
for i in 1 2; do
    "${PODMAN[@]}" stop -t 30 "$PREFIX-actor-$i" >/dev/null
    code=$("${PODMAN[@]}" inspect --format '{{.State.ExitCode}}' "$PREFIX-actor-$i")
    if [ "$code" = 0 ]; then
        pass "actor $i stopped by SIGTERM, exit 0"
    else
        fail "actor $i: exit $code after SIGTERM"
    fi
done
"${PODMAN[@]}" stop -t 60 "$LEARNER" >/dev/null
cleanup
trap - EXIT
left=$("${PODMAN[@]}" ps -a --format '{{.Names}}' | grep -c "^$PREFIX" || true)
if [ "$left" = 0 ]; then
    pass "cleaned up: no $PREFIX containers left"
else
    fail "$left $PREFIX containers left"
fi

if [ "$failures" = 0 ]; then
    echo "smoke: all passed"
    exit 0
fi
echo "smoke: $failures failed"
exit 1
