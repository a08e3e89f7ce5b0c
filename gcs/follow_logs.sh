#!/usr/bin/env bash
# Follow one worker's log of a run: from the bucket (default) or live over SSH.
USAGE="Usage: gcs/follow_logs.sh [--dry-run] [--env FILE] [--run NAME] [--worker N] [--interval SECONDS] [--once | --live]

Print gs://BUCKET/logs/NAME/worker-N.log and keep printing what is added to it (the workers
copy their log there every minute), until interrupted. Works from any machine, also after the
VM is gone. Worker 0 reports the training metrics; other workers matter when one fails.

Options:
  --run NAME          run name (default: RUN_NAME from the settings file)
  --worker N          worker index (default: 0)
  --interval SECONDS  polling period (default: 30)
  --once              print the current log and exit
  --live              instead, SSH to the worker and 'tail -F' its local log (no upload delay)"
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

parse_args "$@"
load_settings
run_name=$RUN_NAME worker=0 interval=30 once=0 live=0
set -- "${ARGS[@]+"${ARGS[@]}"}"
while (($#)); do
  case $1 in
    --run | --worker | --interval)
      (($# >= 2)) || die "$1 needs a value"
      case $1 in
        --run) run_name=$2 ;;
        --worker) worker=$2 ;;
        --interval) interval=$2 ;;
      esac
      shift
      ;;
    --once) once=1 ;;
    --live) live=1 ;;
    *) die "unexpected argument $1 (see --help)" ;;
  esac
  shift
done
[[ $worker =~ ^[0-9]+$ ]] || die "--worker $worker: expected a worker index (0, 1, ...)"
[[ $interval =~ ^[1-9][0-9]*$ ]] || die "--interval $interval: expected a positive number of seconds"
[[ -n $run_name && $run_name != */* ]] || die "--run '$run_name': expected a name without '/'"
log_name=$(worker_log_name "$worker")

if ((live)); then
  require PROJECT ZONE TPU_NAME
  tpu_ssh "$worker" "$(quote_argv tail -n 200 -F "$LOG_ROOT/$run_name/$log_name")"
  exit
fi

require BUCKET
uri="$(log_uri "$run_name")/$log_name"
if ((DRY_RUN)); then
  # The first poll; later polls repeat it from the last byte printed.
  run gcloud storage objects describe "$uri" --format='value(size)'
  run gcloud storage cat --range=0- "$uri"
  exit 0
fi
byte_length() {
  local LC_ALL=C
  printf '%s' "${#1}"
}

offset=0
while true; do
  size=$(gcloud storage objects describe "$uri" --format='value(size)' 2>/dev/null) || size=0
  if ((size > offset)); then
    # Count the bytes actually printed: the object may grow between the two calls.
    chunk=$(gcloud storage cat --range="$offset-" "$uri"; printf x)
    chunk=${chunk%x}
    printf '%s' "$chunk"
    offset=$((offset + $(byte_length "$chunk")))
  elif ((offset == 0 && once)); then
    note "nothing at $uri yet"
  fi
  ((once)) && break
  sleep "$interval"
done
