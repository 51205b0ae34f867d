#!/bin/sh
# The soak's job inside a container image that has busybox alone (no Python): the evidence
# bench/chaoskit/job.py writes, in the same file format, from the kernel's clocks.
#
#   sh job_container.sh EVIDENCE_DIR SECONDS EXIT_CODE
#
# busybox's date has no sub-second field, so times come from the boot clock (/proc/uptime,
# /proc/$$/stat's starttime, both CLOCK_BOOTTIME in 1/100 s), turned into wall-clock time
# with CHAOS_BOOT_OFFSET (wall minus boot clock, measured by the soak on this machine). The
# heartbeat is the file's mtime, which the kernel stamps in wall-clock time. busybox has no
# flock: overlaps are judged from the parts' times alone.
evidence=$1 seconds=$2 code=$3
job=${TRELLIS_JOB_ID:-unknown} restarts=${TRELLIS_RESTART_COUNT:-0} rank=${NODE_RANK:-0}
offset=${CHAOS_BOOT_OFFSET:-0}
now() { awk -v o="$offset" '{ printf "%.3f", o + $1 }' /proc/uptime; }
# starttime is field 22 of stat(5); the command name before it holds no space here ("sh").
spawned=$(awk -v o="$offset" '{ printf "%.3f", o + $22 / 100 }' /proc/$$/stat)
ticks=$(awk '{ print $22 }' /proc/$$/stat)
file="$evidence/$job.r$restarts.n$rank.$ticks$$"
echo "{\"ev\": \"start\", \"t\": $(now), \"node\": \"${TRELLIS_NODE:-}\", \"overlap\": false, \"spawned\": $spawned}" >> "$file"
stopped=""
trap 'stopped=15' TERM
trap 'stopped=1' HUP
deadline=$(awk -v s="$seconds" '{ printf "%d", ($1 + s) * 100 }' /proc/uptime)
while [ -z "$stopped" ] && [ "$(awk '{ printf "%d", $1 * 100 }' /proc/uptime)" -lt "$deadline" ]; do
    touch "$file"
    sleep 0.25
done
if [ -n "$stopped" ]; then
    echo "{\"ev\": \"term\", \"t\": $(now), \"signal\": $stopped}" >> "$file"
    code=$((128 + stopped))
fi
echo "{\"ev\": \"end\", \"t\": $(now), \"code\": $code}" >> "$file"
exit "$code"
