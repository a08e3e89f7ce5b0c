# shellcheck shell=bash disable=SC2034  # its variables are read by the scripts that source it
# Shared by every gcs/ script: command-line flags, the settings file, shell quoting, and `run`.
#
# A script sets USAGE, sources this file, then calls `parse_args "$@"` and `load_settings`.
# Every cloud command goes through `run`, which prints it (--dry-run) or prints and executes it.
# Printed commands are one per line, each argument shell-quoted, so that `shlex.split` (or a
# shell) recovers the exact argv. Values are never evaluated: the settings file is parsed, not
# sourced, and remote command strings are built from quoted words only.

set -euo pipefail

GCS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(dirname "$GCS_DIR")

# Every key the settings file may hold (gcs/env.example documents each one). No key is a
# secret: gcloud authenticates with your own login, so an unknown key is refused.
SETTINGS=(PROJECT REGION ZONE BUCKET TPU_NAME ACCELERATOR_TYPE RUNTIME_VERSION PROVISIONING
  REPO_URL REPO_REF REMOTE_DIR PYTHON RUN_NAME)

# Defaults for the optional settings; the others must come from the file.
PROVISIONING=on-demand
REPO_URL=""
REPO_REF=HEAD
REMOTE_DIR=pmi-jax
PYTHON=python3.12
RUN_NAME=pretrain

# Where each worker keeps its log (relative to its home directory), and the file name per worker.
LOG_ROOT=pmi-jax-logs
worker_log_name() { printf 'worker-%s.log' "$1"; }

DRY_RUN=0
ENV_FILE=${PMI_JAX_GCS_ENV:-$GCS_DIR/env}
ARGS=()

die() {
  printf '%s: error: %s\n' "$(basename "$0")" "$*" >&2
  exit 2
}

note() { printf '%s: %s\n' "$(basename "$0")" "$*" >&2; }

COMMON_HELP="
Common options:
  --env FILE   settings file (default: \$PMI_JAX_GCS_ENV, else gcs/env; see gcs/env.example)
  --dry-run    print the exact commands, one per line, shell-quoted, and run nothing
  -h, --help   show this help"

# Consume the common flags; everything else, in order, lands in ARGS for the script.
# `--` ends option parsing: what follows is passed through untouched (e.g. a remote command).
parse_args() {
  while (($#)); do
    case $1 in
      -h | --help)
        printf '%s\n%s\n' "$USAGE" "$COMMON_HELP"
        exit 0
        ;;
      --dry-run) DRY_RUN=1 ;;
      --env)
        (($# >= 2)) || die "--env needs a file"
        ENV_FILE=$2
        shift
        ;;
      --env=*) ENV_FILE=${1#--env=} ;;
      --)
        shift
        ARGS+=(-- "$@")
        return
        ;;
      *) ARGS+=("$1") ;;
    esac
    shift
  done
}

# Flags to hand to a sibling script so that it reads the same settings in the same mode.
common_flags() {
  printf '%s\n' --env "$ENV_FILE"
  if ((DRY_RUN)); then printf '%s\n' --dry-run; fi
}

is_setting() {
  local key
  for key in "${SETTINGS[@]}"; do [[ $key == "$1" ]] && return 0; done
  return 1
}

# Parse KEY="value" lines. Values are taken literally: no $VAR expansion, no command
# substitution, so a name with spaces or shell characters stays a name.
load_settings() {
  local line key raw value number=0
  local double_quoted='^"([^"]*)"[[:space:]]*(#.*)?$'
  local single_quoted="^'([^']*)'[[:space:]]*(#.*)?\$"
  local bare='^([^[:space:]"'"'"'#]*)[[:space:]]*(#.*)?$'
  [[ -f $ENV_FILE ]] || die "settings file $ENV_FILE not found (copy gcs/env.example to gcs/env, or pass --env FILE)"
  while IFS= read -r line || [[ -n $line ]]; do
    number=$((number + 1))
    line=${line%$'\r'}
    [[ $line =~ ^[[:space:]]*(#.*)?$ ]] && continue
    [[ $line =~ ^[[:space:]]*(export[[:space:]]+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$ ]] ||
      die "$ENV_FILE:$number: expected KEY=\"value\""
    key=${BASH_REMATCH[2]}
    raw=${BASH_REMATCH[3]}
    is_setting "$key" || die "$ENV_FILE:$number: unknown setting $key (known: ${SETTINGS[*]})"
    if [[ $raw =~ $double_quoted ]] || [[ $raw =~ $single_quoted ]] || [[ $raw =~ $bare ]]; then
      value=${BASH_REMATCH[1]}
    else
      die "$ENV_FILE:$number: the value of $key must be quoted, e.g. $key=\"a value\""
    fi
    printf -v "$key" '%s' "$value"
  done <"$ENV_FILE"
  case $PROVISIONING in
    on-demand | spot | preemptible) ;;
    *) die "$ENV_FILE: PROVISIONING=$PROVISIONING: expected on-demand, spot or preemptible" ;;
  esac
  # REMOTE_DIR is removed and recreated by install.sh: keep it a plain name under $HOME.
  [[ $REMOTE_DIR =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]*$ ]] ||
    die "$ENV_FILE: REMOTE_DIR=$REMOTE_DIR: expected a plain directory name (relative to the workers' home)"
}

# Fail unless each named setting is non-empty.
require() {
  local key
  for key in "$@"; do
    [[ -n ${!key:-} ]] || die "$key is not set in $ENV_FILE"
  done
}

# One word, quoted for a POSIX shell only where needed (the rule of Python's shlex.quote);
# in an --option=value word only the value is quoted, which reads better and means the same.
quote() {
  local safe='^[A-Za-z0-9_@%+=:,./-]+$' option='^(--[A-Za-z0-9-]+=)(.+)$'
  if [[ $1 =~ $safe ]]; then
    printf '%s' "$1"
  elif [[ $1 =~ $option ]]; then
    local name=${BASH_REMATCH[1]} value=${BASH_REMATCH[2]}
    printf '%s' "$name"
    quote "$value"
  else
    local escaped="'\\''"
    printf "'%s'" "${1//\'/$escaped}"
  fi
}

# All arguments quoted and joined by spaces: one shell command line.
quote_argv() {
  local words=() word
  for word in "$@"; do words+=("$(quote "$word")"); done
  local IFS=' '
  printf '%s' "${words[*]}"
}

# Print the command (stdout in --dry-run, stderr with a '+' otherwise); execute it unless dry.
run() {
  if ((DRY_RUN)); then
    printf '%s\n' "$(quote_argv "$@")"
  else
    printf '+ %s\n' "$(quote_argv "$@")" >&2
    "$@"
  fi
}

# gcloud's selectors for the TPU VM, shared by create, ssh, scp, describe and delete.
tpu_flags() { printf '%s\n' --project="$PROJECT" --zone="$ZONE"; }

# Run a shell command string on TPU workers: WORKER is a number or "all" (every host of a pod).
tpu_ssh() {
  local worker=$1 command=$2 flags
  mapfile -t flags < <(tpu_flags)
  run gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${flags[@]}" --worker="$worker" --command="$command"
}

# The bucket folder that receives one run's logs.
log_uri() { printf 'gs://%s/logs/%s' "$BUCKET" "$1"; }
