#!/usr/bin/env bash
# Run one command, with the same arguments, on every worker of the TPU VM; log to the bucket.
USAGE="Usage: gcs/run_all.sh [--dry-run] [--env FILE] [--run NAME] [--worker N|all] [--foreground] -- COMMAND [ARG...]

Start COMMAND with identical arguments on every worker (--worker=all) of TPU_NAME, as a
multi-host JAX program needs: each worker runs it from ~/REMOTE_DIR with the installed .venv
first on PATH, through gcs/worker_run.sh, which tees its output to ~/$LOG_ROOT/NAME/worker-N.log
and copies that to gs://BUCKET/logs/NAME/worker-N.log every minute. Every argument is quoted
for the remote shell, so it arrives exactly as given here.

By default the command is detached (nohup setsid) and this script returns once it has started
on every worker: a multi-day run does not depend on your SSH connection. Watch it with
gcs/follow_logs.sh. Example:

  gcs/run_all.sh --run bert-base-pmi -- pmi-jax train --config base \\
      --data gs://BUCKET/prepared/owt --scheme pmi --workdir gs://BUCKET/runs/bert-base-pmi

Options:
  --run NAME      log folder name (default: RUN_NAME from the settings file)
  --worker N|all  which workers (default: all; a pod slice needs all)
  --foreground    stay attached and stream the output (for short commands)"
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

parse_args "$@"
load_settings
run_name=$RUN_NAME worker=all foreground=0 command=()
set -- "${ARGS[@]+"${ARGS[@]}"}"
while (($#)); do
  case $1 in
    --run | --worker)
      (($# >= 2)) || die "$1 needs a value"
      if [[ $1 == --run ]]; then run_name=$2; else worker=$2; fi
      shift
      ;;
    --run=*) run_name=${1#--run=} ;;
    --worker=*) worker=${1#--worker=} ;;
    --foreground) foreground=1 ;;
    --)
      shift
      command=("$@")
      break
      ;;
    *) die "unexpected argument $1 (the command goes after --; see --help)" ;;
  esac
  shift
done
((${#command[@]})) || die "no COMMAND given after -- (see --help)"
[[ $worker == all || $worker =~ ^[0-9]+$ ]] || die "--worker $worker: expected a number or all"
[[ -n $run_name && $run_name != */* ]] || die "--run '$run_name': expected a name without '/'"
require PROJECT ZONE TPU_NAME BUCKET REMOTE_DIR

launch=$(quote_argv bash gcs/worker_run.sh --log-uri "$(log_uri "$run_name")" -- "${command[@]}")
if ((foreground)); then
  remote="$(quote_argv cd "$REMOTE_DIR") && $launch"
else
  remote="$(quote_argv cd "$REMOTE_DIR") && nohup setsid $launch > /dev/null 2>&1 < /dev/null &"
  note "starting on worker(s) $worker, detached; follow with: gcs/follow_logs.sh --run $(quote "$run_name")"
fi
tpu_ssh "$worker" "$remote"
