#!/usr/bin/env bash
# Create the bucket that holds corpora, prepared data, checkpoints and logs.
USAGE="Usage: gcs/create_bucket.sh [--dry-run] [--env FILE]

Create gs://BUCKET in REGION (settings file), with uniform bucket-level access. Keep it in
the TPU's region: training streams its input from it and writes checkpoints to it."
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

parse_args "$@"
((${#ARGS[@]} == 0)) || die "unexpected argument ${ARGS[0]} (see --help)"
load_settings
require PROJECT REGION BUCKET

run gcloud storage buckets create "gs://$BUCKET" --project="$PROJECT" --location="$REGION" \
  --uniform-bucket-level-access
