#!/usr/bin/env bash
# Install pmi-jax on every worker of the TPU VM, with the project's pinned versions.
USAGE="Usage: gcs/install.sh [--dry-run] [--env FILE]

Install pmi-jax on every worker (--worker=all) of TPU_NAME, identically:
  1. the code: with REPO_URL empty, the local checkout's committed tree at REPO_REF
     (git archive; commit your changes first) is copied with 'gcloud compute tpus tpu-vm scp';
     otherwise each worker runs 'git clone REPO_URL' and checks out REPO_REF;
  2. PYTHON (python3.12) from the deadsnakes PPA (Ubuntu 22.04's archive stops at 3.11), and a
     virtual environment in ~/REMOTE_DIR/.venv;
  3. pip install -c constraints.txt -e '.[tpu]': the same pinned versions as every other
     install, plus jax[tpu] (which brings libtpu).
~/REMOTE_DIR is replaced each time, so running this again gives a clean, identical install."
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

parse_args "$@"
((${#ARGS[@]} == 0)) || die "unexpected argument ${ARGS[0]} (see --help)"
load_settings
require PROJECT ZONE TPU_NAME REMOTE_DIR PYTHON REPO_REF

archive_name=pmi-jax-src.tar.gz
steps=(
  "sudo add-apt-repository -y ppa:deadsnakes/ppa"
  "sudo apt-get update -qq"
  "$(quote_argv sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$PYTHON" "$PYTHON-venv")"
  "$(quote_argv rm -rf "$REMOTE_DIR")"
)
if [[ -z $REPO_URL ]]; then
  archive="${TMPDIR:-/tmp}/$archive_name"
  if ((!DRY_RUN)) && [[ -n $(git -C "$REPO_ROOT" status --porcelain --untracked-files=no) ]]; then
    note "warning: uncommitted changes in $REPO_ROOT are not installed (git archive $REPO_REF)"
  fi
  run git -C "$REPO_ROOT" archive --format=tar.gz --output="$archive" "$REPO_REF"
  mapfile -t flags < <(tpu_flags)
  run gcloud compute tpus tpu-vm scp "$archive" "$TPU_NAME:$archive_name" "${flags[@]}" --worker=all
  steps+=(
    "$(quote_argv mkdir -p "$REMOTE_DIR")"
    "$(quote_argv tar -xzf "$archive_name" -C "$REMOTE_DIR")"
  )
else
  steps+=(
    "$(quote_argv git clone --quiet "$REPO_URL" "$REMOTE_DIR")"
    "$(quote_argv git -C "$REMOTE_DIR" checkout --quiet "$REPO_REF")"
  )
fi
steps+=(
  "$(quote_argv cd "$REMOTE_DIR")"
  "$(quote_argv "$PYTHON" -m venv .venv)"
  "$(quote_argv .venv/bin/pip install --quiet --upgrade pip)"
  "$(quote_argv .venv/bin/pip install --quiet -c constraints.txt -e '.[tpu]')"
  "$(quote_argv .venv/bin/pmi-jax --help) > /dev/null"
)
# One command string for every worker; '&&' stops at the first failing step.
remote=""
for step in "${steps[@]}"; do remote+="${remote:+ && }$step"; done
tpu_ssh all "$remote"
