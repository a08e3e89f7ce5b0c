#!/usr/bin/env bash
# Delete the TPU VM (all hosts of a pod slice). The bucket and everything in it stays.
USAGE="Usage: gcs/delete_tpu.sh [--dry-run] [--env FILE] [--yes]

Delete the TPU VM TPU_NAME (every host of a pod slice) so that it stops costing money.
Checkpoints, prepared data and logs live in the bucket and are kept; files on the VMs' disks
are lost.

Options:
  --yes   do not ask for confirmation"
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

parse_args "$@"
assume_yes=0
for arg in "${ARGS[@]+"${ARGS[@]}"}"; do
  case $arg in
    --yes | -y) assume_yes=1 ;;
    *) die "unexpected argument $arg (see --help)" ;;
  esac
done
load_settings
require PROJECT ZONE TPU_NAME

if ((!DRY_RUN && !assume_yes)); then
  answer=""
  read -r -p "Delete TPU VM $TPU_NAME in $ZONE (project $PROJECT)? [y/N] " answer || true
  [[ $answer == [yY]* ]] || die "not deleted"
fi
mapfile -t flags < <(tpu_flags)
# --quiet: gcloud's own prompt is replaced by the one above.
run gcloud compute tpus tpu-vm delete "$TPU_NAME" "${flags[@]}" --quiet
