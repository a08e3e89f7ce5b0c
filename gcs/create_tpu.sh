#!/usr/bin/env bash
# Create the TPU VM: one host (v4-8) or a pod slice of several hosts (v4-32 = 4 hosts).
USAGE="Usage: gcs/create_tpu.sh [--dry-run] [--env FILE] [--spot | --preemptible | --on-demand]

Create the TPU VM TPU_NAME in ZONE with ACCELERATOR_TYPE and RUNTIME_VERSION (settings file).
A pod slice (e.g. v4-32: 16 chips on 4 hosts) gets one VM per host; run every command on all of
them with gcs/run_all.sh. The VMs get the cloud-platform scope so that they can read the corpus
and write checkpoints and logs to the bucket (what they may touch is decided by IAM roles on
their service account).

Options (override PROVISIONING from the settings file):
  --spot         Spot capacity: much cheaper, may be preempted at any time (see gcs/relaunch.sh)
  --preemptible  the older preemptible model (also ends after 24 hours)
  --on-demand    regular capacity"
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

parse_args "$@"
load_settings
for arg in "${ARGS[@]+"${ARGS[@]}"}"; do
  case $arg in
    --spot) PROVISIONING=spot ;;
    --preemptible) PROVISIONING=preemptible ;;
    --on-demand) PROVISIONING=on-demand ;;
    *) die "unexpected argument $arg (see --help)" ;;
  esac
done
require PROJECT ZONE TPU_NAME ACCELERATOR_TYPE RUNTIME_VERSION

mapfile -t flags < <(tpu_flags)
capacity=()
case $PROVISIONING in
  spot) capacity=(--spot) ;;
  preemptible) capacity=(--preemptible) ;;
esac
run gcloud compute tpus tpu-vm create "$TPU_NAME" "${flags[@]}" \
  --accelerator-type="$ACCELERATOR_TYPE" --version="$RUNTIME_VERSION" \
  --scopes=https://www.googleapis.com/auth/cloud-platform "${capacity[@]+"${capacity[@]}"}"
