#!/usr/bin/env bash
# Copy a local corpus (files or directories) to gs://BUCKET/corpora/NAME/.
USAGE="Usage: gcs/upload_corpus.sh [--dry-run] [--env FILE] [--name NAME] PATH [PATH...]

Copy local text corpus files or directories (recursively) to gs://BUCKET/corpora/NAME/, where
every pmi-jax command can read them (--input gs://BUCKET/corpora/NAME). NAME defaults to the
base name of the first PATH.

Options:
  --name NAME  folder under gs://BUCKET/corpora/ (default: base name of the first PATH)"
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

parse_args "$@"
name=""
paths=()
set -- "${ARGS[@]+"${ARGS[@]}"}"
while (($#)); do
  case $1 in
    --name)
      (($# >= 2)) || die "--name needs a value"
      name=$2
      shift
      ;;
    --name=*) name=${1#--name=} ;;
    --) ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) paths+=("$1") ;;
  esac
  shift
done
((${#paths[@]})) || die "no PATH given (see --help)"
for path in "${paths[@]}"; do
  [[ -e $path ]] || die "$path: no such file or directory"
done
[[ -n $name ]] || name=$(basename "${paths[0]%/}")
load_settings
require BUCKET

run gcloud storage cp --recursive "${paths[@]}" "gs://$BUCKET/corpora/$name/"
