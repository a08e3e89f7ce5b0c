#!/usr/bin/env bash
# Bring a run back after a preemption: recreate the TPU VM if needed, reinstall, start again.
USAGE="Usage: gcs/relaunch.sh [--dry-run] [--env FILE] [--run NAME] [--state STATE] [--spot | --preemptible | --on-demand] -- pmi-jax train ... --workdir gs://...

Resume a training run from its last checkpoint. Give exactly the command the run was launched
with: 'pmi-jax train' resumes by itself from the latest checkpoint in --workdir, so relaunching
means running the same command again, with the same --workdir, on a working TPU VM. That
--workdir must be a gs:// URL: a preempted VM's disks are gone.

Steps, by the TPU VM's state (gcloud compute tpus tpu-vm describe):
  READY                                 the VM is fine (the job died): start the command again
  PREEMPTED, TERMINATED, STOPPED, ...   delete it, create it again, install, start the command
  not found                             create it, install, start the command
  CREATING, STARTING, REPAIRING, ...    nothing yet: try again when it has settled
A job still alive on a READY VM is not started twice (gcs/worker_run.sh refuses). Spot VMs are
never restarted in place, only recreated. Run this by hand, or from a loop or cron job.

Options:
  --run NAME     run name for the logs (default: RUN_NAME), the same as at launch
  --state STATE  skip the query and act as if the VM were in STATE (READY, PREEMPTED, NOT_FOUND);
                 with --dry-run and no --state, PREEMPTED is assumed
  --spot, --preemptible, --on-demand   capacity for a recreated VM (default: PROVISIONING)"
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

parse_args "$@"
load_settings
run_name=$RUN_NAME state="" capacity=() command=()
set -- "${ARGS[@]+"${ARGS[@]}"}"
while (($#)); do
  case $1 in
    --run | --state)
      (($# >= 2)) || die "$1 needs a value"
      if [[ $1 == --run ]]; then run_name=$2; else state=$2; fi
      shift
      ;;
    --spot | --preemptible | --on-demand) capacity=("$1") ;;
    --)
      shift
      command=("$@")
      break
      ;;
    *) die "unexpected argument $1 (the command goes after --; see --help)" ;;
  esac
  shift
done
((${#command[@]})) || die "no command given after -- (give the one the run was launched with)"
require PROJECT ZONE TPU_NAME

# The checkpoint directory the trainer resumes from: the value of --workdir in the command.
workdir=""
for ((i = 0; i < ${#command[@]}; i++)); do
  case ${command[i]} in
    --workdir) workdir=${command[i + 1]:-} ;;
    --workdir=*) workdir=${command[i]#--workdir=} ;;
  esac
done
[[ -n $workdir ]] || die "the command has no --workdir: nothing to resume from"
[[ $workdir == gs://* ]] ||
  die "--workdir $workdir: must be a gs:// URL to survive a preemption (the VM's disks are lost)"

mapfile -t common < <(common_flags)
mapfile -t flags < <(tpu_flags)
if [[ -z $state ]]; then
  if ((DRY_RUN)); then
    run gcloud compute tpus tpu-vm describe "$TPU_NAME" "${flags[@]}" --format='value(state)'
    state=PREEMPTED
    note "dry run: assuming the VM is $state (pass --state READY or --state NOT_FOUND for the other paths)"
  else
    printf '+ %s\n' "$(quote_argv gcloud compute tpus tpu-vm describe "$TPU_NAME" "${flags[@]}" --format='value(state)')" >&2
    state=$(gcloud compute tpus tpu-vm describe "$TPU_NAME" "${flags[@]}" --format='value(state)' 2>/dev/null) ||
      state=NOT_FOUND
  fi
fi
note "TPU VM $TPU_NAME: ${state}"

case $state in
  READY) ;;
  NOT_FOUND)
    "$GCS_DIR/create_tpu.sh" "${common[@]}" "${capacity[@]+"${capacity[@]}"}"
    "$GCS_DIR/install.sh" "${common[@]}"
    ;;
  PREEMPTED | TERMINATED | STOPPED | UNKNOWN | HIDDEN)
    "$GCS_DIR/delete_tpu.sh" "${common[@]}" --yes
    "$GCS_DIR/create_tpu.sh" "${common[@]}" "${capacity[@]+"${capacity[@]}"}"
    "$GCS_DIR/install.sh" "${common[@]}"
    ;;
  *) die "TPU VM $TPU_NAME is $state: run this again once it is READY or PREEMPTED" ;;
esac

note "resuming from the latest checkpoint in $workdir (the same command, the same --workdir)"
"$GCS_DIR/run_all.sh" "${common[@]}" --run "$run_name" -- "${command[@]}"
