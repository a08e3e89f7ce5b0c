#!/usr/bin/env bash
# Runs ON a TPU worker (gcs/run_all.sh starts it on each one): one command, logged to the bucket.
USAGE="Usage: gcs/worker_run.sh [--dry-run] --log-uri gs://BUCKET/logs/RUN [--upload-every SECONDS] -- COMMAND [ARG...]

Run COMMAND on this worker with ./.venv/bin first on PATH. Its output (stdout and stderr) is
appended to ~/$LOG_ROOT/RUN/worker-N.log (N: this host's index in the slice) and copied to
LOG_URI/worker-N.log every SECONDS (default 60) and when the command ends. A relaunch on a fresh
VM first fetches that copy, so one log holds every launch of the run. Refuses to start while
the same run is still alive on this worker. Exits with COMMAND's status.

Options:
  --log-uri URI           bucket folder for this run's logs (required)
  --upload-every SECONDS  how often the log is copied to the bucket (default 60)"
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

parse_args "$@"
log_uri="" every=60 command=()
set -- "${ARGS[@]+"${ARGS[@]}"}"
while (($#)); do
  case $1 in
    --log-uri | --upload-every)
      (($# >= 2)) || die "$1 needs a value"
      if [[ $1 == --log-uri ]]; then log_uri=$2; else every=$2; fi
      shift
      ;;
    --)
      shift
      command=("$@")
      break
      ;;
    *) die "unexpected argument $1 (see --help)" ;;
  esac
  shift
done
[[ $log_uri == gs://* ]] || die "--log-uri must be a gs:// URL, got '$log_uri'"
[[ $every =~ ^[1-9][0-9]*$ ]] || die "--upload-every $every: expected a positive number of seconds"
((${#command[@]})) || die "no COMMAND given after -- (see --help)"

# This host's index in the slice: the TPU runtime's metadata, else the host name.
worker_id() {
  if [[ -n ${TPU_WORKER_ID:-} ]]; then
    printf '%s' "$TPU_WORKER_ID"
    return
  fi
  curl -sf --max-time 3 -H 'Metadata-Flavor: Google' \
    http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number ||
    hostname
}

run_name=$(basename "$log_uri")
log_name=$(worker_log_name "$(worker_id)")
log_dir="$HOME/$LOG_ROOT/$run_name"
log="$log_dir/$log_name"
remote_log="${log_uri%/}/$log_name"
pid_file="$log_dir/$log_name.pid"
export PATH="$REPO_ROOT/.venv/bin:$PATH"

if ((DRY_RUN)); then
  [[ -e $log ]] || run gcloud storage cp --quiet "$remote_log" "$log"
  run "${command[@]}"
  run gcloud storage cp --quiet "$log" "$remote_log"
  exit 0
fi

mkdir -p "$log_dir"
if [[ -f $pid_file ]] && kill -0 "$(<"$pid_file")" 2>/dev/null; then
  die "run $run_name is still running on this worker (pid $(<"$pid_file")); not starting a second copy"
fi
echo $$ >"$pid_file"
# A fresh VM (after a preemption) continues the log the bucket already holds.
[[ -e $log ]] || gcloud storage cp --quiet "$remote_log" "$log" >/dev/null 2>&1 || true

upload() { gcloud storage cp --quiet "$log" "$remote_log" >/dev/null 2>&1 || note "warning: could not copy $log to $remote_log"; }
# Its own stdio is /dev/null so that a lingering `sleep` never holds the caller's pipes open.
(while sleep "$every"; do upload; done) </dev/null >/dev/null 2>&1 &
uploader=$!
trap 'kill "$uploader" 2>/dev/null || true; upload; rm -f "$pid_file"' EXIT
# On preemption every process gets SIGTERM: let the command checkpoint and exit, then upload.
trap 'exit 143' TERM

printf '=== %s %s: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$log_name" "$(quote_argv "${command[@]}")" >>"$log"
set +e
"${command[@]}" 2>&1 | tee -a "$log"
status=${PIPESTATUS[0]}
set -e
printf '=== %s exit status %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$status" >>"$log"
exit "$status"
